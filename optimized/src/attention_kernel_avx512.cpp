// The AVX-512 split kernel: the x86 kernel body (attention_kernel_x86.hpp) compiled for AVX-512 F/DQ/VL/BW, with the
// group path's inner loops (tiles of 4+ rows: GQA groups, prefill) in 512-bit registers. Tiles of 1-3 rows (MHA
// decode) run the shared body's 256-bit direct path, compiled here so that it has 32 vector registers instead of 16:
// one row's V takes 16 chunks (d = 128) per pass instead of 8, so each V row is read once and the accumulators are
// loaded and stored half as often. On one Zen 4 core the MHA decode is as much arithmetic as memory (its kernel, in
// cache, reads about as fast as that core's memory streams), so that shows from memory too: 1.01-1.10x the AVX2
// kernel (docs/performance.md, "Results on Zen 4", "2026-12-04, night"). Not yet measured on the Intel kinds, where
// the benchmark's line "AVX-512 kernel: speedup" of the MHA shapes will say.
//
// Why: the group path is bound by FMA throughput (docs/performance.md, "GQA 8:1 on Zen 4, the arithmetic bound"), and
// cores with two full-width 512-bit FMA units (the Intel Xeon kind here) do twice the lane-FMAs per cycle in zmm
// registers: 1.34-1.58x the AVX2 kernel on GQA 8:1 decode there ("The AVX-512 kernel").
//
// Same bits as the AVX2 kernel, by construction, so the engine's results do not depend on which one a machine runs:
//  - scores: one zmm holds the 8-lane accumulators of two keys (key a in lanes 0-7, key b in 8-15) for one query
//    row, and every lane sees the same FMAs in the same order as the AVX2 kernel's accumulator of that key; the two
//    halves then go through the same 8-lane tree (reduce8).
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

#include <atomic>

