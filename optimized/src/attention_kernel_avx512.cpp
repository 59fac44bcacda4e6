// The AVX-512 split kernel: the x86 kernel body (attention_kernel_x86.hpp) compiled for AVX-512 F/DQ/VL/BW, with the
// group path's inner loops (tiles of 4+ rows: GQA groups, prefill) in 512-bit registers. Tiles of 1-3 rows (MHA
// decode) run the shared body's 256-bit direct path, compiled here so that it has 32 vector registers instead of 16:
// one row's V takes 16 chunks (d = 128) per pass instead of 8, so each V row is read once and the accumulators are
// loaded and stored half as often. On one Zen 4 core the MHA decode is as much arithmetic as memory (its kernel, in
// cache, reads about as fast as that core's memory streams), so that shows from memory too: 1.01-1.10x the AVX2
// kernel (docs/log/performance-log.md, "Results on Zen 4"). Unmeasured on the Intel kinds, where the benchmark's line
// "AVX-512 kernel: speedup" of the MHA shapes says.
//
// Why: the group path is bound by FMA throughput (docs/log/performance-log.md, "GQA 8:1 on Zen 4, the arithmetic
// bound"), and cores with two full-width 512-bit FMA units (the Intel Xeon kind here) do twice the lane-FMAs per
// cycle in zmm registers: 1.34-1.58x the AVX2 kernel on GQA 8:1 decode there ("The AVX-512 kernel").
//
// Same bits as the AVX2 kernel, by construction, so the engine's results do not depend on which one a machine runs:
//  - scores: one zmm holds two of the 8-lane accumulators the AVX2 kernel keeps per row and key (two keys of one row,
//    or one key of two rows: attention_kernel_avx512_scores.hpp), every lane seeing the same FMAs in the same order;
//    the two halves then go through the same 8-lane tree (reduce8).
//  - V (f16/bf16 tiles of 5+ rows, the AVX2 group path's gate): one zmm holds 16 consecutive output elements, each
//    accumulating its keys in key order, as in AVX2.
//  - widening is exact in any width.
// engine.KernelPaths.Avx512MatchesAvx2Bitwise checks it on random shapes.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics build their "undefined" operands as `__m512 __Y = __Y;` (_mm512_undefined_ps), which
// -Wmaybe-uninitialized (and, in the sanitizer build, -Wuninitialized) reports wherever they are inlined: a false
// positive inside the compiler's own headers. For the whole file: they are inlined into the shared body too.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "simd.hpp"
#define KVC_KERNEL_TARGET KVC_TARGET_AVX512
#define KVC_KERNEL_REGS 32
#define KVC_GROUP_VALUES_SCRATCH 0
#include "attention_kernel_x86.hpp"
#include "attention_kernel_avx512_scores.hpp"
#include "attention_kernel_quant_x86.hpp"

#include <atomic>

