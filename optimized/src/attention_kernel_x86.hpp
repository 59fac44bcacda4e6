// The body of the x86 split kernels, shared by the AVX2 and the AVX-512 translation units: everything here is one
// template compiled once per instruction set, so the two kernels walk, prefetch and reduce alike and give the same
// bits. Include it after defining KVC_KERNEL_TARGET (the function attribute of that instruction set); the including
// file defines the group path's hooks (group_scores, group_query_pairs, group_values: attention_kernel_x86_group.hpp)
// and exp_sum_row (below).
// Everything is in an unnamed namespace: each translation unit gets its own copy, compiled for its own target.
// The body is in parts by job, each included only from here (so that every part sees the target macros): the lane
// pieces (attention_kernel_x86_lanes.hpp: widening, the 8-lane tree, exp), the walk and its prefetcher
// (attention_kernel_x86_walk.hpp), the direct path's score and value loops (attention_kernel_x86_direct.hpp), and
// the group path's hooks (attention_kernel_x86_group.hpp). This file holds the softmax phases and the kernel that
// runs the phases over a split; the AVX-512 score layouts live in attention_kernel_avx512_scores.hpp.
//
// Why it is shaped this way:
//  - Each cached K/V row is widened to f32 once (F16C for f16, a shift for bf16) and used by every row of the
//    tile: the GQA group shares one read of each cached byte.
//  - Dot products keep 8 independent accumulators (rows x keys): one query row takes 8 keys at a time, 8 rows take
//    one key, so the FMA latency chain never limits a decode.
//  - Every dot product and every sum ends with the same fixed 8-lane tree, whatever tile it was computed in.
//  - Software prefetch runs a fixed number of rows ahead along the order the split reads them (K, then V, then the
//    next split): each block run ends a 4 KiB stretch and the next block may be anywhere in the pool.
//  - Values accumulate in registers for up to 4 rows at a time while V rows stream by.
//  - Tiles of 4 rows or more (GQA groups, prefill) take the group path (attention_kernel_x86_group.hpp): register-blocked scores, and V shared
//    by all rows (the including file decides how). Same bits as the direct path; set_avx2_group_path() switches it
//    off in both kernels.
#pragma once

#ifndef KVC_KERNEL_TARGET
#error "define KVC_KERNEL_TARGET (KVC_TARGET_AVX2 or KVC_TARGET_AVX512) before including attention_kernel_x86.hpp"
#endif
// The vector registers the including file's target has: 16 (AVX2) or 32 (AVX-512, where ymm16-31 exist too).
#ifndef KVC_KERNEL_REGS
#error "define KVC_KERNEL_REGS (16 or 32) before including attention_kernel_x86.hpp"
#endif
// Whether the including file's group_values uses the L1 scratch `wide` (kPieceKeys x head_dim floats on the kernel's
// stack): 1 for AVX2, which widens V into it; 0 for AVX-512, which reads V straight from the cache.
#ifndef KVC_GROUP_VALUES_SCRATCH
#error "define KVC_GROUP_VALUES_SCRATCH (1: group_values uses the scratch, 0: it does not) before including attention_kernel_x86.hpp"
#endif

#include "attention_kernel.hpp"
#include "attention_kernel_x86_direct.hpp"
#include "attention_kernel_x86_group.hpp"
#include "attention_kernel_x86_lanes.hpp"
#include "attention_kernel_x86_walk.hpp"
#include "quantize.hpp"
#include "simd.hpp"
#include "split_view.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace kvc::opt {
namespace {
// Phase 3 of one row, also defined by the including file: p = exp(s - m) in place over the row's first n8 scores
// (n8 a multiple of 8; the padding after the row's keys is -inf, whose p is exactly 0), and their sum in 8 lanes:
// lane i adds the p of keys i, i + 8, i + 16, ... in key order, whatever width computes the exponentials.
KVC_KERNEL_TARGET __m256 exp_sum_row(float* row, uint32_t n8, float m);

// The 8-lane phase 3 (the AVX2 kernel's, and the AVX-512 kernel's last 8 keys).
KVC_KERNEL_TARGET inline __attribute__((always_inline)) __m256 exp_sum_row8(float* row, uint32_t j, uint32_t n8,
                                                                            __m256 vm, __m256 acc) {
    for (; j < n8; j += 8) {
        const __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_load_ps(row + j), vm));
        _mm256_store_ps(row + j, p);
        acc = _mm256_add_ps(acc, p);
    }
    return acc;
}