namespace kvc::opt {
namespace {

std::atomic<bool> g_avx512_group{true};

// Chunk c of two keys -> one zmm: 8 elements of key a in lanes 0-7, 8 of key b in lanes 8-15.
template <uint32_t DT>
KVC_TARGET_AVX512 inline __m512 load8x2(const uint8_t* a, const uint8_t* b) {
    if constexpr (DT == KVC_DTYPE_F32) {
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(a))),
                                  _mm256_loadu_ps(reinterpret_cast<const float*>(b)), 1);
    } else {
        const __m256i h = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
        if constexpr (DT == KVC_DTYPE_F16) return _mm512_cvtph_ps(h);
        else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

// 16 consecutive cached elements -> 16 floats.
template <uint32_t DT>
KVC_TARGET_AVX512 inline __m512 load16(const uint8_t* p) {
    if constexpr (DT == KVC_DTYPE_F32) {
        return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    } else {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        if constexpr (DT == KVC_DTYPE_F16) return _mm512_cvtph_ps(h);
        else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

// vhaddps within each 256-bit half: [a1+a0, a3+a2, b1+b0, b3+b2] per 128-bit lane, the same sums in the same order.
KVC_TARGET_AVX512 inline __m512 hadd_halves(__m512 a, __m512 b) {
    const __m512 even = _mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 odd = _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    return _mm512_add_ps(odd, even);
}

// reduce8 on both 256-bit halves of 8 zmm at once: z[j] = [a_j | b_j] -> [A0..A3, B0..B3, A4..A7, B4..B7], where
// A_j (B_j) is the sum of the 8 lanes of a_j (b_j) through reduce8's tree ((0+1)+(2+3))+((4+5)+(6+7)).
KVC_TARGET_AVX512 inline __m512 reduce8_halves(const __m512* z) {
    const __m512 t0 = hadd_halves(z[0], z[1]), t1 = hadd_halves(z[2], z[3]);
    const __m512 t2 = hadd_halves(z[4], z[5]), t3 = hadd_halves(z[6], z[7]);
    const __m512 u0 = hadd_halves(t0, t1), u1 = hadd_halves(t2, t3);
    // reduce8's last step adds the low and the high 128 bits of each half: lanes L0 + L1 (a) and L2 + L3 (b)
    return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// q . k for R rows and 2 * KP consecutive keys, R * KP zmm accumulators (two keys each), each dot product exactly as
// the shared dots() computes it (8-lane accumulator, chunks in order, reduce8, then the scale). red[p] holds the
// scores of keys 2p and 2p + 1, scaled, in reduce8_halves' order: row r's score of key 2p + h is lane
// (r / 4) * 8 + h * 4 + r % 4.
template <uint32_t DT, int R, int KP>
KVC_TARGET_AVX512 inline __attribute__((always_inline)) void dots_x2(const float (*q)[kMaxHeadDim], const uint8_t* k,
                                                                     uint64_t row_bytes, uint32_t d, __m512 scale,
                                                                     __m512* red) {
    static_assert(R <= 8 && R * KP + KP + 1 <= 32, "accumulators, K chunks and one q chunk fit the 32 registers");
    __m512 acc[R * KP];
    KVC_UNROLL for (int i = 0; i < R * KP; ++i) acc[i] = _mm512_setzero_ps();
    const uint32_t full = d / 8, tail = d % 8;
    constexpr uint32_t eb = elem_bytes<DT>();
    const uint8_t* key[2 * KP]; // the rows' addresses once, so that a chunk's loads share one index
    KVC_UNROLL for (int kj = 0; kj < 2 * KP; ++kj) key[kj] = k + kj * row_bytes;
    for (uint32_t c = 0; c < full; ++c) {
        __m512 kv[KP];
        KVC_UNROLL for (int p = 0; p < KP; ++p)
            kv[p] = load8x2<DT>(key[2 * p] + c * 8 * eb, key[2 * p + 1] + c * 8 * eb);
        KVC_UNROLL for (int r = 0; r < R; ++r) {
            const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[r] + 8 * c));
            KVC_UNROLL for (int p = 0; p < KP; ++p) acc[r * KP + p] = _mm512_fmadd_ps(qv, kv[p], acc[r * KP + p]);
        }
    }
    if (tail) { // q rows are zero-padded to a multiple of 8
        __m512 kv[KP];
        KVC_UNROLL for (int p = 0; p < KP; ++p)
            kv[p] = _mm512_insertf32x8(_mm512_castps256_ps512(load_tail<DT>(key[2 * p] + full * 8 * eb, tail)),
                                       load_tail<DT>(key[2 * p + 1] + full * 8 * eb, tail), 1);
        KVC_UNROLL for (int r = 0; r < R; ++r) {
            const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[r] + 8 * full));
            KVC_UNROLL for (int p = 0; p < KP; ++p) acc[r * KP + p] = _mm512_fmadd_ps(qv, kv[p], acc[r * KP + p]);
        }
    }
    // the rows of one key pair through the tree together (the lanes never mix)
    KVC_UNROLL for (int p = 0; p < KP; ++p) {
        __m512 z[8];
        KVC_UNROLL for (int r = 0; r < 8; ++r) z[r] = r < R ? acc[r * KP + p] : _mm512_setzero_ps();
        red[p] = _mm512_mul_ps(reduce8_halves(z), scale);
    }
}

// The scores of one key pair (one red[p] of dots_x2) into the rows' score buffers: keys j and j + 1.
template <int R>
KVC_TARGET_AVX512 inline void scatter_pair(__m512 red_p, float (*sc)[kSplitKeys], uint32_t j) {
    alignas(64) float red[16];
    _mm512_store_ps(red, red_p);
    for (int r = 0; r < R; ++r) {
        sc[r][j] = red[(r / 4) * 8 + r % 4];
        sc[r][j + 1] = red[(r / 4) * 8 + 4 + r % 4];
    }
}

