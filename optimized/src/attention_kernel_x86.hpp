// The body of the x86 split kernels, shared by the AVX2 and the AVX-512 translation units: everything here is one
// template compiled once per instruction set, so the two kernels walk, prefetch and reduce alike and give the same
// bits. Include it after defining KVC_KERNEL_TARGET (the function attribute of that instruction set); the including
// file defines the group path's hooks declared below (group_scores, group_query_pairs, group_values).
// Everything is in an unnamed namespace: each translation unit gets its own copy, compiled for its own target.
// It is one header of about 680 lines because the phases (scores, softmax state, values, merge) share the walk's
// template state and the inlining the kernel's speed depends on; the AVX-512 score layouts, which stand alone, live
// in attention_kernel_avx512_scores.hpp.
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
//  - Tiles of 4 rows or more (GQA groups, prefill) take the group path below: register-blocked scores, and V shared
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
#include "dtype_convert.hpp"
#include "fp8_widen_x86.hpp"
#include "quantize.hpp"
#include "simd.hpp"
#include "split_view.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace kvc::opt {
namespace {

template <uint32_t DT>
constexpr bool is_fp8() {
    return DT == KVC_DTYPE_FP8_E4M3 || DT == KVC_DTYPE_FP8_E5M2;
}

template <uint32_t DT>
constexpr uint32_t elem_bytes() {
    return DT == KVC_DTYPE_F32 ? 4u : is_fp8<DT>() ? 1u : 2u;
}

// 8 cached elements -> 8 floats.
template <uint32_t DT>
KVC_KERNEL_TARGET inline __m256 load8(const uint8_t* p) {
    if constexpr (is_fp8<DT>()) {
        return _mm256_cvtph_ps(fp8_halves8<DT>(p));
    } else if constexpr (DT == KVC_DTYPE_F32) {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    } else if constexpr (DT == KVC_DTYPE_F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
}

// The last n < 8 elements of a row, zero-padded (never reads past the row: it may end a slab).
template <uint32_t DT>
KVC_KERNEL_TARGET inline __m256 load_tail(const uint8_t* p, uint32_t n) {
    alignas(32) float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t i = 0; i < n; ++i) {
        if constexpr (is_fp8<DT>()) t[i] = fp8_folded<DT>(p[i]);
        else t[i] = load_elem(p + i * elem_bytes<DT>(), DT);
    }
    return _mm256_load_ps(t);
}

// Lane i of the result is the sum of the 8 lanes of a[i], always in the order ((0+1)+(2+3))+((4+5)+(6+7)).
KVC_KERNEL_TARGET inline __m256 reduce8(const __m256* a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// exp(x) for x <= 0 (and -inf): 2^n * e^r with n = round(x / ln 2), r = x - n ln 2 in two steps (Cody-Waite),
// e^r by its Taylor series to degree 7 (|r| <= ln2/2: error below 1 ulp of float). exp(0) is exactly 1. Results
// below the smallest normal float flush to 0, harmless next to the 1 that the row's maximum contributes.
// The constants, once: every width that computes it (exp_nonpositive here, exp_nonpositive16 in the AVX-512 file)
// must give the same bits, so both take them from here.
struct ExpConstants {
    static constexpr float kFloor = -87.0f;                  // below: the result is 0
    static constexpr float kLog2e = 1.44269504088896341f;
    static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f; // ln 2 = kLn2Hi + kLn2Lo
    static constexpr int kTerms = 8;                         // Horner, highest degree first: 1/7! .. 1/1!, 1/0!
    static constexpr float kTaylor[kTerms] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                              1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
};

KVC_KERNEL_TARGET inline __m256 exp_nonpositive(__m256 x) {
    using C = ExpConstants;
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(C::kFloor), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(C::kFloor));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(C::kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::kLn2Hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::kLn2Lo), r);
    __m256 p = _mm256_set1_ps(C::kTaylor[0]);
    KVC_UNROLL for (int i = 1; i < C::kTerms; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::kTaylor[i]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// The walk (WalkPlan; docs/performance.md, "How the kernel walks the cache"; the measurements behind each choice are
// in docs/log/attention-kernel-notes.md):
//  - Prefetches run 16 rows per head ahead, into L2 (prefetcht1): MHA on one Zen 4 thread reads 18.9 GB/s so, 11.8
//    with the same rows fetched into L1 (prefetcht0). A prefetch into L1 holds one of the core's few L1 miss buffers
//    for a whole DRAM round trip, so a deep L1 prefetch throttles itself; into L2 the requests queue where there are
//    many more, and the demand load finds its line one short hop away. A second, near step into L1 (2 or 4 rows
//    ahead) is slower: its own address walk costs more than the hop it saves.
//  - Tiles of 1-3 rows (MHA decode) visit each head for at most visit_keys keys (16), then move to the next head of
//    the call: a head's prefetcher then runs a whole round of heads ahead of its use, as it does at 16-token
//    blocks, instead of 16 rows (256-token blocks, MHA, one Zen 4 thread: 23.5 GB/s, against 19.1 for whole runs
//    and 19.8 for visits of 32 keys). Intel cores visit 4 keys at a time (machine_walk): there, every step from
//    memory, visits of 4 take 0.84-0.91 of the time of visits of 16, though in cache they cost 18 % (each visit's V
//    accumulators are loaded and stored 4x as often).
//    Tiles of 4+ rows keep whole runs: there the compute per byte is 8x larger, and shorter visits cost 5 %
//    (more 1-key tails of the 4 x 3 score blocks). AMD cores without AVX-512 (Zen 2, Zen 3) keep whole runs for every
//    tile: there whole runs take 0.85-0.88 of the visits' time at 256-token blocks (machine_walk,
//    attention_kernel_avx2.cpp).
//  - Pages primed (WalkPlan::prime_kib, on for Intel cores and Zen 4): the fetch alone keeps one core at 10-11 GB/s
//    on this walk through 4 KiB pieces, a limit of the requests one core holds open, where the hardware streams a
//    contiguous read at 16-19. Touching the first two lines of each page far ahead starts the core's stream
//    prefetcher on that page, which fetches the rest beside the software's requests. Same bits: only prefetches are
//    added.
constexpr WalkPlan kDefaultWalk{};


// The attributes of a lambda the kernel's loops call (a key body, a span step): the kernel's target (a lambda does not
// inherit its enclosing function's) and inlined.
#define KVC_KEY_BODY KVC_KERNEL_TARGET __attribute__((always_inline))

// Where one walk along a split's rows stands: the span holding its next virtual row.
struct SpanCursor {
    uint32_t v = 0;        // the next virtual row
    uint32_t span_v0 = 0;  // the span holding row v: its first virtual row,
    uint32_t span_end = 0; // the virtual row after its last (v == span_end: row v starts the next span)
    uint64_t block = 0;    // its block (an index into the block table)
    uintptr_t base = 0;    // the address of row span_v0
};

// The rows one split reads, in the order it reads them: its K rows, its V rows, then the first K rows of the next
// split (the caller's next call). upto(u) prefetches every row before virtual index u + ahead. Block runs end every B
// rows and the next block can be anywhere in the pool, so the hardware prefetcher cannot see ahead; this can.
// It walks spans, not rows: inside one block a head's rows of one plane are contiguous, so a span (a block run of one
// part) is one address computed once and a line pointer stepped 64 bytes at a time; each line is fetched once. (Row
// by row, with the address recomputed per row, the walk takes 8-10 % of a GQA decode's time in cache: measured.)
struct RowPrefetcher {
    const kvc_kv_layout* l = nullptr;
    const uint32_t* table = nullptr;
    uint32_t head = 0;
    uint64_t k0 = 0;     // the split's first key
    uint32_t n = 0;      // keys this split reads
    uint32_t n_next = 0; // keys of the next split worth fetching (0 when there is none)
    uint32_t ahead = kDefaultWalk.prefetch_rows; // rows fetched ahead of the row in use
    bool to_l2 = kDefaultWalk.prefetch_to_l2;
    bool spread = kDefaultWalk.spread_prefetch; // WalkPlan::spread_prefetch (the AVX-512 group path's V passes)
    uint32_t prime = 0;      // rows ahead of the row in use whose pages are primed (WalkPlan::prime_kib); 0: none
    uint32_t prime_next = 0; // keys of the next split the primer reaches (0 when there is none)
    SpanCursor near{};       // the fetch: every line before row near.v is fetched,
    uintptr_t line = 0;      // and the next line of its span is this one
    SpanCursor far{};        // the primer: every page before row far.v is primed,
    uintptr_t page = 0;      // and the next address of its span to prime is this one
    uint32_t skip = 0;       // keys at the start of the split that it does not read (before a window): never fetched

    // The split reads its keys from `first` on (SplitView::walk_from): both walks start there, in K and in V.
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void skip_to(uint32_t first) {
        skip = first;
        near.v = near.span_end = far.v = far.span_end = first;
    }

    // Every method is forced inline: a call from a kernel loop clobbers every vector register, so the caller's
    // accumulators would go to the stack around it (out of line, the calls take 12 % of an MHA decode in cache on
    // Zen 3).

    // row c.v starts a span: where it lives, and how many rows of its part follow it in the same block (`next`: the
    // rows of the next split this walk goes on into)
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void next_span(SpanCursor& c, uint32_t next) const {
        uint32_t part = 0, part_end = n, plane = KVC_PLANE_K, from = skip; // from: the part's rows not read
        uint64_t first = k0; // the part's first position
        if (c.v >= n + n) {
            part = n + n;
            part_end = n + n + next;
            first = k0 + kSplitKeys;
            from = 0;
        } else if (c.v >= n) {
            part = n;
            part_end = n + n;
            plane = KVC_PLANE_V;
        }
        if (c.v < part + from) c.v = part + from; // the V part starts where the K part did
        uint32_t slot = 0;
        if (c.v == part + from) { // a part starts: one division
            const uint64_t pos = first + from;
            c.block = pos / l->block_size;
            slot = static_cast<uint32_t>(pos - c.block * l->block_size);
        } else { // the part goes on at the start of the next block
            ++c.block;
        }
        c.span_v0 = c.v;
        c.span_end = std::min(part_end, c.v + (l->block_size - slot));
        c.base = reinterpret_cast<uintptr_t>(l->block_base[table[c.block]] +
                                             kvc_kv_block_offset(l, slot, plane, head, 0));
    }

    // Moves cursor c on to row `target` span by span (`next`: as in next_span), with `at` set to the first line of
    // each span it enters; step(stop, end) for each stretch, end the address after row stop - 1.
    template <class Step>
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void walk_to(SpanCursor& c, uintptr_t& at, uint32_t next,
                                                                        uint32_t target, Step step) const {
        while (c.v < target) {
            if (c.v == c.span_end) {
                next_span(c, next);
                at = c.base & ~uintptr_t(63);
                if (c.v >= target) break; // it stepped over rows the split does not read
            }
            const uint32_t stop = std::min(target, c.span_end);
            step(stop, c.base + uintptr_t(stop - c.span_v0) * l->row_bytes);
            c.v = stop;
        }
    }

    template <_mm_hint Hint>
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void fetch_upto(uint32_t target) {
        walk_to(near, line, n_next, target, [&](uint32_t stop, uintptr_t end) KVC_KEY_BODY {
            // the fetch enters a new page: the primer moves on. Per page, not per call: in cache the primer is pure
            // overhead, and run on every call it takes 5 % of an MHA decode there (Intel model 167).
            if (prime != 0 && ((end - 1) ^ (line - 1)) >> 12 != 0)
                prime_upto(std::min(stop + prime, 2 * n + prime_next));
            for (; line < end; line += 64) _mm_prefetch(reinterpret_cast<const char*>(line), Hint);
        });
    }

    // The primer: the first two lines of every 4 KiB page the walk will enter, far ahead of the fetch. Two ascending
    // misses in a page start the core's own stream prefetcher there, which then brings the page's other lines in
    // without holding the requests the software fetch is limited by (WalkPlan::prime_kib).
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void prime_upto(uint32_t target) {
        walk_to(far, page, prime_next, target, [&](uint32_t, uintptr_t end) KVC_KEY_BODY {
            for (; page < end; page = (page | 4095) + 1) {
                _mm_prefetch(reinterpret_cast<const char*>(page), _MM_HINT_T1);
                _mm_prefetch(reinterpret_cast<const char*>(page + 64), _MM_HINT_T1);
            }
        });
    }

    // prefetches every row before virtual index `used + ahead` (used: the row about to be read, plus one; the V loops
    // pass the end of their group of kTrickleRows keys, so there the lead is ahead to ahead + 3 rows); the primer
    // follows the fetch `prime` rows further on
    KVC_KERNEL_TARGET inline __attribute__((always_inline)) void upto(uint32_t used) {
        const uint32_t target = std::min(used + ahead, 2 * n + n_next);
        if (target <= near.v) return;
        if (to_l2) fetch_upto<_MM_HINT_T1>(target);
        else fetch_upto<_MM_HINT_T0>(target);
    }
};

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

// ---- the group path (tiles of 4 or more rows in phase 1; f16/bf16 tiles of 5 or more in phase 4) ----------------
// Why (measured on Zen 3, docs/log/performance-log.md): on the direct path a GQA tile of 8 rows spends half its time in phase
// 1, whose 8 accumulators (8 rows x 1 key) leave no slack over the FMA latency (16 dependent FMAs per key at d = 128),
// and phase 4 widens every V row twice (once per half of the tile). The group path replaces both loops with the two
// hooks below, which each kernel defines for its registers (attention_kernel_avx2.cpp: 4 x 3 score blocks, V widened
// once into an L1 scratch; attention_kernel_avx512.cpp: two accumulators per zmm, V straight from the cache). The bits
// are those of the direct path: widening is exact, and each dot product and each output element keeps its own
// accumulator and the order of its operations; only which of them share a loop changes.
constexpr uint32_t kPieceKeys = 16;

// The group path's inner loops, defined by the including file for its instruction set (same bits either way).
// Phase 1 for R >= 4 rows over one block run: scores of keys j0 .. j0 + run - 1 into sc[r][j0 ..]. The rows' queries
// are copies (group_queries, in the layout `pairs` says) from one base q, so that a register block addresses all of
// them from one register: with a pointer per row, 8 rows and 4 keys ran out of general registers (measured).
template <uint32_t DT, int R>
KVC_KERNEL_TARGET void group_scores(const float (*q)[kSimdMaxHeadDim], bool pairs, const uint8_t* kp, uint32_t run,
                                    uint64_t row_bytes, uint32_t d, __m256 scale, RowPrefetcher& pf,
                                    float (*sc)[kSplitKeys], uint32_t j0);
// Which layout group_scores takes its queries in (group_queries), asked once per split: rows one by one (false), or
// in interleaved pairs (true: the AVX-512 kernel's score blocks of row pairs, on the machines where they are faster).
KVC_KERNEL_TARGET bool group_query_pairs();
// The rows of one tile into group_scores' query block `out` (dq floats per row, zero-padded like the tile's):
//  - one by one: row r at out[r];
//  - in pairs: rows 2p and 2p + 1 together in out[2p] .. out[2p + 1] (2 kSimdMaxHeadDim floats read as one array), chunk
//    c of 8 floats of row 2p at 16c and of row 2p + 1 at 16c + 8; the odd row of an odd R is zeros.
// The block's rows: R one by one, R rounded up to even in pairs.
template <int R>
constexpr int group_query_rows(bool pairs) {
    return pairs ? (R + 1) / 2 * 2 : R;
}
template <int R>
KVC_KERNEL_TARGET inline void group_queries(const RowTile& t, uint32_t dq, bool pairs, float (*out)[kSimdMaxHeadDim]) {
    const uint32_t step = pairs ? 16 : 8; // floats from one chunk of a row to its next
    for (int r = 0; r < group_query_rows<R>(pairs); ++r) {
        float* row = pairs ? out[r & ~1] + 8 * (r & 1) : out[r];
        for (uint32_t c = 0; c < dq; c += 8)
            _mm256_store_ps(row + c / 8 * step, r < R ? _mm256_loadu_ps(t.q[r] + c) : _mm256_setzero_ps());
    }
}
// Those rows as one pointer each, for the loops that take them so (dots, score_run_kj).
template <int R>
inline void row_pointers(const float (*q)[kSimdMaxHeadDim], const float* (&out)[R]) {
    for (int r = 0; r < R; ++r) out[r] = q[r];
}
// Phase 4 of the group path for count V rows of one block run that all R rows see: o[r] += sum over keys i < count
// of p[r][col + i] * v_i, every output element taking its keys in key order (p: the rows' probabilities, one row of
// the split's score buffer each); `wide` is an L1 scratch of kPieceKeys x dq floats where KVC_GROUP_VALUES_SCRATCH
// is 1 (else null); prefetching
// trickles along (row v0 + i).
template <uint32_t DT, int R>
KVC_KERNEL_TARGET void group_values(const uint8_t* v, uint64_t row_bytes, uint32_t count, uint32_t d, uint32_t dq,
                                    float* wide, const float (*p)[kSplitKeys], uint32_t col, SoftmaxState* st,
                                    RowPrefetcher* pf, uint32_t v0);


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
KVC_KERNEL_TARGET inline void row_softmax(const SplitView& sv, int r, float* row, uint32_t dq, SoftmaxState& s) {
    for (uint32_t c = 0; c < dq; c += 8) _mm256_storeu_ps(s.o + c, _mm256_setzero_ps());
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
template <uint32_t DT, int R>
KVC_KERNEL_TARGET void split_x86(const SplitArgs& a, uint32_t nh, const RowTile* tiles, uint32_t k0, SoftmaxState* st) {
    const kvc_kv_layout& L = *a.layout;
    const RowTile& t = tiles[0]; // the limits, windows and sinks are the same for every head
    const uint32_t d = L.head_dim, dq = padded_dim(d), B = L.block_size;
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
        for (int r = 0; r < R; ++r) row_softmax(sv, r, sc[h * R + r], dq, st[h * kTileRows + r]);

    // phase 4: o = sum_j p_j v_j. Keys every row sees go through register accumulators; the others (the end of a
    // prefill tile, the start of a tile's windows) go key by key, skipping the rows that do not see them.
    for (int g = 0; g < sv.n_ranges; ++g) {
        const bool fetch = g + 1 == sv.n_ranges;
        for (uint32_t j = sv.first[g]; j < sv.last[g];) {
            const uint64_t pos = static_cast<uint64_t>(k0) + j;
            const uint32_t slot = static_cast<uint32_t>(pos % B);
            const uint32_t run = std::min({B - slot, sv.last[g] - j, visit});
            const uint8_t* vp0 = kvc_kv_address(&L, a.table, pos, KVC_PLANE_V, a.kv_head, 0);
            for (uint32_t h = 0; h < nh; ++h) {
                const uint8_t* vp = vp0 + h * L.head_bytes;
                SoftmaxState* sh = st + h * kTileRows;
                const float (*sch)[kSplitKeys] = sc + h * R;
                RowPrefetcher* p = fetch ? &pf[h] : &idle;
                for (uint32_t i = 0; i < run;) {
                    const uint32_t jj = j + i, live = sv.live_until(jj);
                    if (live == 0) {
                        p->upto(n_max + jj + 1);
                        accumulate_key<DT, R>(sv, vp + i * L.row_bytes, jj, d, sch, sh);
                        ++i;
                        continue;
                    }
                    const uint32_t count = std::min(run - i, live - jj);
                    bool done = false;
                    if constexpr (kWiden) {
                        if (group_path) {
                            group_values<DT, R>(vp + i * L.row_bytes, L.row_bytes, count, d, dq,
                                                kScratch ? wide : nullptr, sch, jj, sh, p, n_max + jj);
                            done = true;
                        }
                    }
                    if (!done) {
                        const float* pr[R];
                        for (int r = 0; r < R; ++r) pr[r] = sch[r] + jj;
                        accumulate_all_live<DT, R>(vp + i * L.row_bytes, L.row_bytes, count, pr, sh, d, p, n_max + jj);
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
                for (uint32_t c = 0; c < dq; c += 8) {
                    float* o = st[h * kTileRows + r].o + c;
                    _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(o), vs));
                }
        }
}

// split_x86<DT, R> for R = the tile's rows, Lo <= R <= kTileRows (rows beyond kTileRows are not possible: a tile
// holds at most that many). A kernel instantiates only the row counts it runs.
template <uint32_t DT, int Lo, int R = kTileRows>
KVC_KERNEL_TARGET void split_rows(const SplitArgs& a, uint32_t nh, const RowTile* t, uint32_t k0, SoftmaxState* st) {
    if constexpr (R > Lo) {
        if (t[0].n < R) return split_rows<DT, Lo, R - 1>(a, nh, t, k0, st);
    }
    split_x86<DT, R>(a, nh, t, k0, st);
}

} // namespace
} // namespace kvc::opt
