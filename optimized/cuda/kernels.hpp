// The CUDA engine's kernels as the host sees them: the descriptors a call uploads, and one launcher per kernel.
// engine.cpp (host, g++) plans a call and fills these; kernels.cu (nvcc) runs them. Plain structs of fixed-width
// fields, identical on both sides.
#pragma once

#include "kvcheck/optimized/kv_layout.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace kvc::cuda {

constexpr uint32_t kSplitKeys = 256;    // keys per split: fixed at absolute multiples of 256 (determinism rule)
constexpr uint32_t kSegmentSplits = 4;  // splits per segment; a spread decode gives each segment its own CUDA block
constexpr uint32_t kSegmentKeys = kSplitKeys * kSegmentSplits;
constexpr uint32_t kTileRows = 16;      // query rows (token, head of the group) per CUDA block, one KV head each
constexpr uint32_t kChunkKeys = 32;     // K or V rows staged in shared memory at a time
constexpr uint32_t kThreads = 128;      // threads per attention block (4 warps)
constexpr uint32_t kMaxHeadDim = 256;

// One stream's part of a call (one sequence of the batch, in the call's layer).
struct CallDesc {
    uint64_t table_offset; // its block table starts here in the call's uploaded tables
    uint32_t len_before;   // tokens cached before this call
    uint32_t n_new;        // new tokens
    uint32_t token_base;   // its first new token in the call's packed q/k/v/out
    uint32_t pad;
};

// One attention work item: one tile of rows of one (stream, KV head), over segments [seg_begin, seg_end).
// Rows are token-major (token t, head g of the group) pairs: row = t * group + g.
struct WorkItem {
    uint32_t call;
    uint32_t kv_head;
    uint32_t row0;     // first row of the tile
    uint32_t n_rows;   // <= kTileRows
    uint32_t seg_begin;
    uint32_t seg_end;
    uint32_t final;    // 1: normalize and write out; 0: write the folded state to partials
    uint32_t partial;  // index of its first row's partial state (n_rows consecutive), when final == 0
};

// A tile whose segments were spread over several work items: the merge kernel folds them in segment order.
struct MergeItem {
    uint32_t call;
    uint32_t kv_head;
    uint32_t row0;
    uint32_t n_rows;
    uint32_t first_partial; // partial of row r of segment i: first_partial + i * n_rows + r
    uint32_t n_segments;
};

struct Geometry {
    kvc_kv_layout layout; // block_base: the device array of block addresses; quantized: rows of codes + scale_bytes
    uint32_t dtype;       // kvc_dtype of the cache (quantized dtypes: quant_math.hpp)
    uint32_t rope;        // kvc_rope
    uint32_t n_q_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t group;       // n_q_heads / n_kv_heads
    float scale;
    const double* inv_freq; // [head_dim / 2] device, when rope != NONE
    uint32_t wide_rows;     // 1: every cached row starts on 16 bytes and is a whole number of 16-byte pieces long
                            // (never for int8 / q8_0, whose rows end in their scales)
    uint32_t f16_scale;     // INT8_TOKEN: 1 when each row's scale is kept in f16, else f32
    const float* k_scales;  // fp8: the call's layer's K scales, [n_kv_heads] on the device (1 under SCALE_NONE)
    const float* v_scales;  // fp8: its V scales; nullptr for other dtypes
};

// Append: rows of k and v ([total][n_kv_heads][head_dim] f32, device) into their slots, K rotated, converted to the
// cache dtype (a quantized dtype: quantized on the device by quant_math.hpp, codes then scales). token_call[i] is
// the call of packed token i.
cudaError_t launch_append(const Geometry& g, const CallDesc* calls, const uint32_t* token_call, uint32_t total,
                          const uint32_t* tables, const float* k, const float* v, cudaStream_t s);

// Attention: every work item, then (n_merge > 0) the merge of spread tiles. q, out: [total][n_q_heads][head_dim].
// rows_cap: the most rows of any item (<= kTileRows); the kernel's shared memory is sized for it, so that a decode
// of one row per item leaves room for many blocks per multiprocessor.
cudaError_t launch_attention(const Geometry& g, const CallDesc* calls, const uint32_t* tables, const float* q,
                             float* out, const WorkItem* items, uint32_t n_items, uint32_t rows_cap,
                             const MergeItem* merges, uint32_t n_merge, float* partial_m, float* partial_l,
                             float* partial_o, cudaStream_t s);

// Bytes [from, from + bytes) of rows pos .. pos + n - 1 of one stream, K and V, as stored, packed
// [n][n_kv_heads][bytes]: read_kv takes a row's elements (from 0, head_dim * elem_bytes: the codes of a quantized
// dtype), read_kv_scales the scales stored after them (kvc_kv_scale_offset, scale_bytes).
cudaError_t launch_gather(const Geometry& g, const uint32_t* table, uint32_t pos, uint32_t n, uint32_t from,
                          uint32_t bytes, uint8_t* k_out, uint8_t* v_out, cudaStream_t s);

// Allows the attention kernel the dynamic shared memory of head_dim and kTileRows rows (called with the largest,
// kMaxHeadDim, so caches of different head_dim can be used side by side).
cudaError_t prepare_attention(uint32_t head_dim);
uint64_t attention_shared_bytes(uint32_t head_dim, uint32_t rows_cap);

} // namespace kvc::cuda

namespace kvc::cuda {
// cudaSuccess when the kernels of this build can run on the current device (a device of an architecture the build
// has no code for says cudaErrorNoKernelImageForDevice here).
cudaError_t kernels_loadable();
} // namespace kvc::cuda
