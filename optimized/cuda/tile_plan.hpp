// The attention kernel's launch geometry as the host plans it and the device uses it: tile and split sizes, the
// rows per tile a head size allows, the shared memory a tile takes, and which segments a tile's rows can see.
// No CUDA header: the host test (tests/cuda/test_cuda_plan_host.cpp) checks these with g++ alone.
#pragma once

#include "kvcheck/optimized/window_rule.hpp"

#include <stdint.h>

#include <vector>

namespace kvc::cuda {

constexpr uint32_t kSplitKeys = 256;    // keys per split: fixed at absolute multiples of 256 (determinism rule)
constexpr uint32_t kSegmentSplits = 4;  // splits per segment; a spread decode gives each segment its own CUDA block
constexpr uint32_t kSegmentKeys = kSplitKeys * kSegmentSplits;
constexpr uint32_t kTileRows = 16;      // query rows (token, head of the group) per CUDA block, one KV head each
constexpr uint32_t kWideTileRows = 8;   // the same for heads over kNarrowHeadDim (K or V)
constexpr uint32_t kChunkKeys = 32;     // K or V rows staged in shared memory at a time
constexpr uint32_t kThreads = 128;      // threads per attention block (4 warps)
constexpr uint32_t kNarrowHeadDim = 256;
// K and V heads up to 576 dims: the K rows of multi-head latent attention (DeepSeek's 512 latent + 64 RoPE dims).
// What caps it is shared memory: a tile keeps its queries, one staged chunk of K or V rows, its scores and three
// row states in shared memory (attention_shared_bytes), which at 16 rows outgrows the 227 KiB a block of sm_90
// may opt into past about 560 dims; heads over 256 dims therefore take tiles of 8 rows, which fit up to 576
// (kSharedLimit, checked by the host test).
constexpr uint32_t kMaxHeadDim = 576;
constexpr uint64_t kSharedLimit = 227u * 1024u - 1024u; // sm_90's opt-in dynamic shared memory, less the static

// Rows per tile for K heads of dk and V heads of dv dims.
constexpr uint32_t tile_rows(uint32_t dk, uint32_t dv) {
    return dk > kNarrowHeadDim || dv > kNarrowHeadDim ? kWideTileRows : kTileRows;
}

// The attention kernel's dynamic shared memory for a tile of rows_cap rows: queries [rows][dk], a chunk of K or V
// rows [kChunkKeys][max(dk, dv) + 1], scores [rows][kSplitKeys], three row states [rows][dv].
constexpr uint64_t attention_shared_bytes(uint32_t dk, uint32_t dv, uint32_t rows_cap) {
    const uint64_t r = rows_cap, d = dk > dv ? dk : dv;
    return sizeof(float) * (r * dk + kChunkKeys * (d + 1) + r * kSplitKeys + 3 * r * dv);
}

// The most any cache this engine accepts asks for (the kernel is allowed that much once, at create).
constexpr uint64_t attention_shared_bytes_max() {
    const uint64_t narrow = attention_shared_bytes(kNarrowHeadDim, kNarrowHeadDim, kTileRows);
    const uint64_t wide = attention_shared_bytes(kMaxHeadDim, kMaxHeadDim, kWideTileRows);
    return narrow > wide ? narrow : wide;
}
static_assert(attention_shared_bytes_max() <= kSharedLimit, "the attention tile outgrows shared memory");

// Whether some row of a tile sees some key of [a, b): the tile's rows are the queries at positions
// first .. last (token-major rows: consecutive tokens), W the layer's window (0: none), S the sinks. A split or
// segment no row sees is never loaded: its state is empty, and merging an empty state is an exact no-op.
KVC_HOST_DEVICE inline bool tile_sees(uint64_t a, uint64_t b, uint64_t first, uint64_t last, uint32_t window,
                                      uint32_t n_sinks) {
    return kvc::opt::range_seen(a, b, first, last, window, n_sinks);
}

// The segments (kSegmentKeys keys each, cut at absolute multiples) some row of a tile sees, in key order, into out:
// the tile is rows row0 .. row0 + n_rows - 1 (token-major, `group` rows per token) of a stream that held len_before
// tokens. With a window these are the sinks' segment and the ones the windows reach, so a decode's work follows
// S + W, not the stream's length. Never empty: a row sees its own key. Host only.
inline void segments_seen(uint64_t len_before, uint32_t row0, uint32_t n_rows, uint32_t group, uint32_t window,
                          uint32_t n_sinks, std::vector<uint32_t>& out) {
    out.clear();
    const uint64_t first = len_before + row0 / group, last = len_before + (row0 + n_rows - 1) / group;
    const uint64_t n_seg = (last + kSegmentKeys) / kSegmentKeys; // ceil((last + 1) / kSegmentKeys)
    for (uint64_t sg = 0; sg < n_seg; ++sg) {
        const uint64_t a = sg * kSegmentKeys, b = a + kSegmentKeys < last + 1 ? a + kSegmentKeys : last + 1;
        if (tile_sees(a, b, first, last, window, n_sinks)) out.push_back(static_cast<uint32_t>(sg));
    }
}

} // namespace kvc::cuda
