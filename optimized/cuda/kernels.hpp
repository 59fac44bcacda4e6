// The CUDA engine's kernels as the host sees them: the descriptors a call uploads, and one launcher per kernel.
// engine.cpp (host, g++) plans a call and fills these; kernels.cu (nvcc) runs them. Plain structs of fixed-width
// fields, identical on both sides.
#pragma once

#include "kvcheck/optimized/kv_layout.h"
#include "tile_plan.hpp" // the tile and split sizes, shared memory per tile

#include <cuda_runtime.h>
#include <stdint.h>

namespace kvc::cuda {

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
    kvc_kv_layout layout;   // K rows; block_base: the device array of block addresses; quantized: codes + scale_bytes
    kvc_kv_layout layout_v; // V rows (kvc_kv_layout_make_v: head_dim_v wide, the V plane after K's); == layout when
                            // head_dim_v == head_dim
    uint32_t dtype;         // kvc_dtype of the cache (quantized dtypes: quant_math.hpp)
    uint32_t rope;          // kvc_rope
    uint32_t n_q_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;      // K rows and q
    uint32_t head_dim_v;    // V rows and out
    uint32_t group;         // n_q_heads / n_kv_heads
    float scale;
    const double* inv_freq; // [rope_dims / 2] device, when rope != NONE
    uint32_t rope_begin;    // RoPE rotates dims [rope_begin, rope_begin + rope_dims) of q and K as a head of
    uint32_t rope_dims;     // rope_dims dims (the whole head: 0, head_dim); the others pass through
    uint32_t window;        // the call's layer's sliding window W (0: full causal attention)
    uint32_t n_sinks;       // S: keys below it stay visible to every later query of a windowed layer
    uint32_t wide_rows;     // 1: every cached row, K and V, starts on 16 bytes and is a whole number of 16-byte pieces
                            // long (never for int8 / q8_0, whose rows end in their scales)
    uint32_t f16_scale;     // INT8_TOKEN: 1 when each row's scale is kept in f16, else f32
    const float* k_scales;  // fp8: the call's layer's K scales, [n_kv_heads] on the device (1 under SCALE_NONE)
    const float* v_scales;  // fp8: its V scales; nullptr for other dtypes
};

// Append: rows of k ([total][n_kv_heads][head_dim] f32, device) and v ([total][n_kv_heads][head_dim_v]) into their
// slots, K rotated (its RoPE range), converted to the
// cache dtype (a quantized dtype: quantized on the device by quant_math.hpp, codes then scales). token_call[i] is
// the call of packed token i.
cudaError_t launch_append(const Geometry& g, const CallDesc* calls, const uint32_t* token_call, uint32_t total,
                          const uint32_t* tables, const float* k, const float* v, cudaStream_t s);

// Attention: every work item, then (n_merge > 0) the merge of spread tiles. q: [total][n_q_heads][head_dim], out:
// [total][n_q_heads][head_dim_v]. Each row attends the keys its query sees (window_rule.hpp): the sinks and its own
// window; splits and chunks no row of a tile sees are never loaded (with eviction their blocks are gone).
// rows_cap: the most rows of any item (<= tile_rows of the head sizes); the kernel's shared memory is sized for it,
// so that a decode of one row per item leaves room for many blocks per multiprocessor.
cudaError_t launch_attention(const Geometry& g, const CallDesc* calls, const uint32_t* tables, const float* q,
                             float* out, const WorkItem* items, uint32_t n_items, uint32_t rows_cap,
                             const MergeItem* merges, uint32_t n_merge, float* partial_m, float* partial_l,
                             float* partial_o, cudaStream_t s);

// A byte range of each stored row: [from, from + bytes) of a K row, [from_v, from_v + bytes_v) of a V row.
struct RowBytes {
    uint32_t from, bytes, from_v, bytes_v;
};

// Those bytes of rows pos .. pos + n - 1 of one stream, as stored, packed [n][n_kv_heads][bytes] (K) and
// [n][n_kv_heads][bytes_v] (V): read_kv takes a row's elements (from 0, head_dim * elem_bytes: the codes of a
// quantized dtype; head_dim_v for V), read_kv_scales the scales stored after them (kvc_kv_scale_offset,
// scale_bytes).
cudaError_t launch_gather(const Geometry& g, const uint32_t* table, uint32_t pos, uint32_t n, RowBytes rb,
                          uint8_t* k_out, uint8_t* v_out, cudaStream_t s);

// Allows the attention kernel the most dynamic shared memory any accepted cache needs (attention_shared_bytes_max),
// so caches of different head sizes can be used side by side.
cudaError_t prepare_attention();

} // namespace kvc::cuda

namespace kvc::cuda {
// cudaSuccess when the kernels of this build can run on the current device (a device of an architecture the build
// has no code for says cudaErrorNoKernelImageForDevice here).
cudaError_t kernels_loadable();
} // namespace kvc::cuda
