// The x86 kernels' direct path (part of attention_kernel_x86.hpp, compiled once per instruction set): phase 1's score
// loops (register blocks of rows x keys straight from the cache) and phase 4's value loops (register accumulators
// for up to 4 rows while V rows stream by). Tiles of 1-3 rows always take it; the group path's hooks reuse its loops.
#pragma once

#ifndef KVC_KERNEL_TARGET
#error "include attention_kernel_x86.hpp, which defines the target, not attention_kernel_x86_direct.hpp on its own"
#endif

#include "attention_kernel.hpp"
#include "attention_kernel_x86_lanes.hpp"
#include "attention_kernel_x86_walk.hpp"
#include "simd.hpp"

#include "kvcheck/optimized/softmax_state.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace kvc::opt {
namespace {

// q . k for R rows and KJ consecutive keys (rows of one block run), R * KJ <= 12 accumulators: each K chunk is
// widened once for R rows and each q chunk loaded once for KJ keys. out[r * KJ + kj] = dot * scale.
template <uint32_t DT, int R, int KJ>
KVC_KERNEL_TARGET inline __attribute__((always_inline)) void dots(const float* const* q, const uint8_t* k,
                                                                uint64_t row_bytes, uint32_t d, __m256 scale, float* out) {
    static_assert(R * KJ <= 12, "12 accumulators");
    constexpr int N = R * KJ;
    __m256 acc[N]; // exactly N: a 16-wide array is zero-filled in memory (rep stos) wherever dots is not inlined
    KVC_UNROLL for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
    const uint32_t full = d / 8, tail = d % 8;
    uint32_t c = 0;
    if constexpr (R == 1 && is_fp8<DT>()) // two chunks of a key from one widening of 16 codes (fp8_widen_x86.hpp)
        for (; c + 2 <= full; c += 2) {
            const __m256 q0 = _mm256_loadu_ps(q[0] + 8 * c), q1 = _mm256_loadu_ps(q[0] + 8 * c + 8);
            KVC_UNROLL for (int kj = 0; kj < KJ; ++kj) {
                __m256 lo, hi;
                fp8_load16<DT>(k + kj * row_bytes + c * 8, lo, hi);
                acc[kj] = _mm256_fmadd_ps(q1, hi, _mm256_fmadd_ps(q0, lo, acc[kj]));
            }
        }
    for (; c < full; ++c) {
        if constexpr (R == 1) { // each K chunk used once: widen it where it is used (8 held chunks would spill)
            const __m256 qv = _mm256_loadu_ps(q[0] + 8 * c);
            KVC_UNROLL for (int kj = 0; kj < KJ; ++kj)
                acc[kj] = _mm256_fmadd_ps(qv, load8<DT>(k + kj * row_bytes + c * 8 * elem_bytes<DT>()), acc[kj]);
            continue;
        }
        __m256 kv[KJ];
        KVC_UNROLL for (int kj = 0; kj < KJ; ++kj) kv[kj] = load8<DT>(k + kj * row_bytes + c * 8 * elem_bytes<DT>());
        KVC_UNROLL for (int r = 0; r < R; ++r) {
            const __m256 qv = _mm256_loadu_ps(q[r] + 8 * c);
            KVC_UNROLL for (int kj = 0; kj < KJ; ++kj) acc[r * KJ + kj] = _mm256_fmadd_ps(qv, kv[kj], acc[r * KJ + kj]);
        }
    }
    if (tail) { // q rows are zero-padded to a multiple of 8
        __m256 kv[KJ];
        KVC_UNROLL for (int kj = 0; kj < KJ; ++kj)
            kv[kj] = load_tail<DT>(k + kj * row_bytes + full * 8 * elem_bytes<DT>(), tail);
        KVC_UNROLL for (int r = 0; r < R; ++r) {
            const __m256 qv = _mm256_loadu_ps(q[r] + 8 * full);
            KVC_UNROLL for (int kj = 0; kj < KJ; ++kj) acc[r * KJ + kj] = _mm256_fmadd_ps(qv, kv[kj], acc[r * KJ + kj]);
        }
    }
    __m256 lo[8], hi[8]; // the accumulators padded with zeros to 8 (or 16) for the fixed tree
    KVC_UNROLL for (int i = 0; i < 8; ++i) lo[i] = i < N ? acc[i] : _mm256_setzero_ps();
    _mm256_storeu_ps(out, _mm256_mul_ps(reduce8(lo), scale));
    if constexpr (N > 8) {
        KVC_UNROLL for (int i = 0; i < 8; ++i) hi[i] = 8 + i < N ? acc[8 + i] : _mm256_setzero_ps();
        _mm256_storeu_ps(out + 8, _mm256_mul_ps(reduce8(hi), scale));
    }
}

// Keys j0 + i .. j0 + i + KJ - 1 of a block run (at kp) for R rows, one register block: the prefetcher advanced
// first (a steady trickle, never a burst; none when pf is null), then dots() into sc[r][j0 + i ..].
template <uint32_t DT, int R, int KJ>
KVC_KERNEL_TARGET inline __attribute__((always_inline)) void score_block(const float* const* q, const uint8_t* kp,
                                                                       uint32_t i, uint64_t row_bytes, uint32_t d,
                                                                       __m256 scale, RowPrefetcher* pf,
                                                                       float (*sc)[kSplitKeys], uint32_t j0) {
    alignas(32) float out[16];
    if (pf) pf->upto(j0 + i + KJ);
    dots<DT, R, KJ>(q, kp + i * row_bytes, row_bytes, d, scale, out);
    if constexpr (KJ == 8 || KJ == 4) { // a row's scores in one vector store (GCC copied them one by one)
        for (int r = 0; r < R; ++r) {
            if constexpr (KJ == 8) _mm256_storeu_ps(sc[r] + j0 + i, _mm256_load_ps(out + r * KJ));
            else _mm_storeu_ps(sc[r] + j0 + i, _mm_load_ps(out + r * KJ));
        }
    } else {
        for (int r = 0; r < R; ++r)
            for (int kj = 0; kj < KJ; ++kj) sc[r][j0 + i + kj] = out[r * KJ + kj];
    }
}

// Phase 1 for R rows over one block run, KJ keys per register block, straight from the cache (no scratch): scores
// of keys j0 .. j0 + run - 1 into sc[r][j0 ..]. One row takes what is left of the run in 4 keys where 8 do not fit
// (a visit of 4 keys: WalkPlan); the run's last keys go one at a time. Every dot product is the same arithmetic
// whichever block it falls in.
template <uint32_t DT, int R, int KJ>
KVC_KERNEL_TARGET inline void score_run_kj(const float* const* q, const uint8_t* kp, uint32_t run, uint64_t row_bytes,
                                         uint32_t d, __m256 scale, RowPrefetcher* pf, float (*sc)[kSplitKeys],
                                         uint32_t j0) {
    uint32_t i = 0;
    for (; i + KJ <= run; i += KJ) score_block<DT, R, KJ>(q, kp, i, row_bytes, d, scale, pf, sc, j0);
    if constexpr (R == 1 && KJ > 4) {
        if (i + 4 <= run) {
            score_block<DT, R, 4>(q, kp, i, row_bytes, d, scale, pf, sc, j0);
            i += 4;
        }
    }
    for (; i < run; ++i) score_block<DT, R, 1>(q, kp, i, row_bytes, d, scale, pf, sc, j0);
}

// The direct path's phase 1: 8 accumulators per register block (6 for 3 rows; measured faster than 12). Not 16 keys
// per block for one row, though 32 registers hold them: 3 % faster in cache, but up to 16 % slower from memory on six
// benchmark lines of eight (Zen 4), since a block's 16 rows are all in flight at once and the prefetch moves on 16
// rows at a time.
template <uint32_t DT, int R>
KVC_KERNEL_TARGET inline void score_run(const float* const* q, const uint8_t* kp, uint32_t run, uint64_t row_bytes,
                                      uint32_t d, __m256 scale, RowPrefetcher& pf, float (*sc)[kSplitKeys], uint32_t j0) {
    score_run_kj<DT, R, (R >= 5 ? 1 : 8 / R)>(q, kp, run, row_bytes, d, scale, &pf, sc, j0);
}

// The V loops advance the prefetcher every kTrickleRows keys, from a loop around the key loop: a prefetch branch
// inside the key loop (with the prefetcher's own loops) made GCC keep the accumulators on the stack.
constexpr uint32_t kTrickleRows = 4;

// key(i) for the keys i = 0 .. count - 1 in order; with a prefetcher it advances, before each group of kTrickleRows
// keys, linearly from row v0 to row v1 over the keys: to v0 + i1 where v1 = v0 + count (a pass that fetches its own
// rows ahead), a share of them otherwise (the AVX-512 group path's V passes, WalkPlan::spread_prefetch). Without
// one the keys are one flat loop (in groups of 4 it cost 5 % of a GQA step: measured). The body is a lambda that
// must be inlined (attribute KVC_KEY_BODY), or its captured accumulators would live on the stack.
template <class KeyBody>
KVC_KERNEL_TARGET inline __attribute__((always_inline)) void trickle_keys(uint32_t count, RowPrefetcher* pf,
                                                                        uint32_t v0, uint32_t v1,
                                                                        const KeyBody& key) {
    if (pf && v1 - v0 != count) { // a share: the division per group, decided once (v1 = v0 + count folds away)
        for (uint32_t i0 = 0; i0 < count; i0 += kTrickleRows) {
            const uint32_t i1 = std::min(count, i0 + kTrickleRows);
            pf->upto(v0 + (v1 - v0) * i1 / count);
            for (uint32_t i = i0; i < i1; ++i) key(i);
        }
        return;
    }
    const uint32_t group = pf ? kTrickleRows : count;
    for (uint32_t i0 = 0; i0 < count; i0 += group) {
        const uint32_t i1 = std::min(count, i0 + group);
        if (pf) pf->upto(v0 + i1);
        for (uint32_t i = i0; i < i1; ++i) key(i);
    }
}
// o[r] += sum over keys i < count of p[r][i] * v_i, for R rows that all see every one of these keys. Accumulators
// stay in registers for CP chunks of 8 at a time while the keys stream by; per element the FMAs still run in key
// order, exactly as the row-by-row path does.
template <uint32_t DT, int R, int CP>
KVC_KERNEL_TARGET inline __attribute__((always_inline)) void accumulate_pass(const uint8_t* v, uint64_t row_bytes,
                                                                           uint32_t count, const float* const* p,
                                                                           SoftmaxState* st, uint32_t c0,
                                                                           RowPrefetcher* pf, uint32_t v0) {
    // each row's probability broadcast once per key where CP chunks reuse it and the registers allow (R x CP
    // accumulators + R broadcasts + one V chunk); for one chunk, broadcast where used. GCC also merges the repeated
    // broadcasts of an unhoisted row into one (checked for 1 row x 16 chunks: one vbroadcastss per key)
    constexpr bool kHoist = CP > 1 && R * CP + R + 1 <= KVC_KERNEL_REGS;
    __m256 acc[R][CP];
    KVC_UNROLL for (int r = 0; r < R; ++r)
        KVC_UNROLL for (int cc = 0; cc < CP; ++cc) acc[r][cc] = _mm256_loadu_ps(st[r].o + c0 + 8 * cc);
    trickle_keys(count, pf, v0, v0 + count, [&](uint32_t i) KVC_KEY_BODY {
        const uint8_t* row = v + i * row_bytes + c0 * elem_bytes<DT>();
        __m256 pb[kHoist ? R : 1];
        if constexpr (kHoist) {
            KVC_UNROLL for (int r = 0; r < R; ++r) pb[r] = _mm256_broadcast_ss(p[r] + i);
        }
        constexpr int kStep = is_fp8<DT>() && CP % 2 == 0 ? 2 : 1; // fp8: two chunks from one widening of 16 codes
        KVC_UNROLL for (int cc = 0; cc < CP; cc += kStep) {
            __m256 vv[2];
            if constexpr (kStep == 2) fp8_load16<DT>(row + 8 * cc, vv[0], vv[1]);
            else vv[0] = load8<DT>(row + 8 * cc * elem_bytes<DT>());
            KVC_UNROLL for (int s = 0; s < kStep; ++s)
                KVC_UNROLL for (int r = 0; r < R; ++r)
                    acc[r][cc + s] =
                        _mm256_fmadd_ps(kHoist ? pb[r] : _mm256_broadcast_ss(p[r] + i), vv[s], acc[r][cc + s]);
        }
    });
    KVC_UNROLL for (int r = 0; r < R; ++r)
        KVC_UNROLL for (int cc = 0; cc < CP; ++cc) _mm256_storeu_ps(st[r].o + c0 + 8 * cc, acc[r][cc]);
}

// The zero-padded tail chunk of V (the last d % 8 elements), key by key: o[r][8 (d / 8) ..] += p[r][i] * v_i.
template <uint32_t DT, int R>
KVC_KERNEL_TARGET inline void accumulate_tail(const uint8_t* v, uint64_t row_bytes, uint32_t count,
                                              const float* const* p, SoftmaxState* st, uint32_t d) {
    if (d % 8 == 0) return;
    const uint32_t c8 = d / 8 * 8;
    for (uint32_t i = 0; i < count; ++i) {
        const __m256 vv = load_tail<DT>(v + i * row_bytes + c8 * elem_bytes<DT>(), d % 8);
        for (int r = 0; r < R; ++r)
            _mm256_storeu_ps(st[r].o + c8, _mm256_fmadd_ps(_mm256_broadcast_ss(p[r] + i), vv,
                                                            _mm256_loadu_ps(st[r].o + c8)));
    }
}

// Passes of CP chunks while they fit, then of halves of CP (CP a power of two): d = 128 with CP = 16 is one pass,
// d = 96 two (8 + 4), never a pass per chunk.
template <uint32_t DT, int R, int CP>
KVC_KERNEL_TARGET inline __attribute__((always_inline)) void accumulate_chunks(const uint8_t* v, uint64_t row_bytes,
                                                                             uint32_t count, const float* const* p,
                                                                             SoftmaxState* st, uint32_t& c,
                                                                             uint32_t full, RowPrefetcher*& pf,
                                                                             uint32_t v0) {
    for (; c + CP <= full; c += CP, pf = nullptr) accumulate_pass<DT, R, CP>(v, row_bytes, count, p, st, 8 * c, pf, v0);
    if constexpr (CP > 1) accumulate_chunks<DT, R, CP / 2>(v, row_bytes, count, p, st, c, full, pf, v0);
}

template <uint32_t DT, int R, int CP>
KVC_KERNEL_TARGET void accumulate_rows(const uint8_t* v, uint64_t row_bytes, uint32_t count, const float* const* p,
                                     SoftmaxState* st, uint32_t d, RowPrefetcher* pf, uint32_t v0) {
    static_assert((CP & (CP - 1)) == 0, "CP a power of two");
    uint32_t c = 0;
    accumulate_chunks<DT, R, CP>(v, row_bytes, count, p, st, c, d / 8, pf, v0);
    if (pf) pf->upto(v0 + count);
    accumulate_tail<DT, R>(v, row_bytes, count, p, st, d);
}

// Up to 4 rows at a time, 8 or 12 accumulators in registers; a tile of more rows is done in two halves (the second
// half reads the run's V rows again, from L1).
template <uint32_t DT, int R>
KVC_KERNEL_TARGET void accumulate_all_live(const uint8_t* v, uint64_t row_bytes, uint32_t count, const float* const* p,
                                         SoftmaxState* st, uint32_t d, RowPrefetcher* pf, uint32_t v0) {
    if constexpr (R > 4) {
        accumulate_all_live<DT, 4>(v, row_bytes, count, p, st, d, pf, v0);
        accumulate_all_live<DT, R - 4>(v, row_bytes, count, p + 4, st + 4, d, nullptr, v0);
    } else {
        // 8 or 12 accumulators in 16 registers (measured); with 32 (AVX-512), 16 for one row: d = 128 in one pass
        constexpr int CP = R == 1 ? (KVC_KERNEL_REGS >= 32 ? 16 : 8) : R == 2 ? 4 : R == 3 ? 4 : 2;
        accumulate_rows<DT, R, CP>(v, row_bytes, count, p, st, d, pf, v0);
    }
}

} // namespace
} // namespace kvc::opt