namespace kvc::opt {
namespace {

std::atomic<bool> g_avx512_group{true};
// Row pairs where they were measured faster: AMD family 25 (Zen 4; the Zen 3 cores of that family have no AVX-512, so
// never run this kernel). Key pairs elsewhere, unmeasured: the Intel kinds, and Zen 5 (family 26), whose 512-bit FMA
// units are full width (attention_kernel_avx512_scores.hpp says why that matters).
std::atomic<bool> g_score_row_pairs{cpu_is_amd() && cpu_family() == 25};
// avx512_score_layout_splits: [0] key pairs, [1] row pairs
std::atomic<uint64_t> g_layout_splits[2] = {};

// Read once per split (split_x86): the queries' layout and the score blocks that read them must agree.
KVC_TARGET_AVX512 bool group_query_pairs() { return g_score_row_pairs.load(std::memory_order_relaxed); }

// 16 consecutive cached elements -> 16 floats.
template <uint32_t DT>
KVC_TARGET_AVX512 inline __m512 load16(const uint8_t* p) {
    if constexpr (is_fp8<DT>()) {
        return _mm512_cvtph_ps(fp8_halves16<DT>(p));
    } else if constexpr (DT == KVC_DTYPE_F32) {
        return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    } else {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        if constexpr (DT == KVC_DTYPE_F16) return _mm512_cvtph_ps(h);
        else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

// Phase 1 of the group path in the layout of this split's queries (group_query_pairs): row pairs, 4 pairs x 4 keys
// for 7-8 rows, 3 x 6 for 5-6, 2 x 8 for 4 (16-18 accumulators); or key pairs.
template <uint32_t DT, int R>
KVC_TARGET_AVX512 void group_scores(const float (*q)[kSimdMaxHeadDim], bool pairs, const uint8_t* kp, uint32_t run,
                                    uint64_t row_bytes, uint32_t d, __m256 scale, RowPrefetcher& pf,
                                    float (*sc)[kSplitKeys], uint32_t j0) {
    static_assert(R >= 4 && R <= kTileRows, "4 to 8 rows");
    if (j0 == 0) g_layout_splits[pairs].fetch_add(1, std::memory_order_relaxed); // the split's first run of this head
    if (!pairs) return group_scores_keys<DT, R>(q, kp, run, row_bytes, d, scale, pf, sc, j0);
    constexpr int RP = (R + 1) / 2, KJ = RP == 4 ? 4 : RP == 3 ? 6 : 8;
    group_scores_rows<DT, R, RP, KJ>(q, kp, run, row_bytes, d, _mm512_broadcast_f32x8(scale), pf, sc, j0);
}

// o[r][c0 .. c0 + 16 CP) += p[r][col + i] * v_i[...] for keys i in order, straight from the cached rows, R x CP zmm
// accumulators; with a prefetcher, it trickles from row v0 to row v1 along the keys (trickle_keys).
template <uint32_t DT, int R, int CP>
KVC_TARGET_AVX512 inline __attribute__((always_inline)) void accumulate_pass16(const uint8_t* v, uint64_t row_bytes,
                                                                               uint32_t count,
                                                                               const float (*p)[kSplitKeys],
                                                                               uint32_t col, SoftmaxState* st,
                                                                               uint32_t c0, RowPrefetcher* pf,
                                                                               uint32_t v0, uint32_t v1) {
    __m512 acc[R][CP];
    KVC_UNROLL for (int r = 0; r < R; ++r)
        KVC_UNROLL for (int cc = 0; cc < CP; ++cc) acc[r][cc] = _mm512_loadu_ps(st[r].o + c0 + 16 * cc);
    trickle_keys(count, pf, v0, v1, [&](uint32_t i) KVC_KEY_BODY {
        const uint8_t* row = v + i * row_bytes + c0 * elem_bytes<DT>();
        __m512 vv[CP];
        KVC_UNROLL for (int cc = 0; cc < CP; ++cc) vv[cc] = load16<DT>(row + 16 * cc * elem_bytes<DT>());
        KVC_UNROLL for (int r = 0; r < R; ++r) {
            const __m512 pr = _mm512_set1_ps(p[r][col + i]);
            KVC_UNROLL for (int cc = 0; cc < CP; ++cc) acc[r][cc] = _mm512_fmadd_ps(pr, vv[cc], acc[r][cc]);
        }
    });
    KVC_UNROLL for (int r = 0; r < R; ++r)
        KVC_UNROLL for (int cc = 0; cc < CP; ++cc) _mm512_storeu_ps(st[r].o + c0 + 16 * cc, acc[r][cc]);
}

// One piece, straight from the cache, 32 then 16 elements at a time, then a chunk of 8 in 256-bit registers and the
// last d % 8 key by key (never reading past a row, which may end a slab): each element's FMAs in key order, as in
// AVX2. The rows' probabilities sit a fixed stride apart (rows of one score buffer): one base register serves them.
template <uint32_t DT, int R>
KVC_TARGET_AVX512 void group_piece(const uint8_t* v, uint64_t row_bytes, uint32_t count, uint32_t d,
                                   const float (*sc)[kSplitKeys], uint32_t col, SoftmaxState* st, RowPrefetcher* pf,
                                   uint32_t v0) {
    const uint32_t n16 = d / 16;
    uint32_t c = 0;
    // WalkPlan::spread_prefetch: every 16-wide pass fetches its share of the rows ahead, so the fetches are spread
    // through the piece's whole compute instead of bunched in its first quarter (d = 128: 4 passes). On the Intel
    // Xeon model 167 kind, every step from memory, GQA 8:1 decode is 4-6 % faster with it at 16-token blocks, 0-4 %
    // at 256, and 3 % slower in cache (4x the prefetcher's calls): on by default there (machine_walk). Same bits: only
    // prefetches move. Without it the first pass fetches them all.
    const uint32_t passes = pf && pf->spread ? (n16 + 1) / 2 : 1; // the passes that advance the prefetcher
    for (uint32_t p = 0; c < n16; c += 2, ++p) {
        RowPrefetcher* const pp = p < passes ? pf : nullptr;
        const uint32_t from = v0 + count * p / passes, to = v0 + count * (p + 1) / passes;
        if (c + 2 <= n16) accumulate_pass16<DT, R, 2>(v, row_bytes, count, sc, col, st, 16 * c, pp, from, to);
        else accumulate_pass16<DT, R, 1>(v, row_bytes, count, sc, col, st, 16 * c, pp, from, to);
    }
    if (n16 > 0) pf = nullptr;
    const float* pr[R];
    for (int r = 0; r < R; ++r) pr[r] = sc[r] + col;
    if (d % 16 >= 8) {
        accumulate_pass<DT, R, 1>(v, row_bytes, count, pr, st, 16 * n16, pf, v0);
        pf = nullptr;
    }
    if (pf) pf->upto(v0 + count);
    accumulate_tail<DT, R>(v, row_bytes, count, pr, st, d);
}

// Pieces of kPieceKeys rows, as in AVX2 (pieces of 64 rows, which load and store the accumulators 4x less often,
// are not faster: measured). Each pass over a piece re-reads its rows from L1.
template <uint32_t DT, int R>
KVC_TARGET_AVX512 void group_values(const uint8_t* v, uint64_t row_bytes, uint32_t count, uint32_t d, uint32_t /*dq*/,
                                    float* /*wide*/, const float (*sc)[kSplitKeys], uint32_t col, SoftmaxState* st,
                                    RowPrefetcher* pf, uint32_t v0) {
    for (uint32_t i0 = 0; i0 < count; i0 += kPieceKeys)
        group_piece<DT, R>(v + i0 * row_bytes, row_bytes, std::min(kPieceKeys, count - i0), d, sc, col + i0, st,
                           pf, v0 + i0);
}

// exp_nonpositive (attention_kernel_x86.hpp) on 16 lanes: the same constants (ExpConstants) and the same operations
// in the same order on every lane, so the same bits.
KVC_TARGET_AVX512 inline __m512 exp_nonpositive16(__m512 x) {
    using C = ExpConstants;
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(C::kFloor), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(C::kFloor));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(C::kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::kLn2Lo), r);
    __m512 p = _mm512_set1_ps(C::kTaylor[0]);
    KVC_UNROLL for (int i = 1; i < C::kTerms; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::kTaylor[i]));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(static_cast<__mmask16>(~tiny), p, _mm512_castsi512_ps(e)); // 0 where x < kFloor
}

// Phase 3 in 16 lanes (in 8 it takes 9 % of a GQA decode in cache on the Intel Xeon model 167 kind), then the last 8
// keys in 8. The two halves of each 16 join the 8-lane sum one after the other: keys j .. j + 7, then j + 8 .. j + 15,
// as the 8-lane loop adds them.
KVC_TARGET_AVX512 __m256 exp_sum_row(float* row, uint32_t n8, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    uint32_t j = 0;
    for (; j + 16 <= n8; j += 16) {
        const __m512 p = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(row + j), vm));
        _mm512_storeu_ps(row + j, p);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(p));
        acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(p, 1));
    }
    return exp_sum_row8(row, j, n8, _mm256_set1_ps(m), acc);
}

