// The visibility rule of a windowed cache (ABI 1.2) and the eviction rule that follows from it, written once for the
// CPU engine (evict.cpp), the CUDA engine's host plan and its attention kernel (docs/windowed-caches.md):
//
//   the query at absolute position i sees the key at absolute position j iff j <= i and (W == 0 or j < S or i - j < W)
//
// Positions are absolute everywhere: a freed block's table entry stays in place as kDroppedBlock, so pos / B still
// finds a row's block. The rule functions are host and device; the table walk that frees blocks is host only.
#pragma once

#include "kvcheck/optimized/kv_layout.h" // KVC_HOST_DEVICE

#include <stdint.h>

namespace kvc::opt {

// The table entry of a block an evicting cache freed: every row it held was dead (no later query sees it).
constexpr uint32_t kDroppedBlock = UINT32_MAX;

// Whether the query at i sees the key at j, with window W (0: full causal attention) and S sinks.
KVC_HOST_DEVICE inline bool key_visible(uint64_t i, uint64_t j, uint32_t window, uint32_t n_sinks) {
    return j <= i && (window == 0 || j < n_sinks || i - j < window);
}

// The first key of the window of the query at i (i - j < W  <=>  j >= i + 1 - W); 0 without a window. Keys below it
// are visible only as sinks.
KVC_HOST_DEVICE inline uint64_t window_begin(uint64_t i, uint32_t window) {
    return window == 0 || i + 1 < window ? 0 : i + 1 - window;
}

// Whether some query of the run i_first .. i_last sees some key of [a, b). The run's queries together see
// [0, min(S, i_last + 1)) and [window_begin(i_first), i_last + 1): each window starts at or before the next query,
// so the windows of consecutive queries join into one range. Without a window the sinks add nothing.
KVC_HOST_DEVICE inline bool range_seen(uint64_t a, uint64_t b, uint64_t i_first, uint64_t i_last, uint32_t window,
                                       uint32_t n_sinks) {
    const uint64_t end = i_last + 1;
    const uint64_t sinks_end = window == 0 ? 0 : (n_sinks < end ? n_sinks : end);
    const uint64_t lo = window_begin(i_first, window);
    return a < b && ((a < sinks_end) || (b > lo && a < end));
}

// The leading blocks of a stream that hold sinks: never freed.
KVC_HOST_DEVICE inline uint32_t sink_blocks(uint32_t n_sinks, uint32_t block_size) {
    return static_cast<uint32_t>((static_cast<uint64_t>(n_sinks) + block_size - 1) / block_size);
}

// After a stream holds `length` rows the next query sits at `length` and sees j < S and j >= length + 1 - W: rows
// S .. length - W are dead, and stay dead (later queries reach back even less). The blocks below the returned index
// whose rows are all dead (every block from sink_blocks on: their rows are all >= S) may be freed.
KVC_HOST_DEVICE inline uint64_t dead_blocks_end(uint64_t length, uint32_t window, uint32_t block_size) {
    if (window == 0 || length < window) return 0;
    return (length - window + 1) / block_size;
}

// Whether rows pos .. pos + n - 1 include one of a freed block: the freed blocks are the run
// [first, first + dropped) (first = sink_blocks).
KVC_HOST_DEVICE inline bool range_holds_dropped(uint64_t pos, uint64_t n, uint32_t block_size, uint64_t first,
                                                uint64_t dropped) {
    if (dropped == 0 || n == 0) return false;
    const uint64_t lo = pos / block_size, hi = (pos + n - 1) / block_size;
    return lo < first + dropped && hi >= first;
}

// Frees the dead blocks of one evicting stream's table (table[sink_blocks .. sink_blocks + *dropped) are already
// kDroppedBlock): each block from there up to dead_blocks_end is handed to drop (one reference: a block shared
// after fork stays with the other tables) and its entry becomes kDroppedBlock. Host only.
template <class Drop>
inline void evict_dead_blocks(uint32_t* table, uint32_t* dropped, uint64_t length, uint32_t window,
                              uint32_t block_size, uint32_t first, Drop&& drop) {
    const uint64_t end = dead_blocks_end(length, window, block_size);
    for (uint64_t b = static_cast<uint64_t>(first) + *dropped; b < end; ++b) {
        drop(table[b]);
        table[b] = kDroppedBlock;
        ++*dropped;
    }
}

} // namespace kvc::opt
