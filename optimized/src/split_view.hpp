// Which keys of one split each row of a tile sees, as offsets into the split: the causal limit, the row's sliding
// window and the attention sinks (RowTile) reduced to at most two stretches per row, and the stretches the kernels
// walk. Shared by every kernel (portable, AVX2, AVX-512, quantized) so that they all skip and mask the same keys.
//
// Row r sees offsets [0, head[r]) (the sinks, or everything when its window starts at or before them) and
// [lo[r], hi[r]) (its window; empty when lo == hi), with head[r] <= lo[r]. A row that sees everything up to its
// limit has head 0 and the window [0, n): the kernels' unwindowed paths then run exactly as before.
#pragma once

#include "attention_kernel.hpp"

#include <algorithm>
#include <cstdint>

namespace kvc::opt {

struct SplitView {
    uint32_t head[kTileRows] = {}, lo[kTileRows] = {}, hi[kTileRows] = {};
    // The stretches the loops walk, in key order: [first[i], last[i]) for i < n_ranges (at most two: the sinks and
    // the windows, apart only when no row's window reaches back to the sinks). Only the last one is prefetched
    // (RowPrefetcher::skip): the sinks are a few rows, and fetching the gap before the window would waste the walk.
    uint32_t first[2] = {}, last[2] = {};
    int n_ranges = 0;
    uint32_t end = 0; // the last stretch's end: the kernels' n_max (their virtual V rows start here)
    // Offsets every row sees, [0, all_head) and [all_lo, all_hi): the register-accumulator path of phase 4. The keys
    // outside both go key by key, each row skipping the keys it does not see (never multiplied by zero).
    uint32_t all_head = 0, all_lo = 0, all_hi = 0;

    bool sees(int r, uint32_t j) const { return j < head[r] || (j >= lo[r] && j < hi[r]); }
    // The row's last visible offset + 1 (0: it sees nothing here).
    uint32_t row_end(int r) const { return lo[r] < hi[r] ? hi[r] : head[r]; }
    // Where phases 2 and 3 of row r may start: a multiple of 8 (the lanes of the sum of p are fixed by the offset,
    // and the keys before carry p = 0, which adds nothing to any lane).
    uint32_t row_start(int r) const { return head[r] > 0 ? 0 : lo[r] & ~7u; }
    // When offset j is seen by every row: the end of its all-seen stretch; otherwise 0.
    uint32_t live_until(uint32_t j) const {
        if (j < all_head) return all_head;
        return j >= all_lo && j < all_hi ? all_hi : 0;
    }
    // The first offset the prefetched walk reads (the last stretch's start).
    uint32_t walk_from() const { return n_ranges > 0 ? first[n_ranges - 1] : 0; }
};

// Rows 0 .. rows-1 of t over the split [k0, k0 + kSplitKeys).
inline SplitView split_view(const RowTile& t, int rows, uint32_t k0) {
    const auto clip = [k0](uint32_t x) { return x > k0 ? std::min(x - k0, kSplitKeys) : 0u; };
    SplitView v;
    uint32_t head_max = 0, win_lo = kSplitKeys, win_hi = 0;
    v.all_head = kSplitKeys;
    v.all_lo = 0;
    v.all_hi = kSplitKeys;
    for (int r = 0; r < rows; ++r) {
        const uint32_t n = clip(t.limit[r]), s = clip(std::min(t.sinks, t.limit[r])), lo = clip(t.from[r]);
        if (lo <= s) { // the window reaches back to the sinks (or there is no window): one stretch
            v.head[r] = 0;
            v.lo[r] = 0;
            v.hi[r] = n;
        } else {
            v.head[r] = s;
            v.lo[r] = lo;
            v.hi[r] = n;
        }
        head_max = std::max(head_max, v.head[r]);
        if (v.lo[r] < v.hi[r]) {
            win_lo = std::min(win_lo, v.lo[r]);
            win_hi = std::max(win_hi, v.hi[r]);
        }
        v.all_head = std::min(v.all_head, v.head[r]);
        v.all_lo = std::max(v.all_lo, v.lo[r]);
        v.all_hi = std::min(v.all_hi, v.hi[r]);
    }
    if (v.all_lo >= v.all_hi) v.all_lo = v.all_hi = 0;
    if (win_lo >= win_hi) { // no row's window reaches into this split
        if (head_max > 0) v.first[v.n_ranges] = 0, v.last[v.n_ranges++] = head_max;
    } else if (head_max >= win_lo) {
        v.first[0] = 0;
        v.last[0] = std::max(head_max, win_hi);
        v.n_ranges = 1;
    } else {
        if (head_max > 0) v.first[v.n_ranges] = 0, v.last[v.n_ranges++] = head_max;
        v.first[v.n_ranges] = win_lo;
        v.last[v.n_ranges++] = win_hi;
    }
    v.end = v.n_ranges > 0 ? v.last[v.n_ranges - 1] : 0;
    return v;
}

// How many keys from position x on some row of rows 0 .. rows-1 sees without a gap (0: none sees x). The walks
// prefetch the next split's first keys only that far: past it an evicting cache may have freed the blocks.
inline uint64_t visible_run(const RowTile& t, int rows, uint64_t x) {
    uint64_t best = 0;
    for (int r = 0; r < rows; ++r) {
        const uint64_t lim = t.limit[r], sink_end = std::min<uint64_t>(t.sinks, lim);
        uint64_t end = 0;
        if (x >= t.from[r] && x < lim) end = lim;
        else if (x < sink_end) end = t.from[r] <= sink_end ? lim : sink_end;
        if (end > x) best = std::max(best, end - x);
    }
    return best;
}

// Whether any row of t sees a key of [k0, k1) (absolute positions): the plans skip splits and segments no row sees.
inline bool tile_sees(const RowTile& t, uint32_t k0, uint64_t k1) {
    for (int r = 0; r < t.n; ++r) {
        const uint64_t sink_end = std::min(t.sinks, t.limit[r]);
        if (k0 < sink_end) return true;
        if (k0 < t.limit[r] && k1 > t.from[r]) return true;
    }
    return false;
}

} // namespace kvc::opt