template <uint32_t DT>
KVC_TARGET_AVX512 void split_avx512_any(const SplitArgs& a, uint32_t nh, const RowTile* t, uint32_t k0,
                                        SoftmaxState* st) {
    static const SplitKernel avx2 = split_kernel_avx2(DT, true); // looked up once, not per call (fp8: fused)
    if (!g_avx512_group.load(std::memory_order_relaxed)) return avx2(a, nh, t, k0, st);
    split_rows<DT, 1>(a, nh, t, k0, st); // every tile size: 1-3 rows on the direct path, 4+ on the group path
}

} // namespace

SplitKernel split_kernel_avx512(uint32_t dtype, bool fp8_fused) {
    switch (dtype) {
    case KVC_DTYPE_FP8_E4M3: return fp8_fused ? split_avx512_any<KVC_DTYPE_FP8_E4M3> : split_kernel_quant(dtype);
    case KVC_DTYPE_FP8_E5M2: return fp8_fused ? split_avx512_any<KVC_DTYPE_FP8_E5M2> : split_kernel_quant(dtype);
    default: break;
    }
    if (const SplitKernel q = split_kernel_quant(dtype)) return q;
    switch (dtype) {
    case KVC_DTYPE_F16: return split_avx512_any<KVC_DTYPE_F16>;
    case KVC_DTYPE_BF16: return split_avx512_any<KVC_DTYPE_BF16>;
    default: return split_avx512_any<KVC_DTYPE_F32>;
    }
}

void set_avx512_group_path(bool on) { g_avx512_group.store(on, std::memory_order_relaxed); }
bool avx512_group_path() { return g_avx512_group.load(std::memory_order_relaxed); }
void set_avx512_score_row_pairs(bool on) { g_score_row_pairs.store(on, std::memory_order_relaxed); }
bool avx512_score_row_pairs() { return g_score_row_pairs.load(std::memory_order_relaxed); }
ScoreLayoutSplits avx512_score_layout_splits() {
    ScoreLayoutSplits s;
    s.key_pairs = g_layout_splits[0].load(std::memory_order_relaxed);
    s.row_pairs = g_layout_splits[1].load(std::memory_order_relaxed);
    return s;
}

} // namespace kvc::opt