// The scores of two key pairs (red[0], red[1] of dots_x2) into the rows' score buffers, keys j .. j + 3: two
// permutes put each row's 4 scores side by side (rows 0-3 in one zmm, 4-7 in the other), one 16-byte store per row.
// Scattering them one by one cost a shuffle each (32 per block of 4 keys, on the FMA port 5).
template <int R>
KVC_TARGET_AVX512 inline void store_quad(const __m512* red, float (*sc)[kSplitKeys], uint32_t j) {
    // lane 4 r' + kk of half g: row 4 g + r', key kk = 2 p + h, found in red[p] at lane 8 g + 4 h + r' (p = 1: + 16)
    const __m512i lo = _mm512_setr_epi32(0, 4, 16, 20, 1, 5, 17, 21, 2, 6, 18, 22, 3, 7, 19, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    const __m512 half[2] = {_mm512_permutex2var_ps(red[0], lo, red[1]), _mm512_permutex2var_ps(red[0], hi, red[1])};
    KVC_UNROLL for (int r = 0; r < R; ++r) {
        const __m512 h = half[r / 4];
        const __m128 x = r % 4 == 0   ? _mm512_castps512_ps128(h)
                         : r % 4 == 1 ? _mm512_extractf32x4_ps(h, 1)
                         : r % 4 == 2 ? _mm512_extractf32x4_ps(h, 2)
                                      : _mm512_extractf32x4_ps(h, 3);
        _mm_storeu_ps(sc[r] + j, x);
    }
}

// Phase 1 of the group path: all R rows at once, 4 keys per register block for 6-8 rows (R x 2 zmm accumulators;
// 3 x 8 spills them to the stack), 6 for 4-5 rows, then pairs, then a last single key through the shared dots().
template <uint32_t DT, int R>
KVC_TARGET_AVX512 void group_scores(const float (*q)[kMaxHeadDim], const uint8_t* kp, uint32_t run,
                                    uint64_t row_bytes, uint32_t d, __m256 scale, RowPrefetcher& pf,
                                    float (*sc)[kSplitKeys], uint32_t j0) {
    static_assert(R >= 4 && R <= kTileRows, "4 to 8 rows");
    constexpr int KP = R > 5 ? 2 : 3, KJ = 2 * KP;
    const __m512 scale2 = _mm512_broadcast_f32x8(scale);
    __m512 red[KP];
    uint32_t i = 0;
    for (; i + KJ <= run; i += KJ) {
        pf.upto(j0 + i + KJ);
        dots_x2<DT, R, KP>(q, kp + i * row_bytes, row_bytes, d, scale2, red);
        if constexpr (KP == 2) {
            store_quad<R>(red, sc, j0 + i);
        } else {
            for (int p = 0; p < KP; ++p) scatter_pair<R>(red[p], sc, j0 + i + 2 * p);
        }
    }
    for (; i + 2 <= run; i += 2) {
        pf.upto(j0 + i + 2);
        dots_x2<DT, R, 1>(q, kp + i * row_bytes, row_bytes, d, scale2, red);
        scatter_pair<R>(red[0], sc, j0 + i);
    }
    if (i < run) {
        alignas(32) float out[16];
        const float* qr[R];
        row_pointers(q, qr);
        pf.upto(j0 + i + 1);
        dots<DT, R, 1>(qr, kp + i * row_bytes, row_bytes, d, scale, out);
        for (int r = 0; r < R; ++r) sc[r][j0 + i] = out[r];
    }
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
    // through the piece's whole compute instead of bunched in its first quarter (d = 128: 4 passes). Intel Xeon model
    // 167, 2026-12-04, every step from memory: GQA 8:1 decode 4-6 % faster at 16-token blocks, 0-4 % at 256; in
    // cache 3 % slower (4x the prefetcher's calls). Same bits: only prefetches move. Without it the first pass
    // fetches them all.
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
// were not faster: measured 2026-12-02). Each pass over a piece re-reads its rows from L1.
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

// Phase 3 in 16 lanes (it was 9 % of a GQA decode in cache in 8, Intel Xeon model 167, 2026-12-04), then the last 8
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
    static const SplitKernel avx2 = split_kernel_avx2(DT); // looked up once, not per call
    if (!g_avx512_group.load(std::memory_order_relaxed)) return avx2(a, nh, t, k0, st);
    split_rows<DT, 1>(a, nh, t, k0, st); // every tile size: 1-3 rows on the direct path, 4+ on the group path
}

} // namespace

SplitKernel split_kernel_avx512(uint32_t dtype) {
    switch (dtype) {
    case KVC_DTYPE_F16: return split_avx512_any<KVC_DTYPE_F16>;
    case KVC_DTYPE_BF16: return split_avx512_any<KVC_DTYPE_BF16>;
    default: return split_avx512_any<KVC_DTYPE_F32>;
    }
}

void set_avx512_group_path(bool on) { g_avx512_group.store(on, std::memory_order_relaxed); }
bool avx512_group_path() { return g_avx512_group.load(std::memory_order_relaxed); }

} // namespace kvc::opt