// Phases 2 and 3 of one row (shared with the quantized kernel): the maximum m of the row's visible scores, then
// p = exp(s - m) in place and l = sum p in 8 lanes. Keys of [start, end) the row does not see (between its sinks and
// its window) are set to -inf first, so their p is exactly 0 and adds nothing to any lane: the row's bits are those
// of its visible keys alone, whichever other rows share its tile. start is a multiple of 8 (SplitView::row_start).
// The row's output starts at zero over dvq floats (V's padded width).
KVC_KERNEL_TARGET inline void row_softmax(const SplitView& sv, int r, float* row, uint32_t dvq, SoftmaxState& s) {
    for (uint32_t c = 0; c < dvq; c += 8) _mm256_storeu_ps(s.o + c, _mm256_setzero_ps());
    s.m = -INFINITY;
    s.l = 0.0f;
    const uint32_t nr = sv.row_end(r);
    if (nr == 0) return; // empty split for this row: the empty state
    const uint32_t start = sv.row_start(r);
    for (uint32_t j = std::max(start, sv.head[r]); j < std::min(sv.lo[r], nr); ++j) row[j] = -INFINITY;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    uint32_t j = start;
    for (; j + 8 <= nr; j += 8) vmax = _mm256_max_ps(vmax, _mm256_load_ps(row + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float m = lanes[0];
    for (int i = 1; i < 8; ++i) m = std::max(m, lanes[i]);
    for (; j < nr; ++j) m = std::max(m, row[j]);
    for (j = nr; j % 8 != 0; ++j) row[j] = -INFINITY; // pad the last chunk: its exp is exactly 0
    __m256 acc[8] = {exp_sum_row(row + start, j - start, m), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    _mm256_store_ps(lanes, reduce8(acc));
    s.m = m;
    s.l = lanes[0];
}

// Phase 4 for one key jj that not every row sees: each row that sees it adds p * v, the others skip it.
template <uint32_t DT, int R>
KVC_KERNEL_TARGET inline void accumulate_key(const SplitView& sv, const uint8_t* v, uint32_t jj, uint32_t d,
                                             const float (*sch)[kSplitKeys], SoftmaxState* sh) {
    for (uint32_t c = 0; c < d; c += 8) {
        const __m256 vv =
            c + 8 <= d ? load8<DT>(v + c * elem_bytes<DT>()) : load_tail<DT>(v + c * elem_bytes<DT>(), d - c);
        for (int r = 0; r < R; ++r)
            if (sv.sees(r, jj))
                _mm256_storeu_ps(sh[r].o + c,
                                 _mm256_fmadd_ps(_mm256_set1_ps(sch[r][jj]), vv, _mm256_loadu_ps(sh[r].o + c)));
    }
}

// The kernel for R rows of nh consecutive KV heads. Phases 1 and 4 walk the split block run by block run and, inside
// each run, head by head: the heads of a block are contiguous, so a decode sweeps each block's K (then V) plane in
// one pass instead of visiting the block once per head. Every head has its own prefetcher running ahead along the
// block table, so together they fetch the next blocks' planes for every head at once. With windows the walks cover
// only the stretches some row sees (SplitView): keys before a window and between the sinks and the windows are
// neither read nor fetched.
template <uint32_t DT, int R, bool SeparateV>
KVC_KERNEL_TARGET void split_x86(const SplitArgs& a, uint32_t nh, const RowTile* tiles, uint32_t k0, SoftmaxState* st) {
    const kvc_kv_layout& L = *a.layout;
    const RowTile& t = tiles[0]; // the limits, windows and sinks are the same for every head
    // V rows of their own width (SeparateV: a.v_layout), or shaped like K rows: then Lv is L itself, known so at
    // compile time, and the V loops address V exactly as K (one stride register, one head stride)
    const kvc_kv_layout& Lv = SeparateV ? *a.v_layout : L;
    const uint32_t d = L.head_dim, dq = padded_dim(d), B = L.block_size, dv = Lv.head_dim, dvq = padded_dim(dv);
    const SplitView sv = split_view(t, R, k0);
    const uint32_t n_max = sv.end; // the walks' K rows are offsets [0, n_max), their V rows n_max + offset
    alignas(32) float sc[kMaxCallRows][kSplitKeys]; // row r of head h is sc[h * R + r]
    const __m256 scale_all = _mm256_set1_ps(a.scale);
    const uint64_t next_seen = visible_run(t, R, uint64_t(k0) + kSplitKeys); // the next split's keys seen in a row
    const WalkPlan walk = avx2_walk(); // the whole plan at once (one relaxed atomic load, in the AVX2 file)
    const uint32_t ahead = walk.prefetch_rows;
    // the keys of the next split a walk `lead` rows ahead reaches (0 when there is none)
    const auto next_rows = [&](uint32_t lead) { return static_cast<uint32_t>(std::min<uint64_t>(next_seen, lead)); };
    const uint32_t n_next = next_rows(ahead);
    // the primer's lead in rows (WalkPlan::prime_kib)
    const uint32_t prime = walk.prime_kib == 0 ? 0 : std::max<uint32_t>(1, walk.prime_kib * 1024u / L.row_bytes);
    const uint32_t prime_next = next_rows(prime);
    RowPrefetcher pf[kMaxCallRows];
    for (uint32_t h = 0; h < nh; ++h) {
        pf[h] = RowPrefetcher{&L, a.table, a.kv_head + h, k0, n_max, n_next, ahead, walk.prefetch_to_l2,
                              walk.spread_prefetch, prime, prime_next};
        pf[h].skip_to(sv.walk_from());
    }
    RowPrefetcher idle{}; // the walk of the sinks' stretch when a window stretch follows: nothing to fetch
    // the group path: scores from 4 rows on; V where there is something to widen (f16, bf16) and more than one
    // 4-row block to share it (for one block the AVX2 scratch is pure overhead: measured; AVX-512 follows the same
    // gate, unmeasured for f32 and 4-row tiles)
    constexpr bool kGroupScores = R >= 4, kWiden = DT != KVC_DTYPE_F32 && R > 4;
    const bool group_path = (kGroupScores || kWiden) && avx2_group_path();
    constexpr bool kScratch = kWiden && KVC_GROUP_VALUES_SCRATCH;
    alignas(64) float wide[kScratch ? kPieceKeys * kSimdMaxHeadDim : 1]; // group_values' scratch, where it takes one
    // keys per visit to a head (the walk, above); any length gives the same bits: every dot product is its own,
    // and phase 4 reloads each output from its state, so the keys still reach each element in order
    const uint32_t visit =
        !kGroupScores && walk.interleave_heads ? std::max<uint32_t>(walk.visit_keys, 1u) : kSplitKeys;
    // group_scores' queries, copied once per split (4 KiB for 8 rows at d = 128, against the split's 256 keys of
    // scores): head h's rows from qs[h * q_rows] on, in the layout the including file asks for (group_query_pairs)
    const bool pairs = kGroupScores && group_path && group_query_pairs();
    const int q_rows = group_query_rows<R>(pairs);
    alignas(64) float qs[kGroupScores ? kMaxCallRows + 2 : 1][kSimdMaxHeadDim]; // + 2: 3 heads of 5 rows in pairs
    if constexpr (kGroupScores) {
        static_assert(kMaxCallRows / R * group_query_rows<R>(true) <= kMaxCallRows + 2, "the heads' queries fit qs");
        if (group_path)
            for (uint32_t h = 0; h < nh; ++h) group_queries<R>(tiles[h], dq, pairs, qs + h * q_rows);
    }

    // phase 1: scores s = (q . k) * scale, walking each stretch block run by block run (visits of at most `visit`
    // keys), heads inside
    // fp8: each head's own score scale, the softmax scale with its K scale and the fold (fp8_fused_k_scale)
    __m256 head_scale[is_fp8<DT>() ? kMaxCallRows : 1];
    if constexpr (is_fp8<DT>())
        for (uint32_t h = 0; h < nh; ++h)
            head_scale[h] = _mm256_set1_ps(fp8_fused_k_scale(DT, a.scale, a.k_scales[a.kv_head + h]));
    for (int g = 0; g < sv.n_ranges; ++g) {
        const bool fetch = g + 1 == sv.n_ranges;
        for (uint32_t j = sv.first[g]; j < sv.last[g];) {
            const uint64_t pos = static_cast<uint64_t>(k0) + j;
            const uint32_t slot = static_cast<uint32_t>(pos % B);
            const uint32_t run = std::min({B - slot, sv.last[g] - j, visit});
            const uint8_t* kp = kvc_kv_address(&L, a.table, pos, KVC_PLANE_K, a.kv_head, 0);
            for (uint32_t h = 0; h < nh; ++h) {
                const __m256 scale = is_fp8<DT>() ? head_scale[is_fp8<DT>() ? h : 0] : scale_all;
                RowPrefetcher& p = fetch ? pf[h] : idle;
                if constexpr (kGroupScores) {
                    if (group_path) {
                        group_scores<DT, R>(qs + h * q_rows, pairs, kp + h * L.head_bytes, run, L.row_bytes, d, scale,
                                            p, sc + h * R, j);
                        continue;
                    }
                }
                score_run<DT, R>(tiles[h].q, kp + h * L.head_bytes, run, L.row_bytes, d, scale, p, sc + h * R, j);
            }
            j += run;
        }
    }

    // phase 2: the maximum of each row; phase 3: p = exp(s - m) in place, and l = sum p in 8 lanes
    for (uint32_t h = 0; h < nh; ++h)
        for (int r = 0; r < R; ++r) row_softmax(sv, r, sc[h * R + r], dvq, st[h * kTileRows + r]);

    // phase 4: o = sum_j p_j v_j. Keys every row sees go through register accumulators; the others (the end of a
    // prefill tile, the start of a tile's windows) go key by key, skipping the rows that do not see them.
    for (int g = 0; g < sv.n_ranges; ++g) {
        const bool fetch = g + 1 == sv.n_ranges;
        for (uint32_t j = sv.first[g]; j < sv.last[g];) {
            const uint64_t pos = static_cast<uint64_t>(k0) + j;
            const uint32_t slot = static_cast<uint32_t>(pos % B);
            const uint32_t run = std::min({B - slot, sv.last[g] - j, visit});
            const uint8_t* vp0 = kvc_kv_address(&Lv, a.table, pos, KVC_PLANE_V, a.kv_head, 0);
            for (uint32_t h = 0; h < nh; ++h) {
                const uint8_t* vp = vp0 + h * Lv.head_bytes;
                SoftmaxState* sh = st + h * kTileRows;
                const float (*sch)[kSplitKeys] = sc + h * R;
                RowPrefetcher* p = fetch ? &pf[h] : &idle;
                for (uint32_t i = 0; i < run;) {
                    const uint32_t jj = j + i, live = sv.live_until(jj);
                    if (live == 0) {
                        p->upto(n_max + jj + 1);
                        accumulate_key<DT, R>(sv, vp + i * Lv.row_bytes, jj, dv, sch, sh);
                        ++i;
                        continue;
                    }
                    const uint32_t count = std::min(run - i, live - jj);
                    bool done = false;
                    if constexpr (kWiden) {
                        if (group_path) {
                            group_values<DT, R>(vp + i * Lv.row_bytes, Lv.row_bytes, count, dv, dvq,
                                                kScratch ? wide : nullptr, sch, jj, sh, p, n_max + jj);
                            done = true;
                        }
                    }
                    if (!done) {
                        const float* pr[R];
                        for (int r = 0; r < R; ++r) pr[r] = sch[r] + jj;
                        accumulate_all_live<DT, R>(vp + i * Lv.row_bytes, Lv.row_bytes, count, pr, sh, dv, p,
                                                   n_max + jj);
                    }
                    i += count;
                }
            }
            j += run;
        }
    }
    // fp8: the split's V sums times each head's V scale and the fold (fp8_fused_v_scale), once per element
    if constexpr (is_fp8<DT>())
        for (uint32_t h = 0; h < nh; ++h) {
            const __m256 vs = _mm256_set1_ps(fp8_fused_v_scale(DT, a.v_scales[a.kv_head + h]));
            for (int r = 0; r < R; ++r)
                for (uint32_t c = 0; c < dvq; c += 8) {
                    float* o = st[h * kTileRows + r].o + c;
                    _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(o), vs));
                }
        }
}

// split_x86<DT, R, SeparateV> for R = the tile's rows, Lo <= R <= kTileRows (rows beyond kTileRows are not possible: a
// tile holds at most that many), and V rows of their own width or not. A kernel instantiates only the row counts it
// runs.
template <uint32_t DT, int Lo, int R = kTileRows>
KVC_KERNEL_TARGET void split_rows(const SplitArgs& a, uint32_t nh, const RowTile* t, uint32_t k0, SoftmaxState* st) {
    if constexpr (R > Lo) {
        if (t[0].n < R) return split_rows<DT, Lo, R - 1>(a, nh, t, k0, st);
    }
    if (a.v_layout) return split_x86<DT, R, true>(a, nh, t, k0, st);
    split_x86<DT, R, false>(a, nh, t, k0, st);
}

} // namespace
} // namespace kvc::opt
