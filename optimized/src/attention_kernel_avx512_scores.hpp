// Phase 1 of the AVX-512 kernel's group path (tiles of 4-8 rows: GQA groups, prefill), in its two register layouts;
// part of attention_kernel_avx512.cpp's unnamed namespace (included there, after the shared body's macros are set).
//
// Both compute every dot product exactly as the shared dots() does (one 8-lane accumulator per row and key, the chunks
// in order, the fixed tree reduce8, then the scale), so they give the AVX2 kernel's bits; they differ in what shares a
// zmm:
//  - key pairs (group_scores_keys): lanes 0-7 key a, 8-15 key b, one query row; each row's chunk is broadcast to both
//    halves from memory: per chunk, 8 query broadcasts and 2 K registers (4 loads) for 16 FMAs. Queries one by one.
//  - row pairs (group_scores_rows): lanes 0-7 row 2p, 8-15 row 2p + 1, one key; the key's chunk is broadcast to both
//    halves, the two rows' chunks are one plain load: per chunk, 4 K broadcasts and 4 query loads for 16 FMAs (7-8
//    rows). Queries in pairs (group_queries).
// On Zen 4 the 256-bit broadcast from memory of the key pairs takes a cycle of the FMA ports: a loop of 16 zmm FMAs
// per chunk takes 19.1 cycles in that layout, 15.9 in row pairs (the 128-bit K broadcasts and the widenings run
// beside the FMAs), and the kernel's GQA 8:1 step in cache is 7 % faster in row pairs. On cores with two 512-bit FMA
// units (the Intel kinds) the row pairs' widenings (4 per chunk instead of 2) may cost what the broadcasts save
// there: unmeasured, so those keep key pairs (set_avx512_score_row_pairs, attention_kernel.hpp).
#pragma once

#include "attention_kernel_x86.hpp" // the shared body, compiled for the including file's target (its macros set)

namespace kvc::opt {
namespace {

// Chunk c of two keys -> one zmm: 8 elements of key a in lanes 0-7, 8 of key b in lanes 8-15.
template <uint32_t DT>
KVC_TARGET_AVX512 inline __m512 load8x2(const uint8_t* a, const uint8_t* b) {
    if constexpr (is_fp8<DT>()) {
        // both keys' codes in one xmm, widened at once
        const __m128d lo = _mm_castsi128_pd(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)));
        const __m128i codes = _mm_castpd_si128(_mm_loadh_pd(lo, reinterpret_cast<const double*>(b)));
        return _mm512_cvtph_ps(fp8_halves16_of<DT>(codes));
    } else if constexpr (DT == KVC_DTYPE_F32) {
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

// Chunk c of one key (8 elements) -> both 256-bit halves of a zmm. From 16-bit elements this is a 128-bit broadcast
// load and a widening; a 256-bit broadcast (f32 rows) needs a shuffle on the FMA ports.
template <uint32_t DT>
KVC_TARGET_AVX512 inline __m512 load8_both(const uint8_t* p) {
    if constexpr (is_fp8<DT>()) {
        // the 8 codes in both halves of an xmm (one load), widened as 16
        const __m128i codes = _mm_castpd_si128(_mm_loaddup_pd(reinterpret_cast<const double*>(p)));
        return _mm512_cvtph_ps(fp8_halves16_of<DT>(codes));
    } else if constexpr (DT == KVC_DTYPE_F32) {
        return _mm512_broadcast_f32x8(_mm256_loadu_ps(reinterpret_cast<const float*>(p)));
    } else {
        const __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
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
KVC_TARGET_AVX512 inline __attribute__((always_inline)) void dots_x2(const float (*q)[kSimdMaxHeadDim], const uint8_t* k,
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

// Four scores of each of R rows into the rows' score buffers at keys j .. j + 3: row r's in the 128-bit lane r % 4 of
// half[r / 4], one 16-byte store each.
template <int R>
KVC_TARGET_AVX512 inline void store_rows4(const __m512 (&half)[2], float (*sc)[kSplitKeys], uint32_t j) {
    KVC_UNROLL for (int r = 0; r < R; ++r) {
        const __m512 h = half[r / 4];
        const __m128 x = r % 4 == 0   ? _mm512_castps512_ps128(h)
                         : r % 4 == 1 ? _mm512_extractf32x4_ps(h, 1)
                         : r % 4 == 2 ? _mm512_extractf32x4_ps(h, 2)
                                      : _mm512_extractf32x4_ps(h, 3);
        _mm_storeu_ps(sc[r] + j, x);
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
    store_rows4<R>(half, sc, j);
}

// Phase 1 of the group path in key pairs: all R rows at once (queries one by one), 4 keys per register block for
// 6-8 rows (R x 2 zmm accumulators; 3 x 8 spills them to the stack), 6 for 4-5 rows, then pairs, then a last single
// key through the shared dots().
template <uint32_t DT, int R>
KVC_TARGET_AVX512 void group_scores_keys(const float (*q)[kSimdMaxHeadDim], const uint8_t* kp, uint32_t run,
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

// q . k for RP row pairs and KJ consecutive keys, RP x KJ zmm accumulators: acc[p][j] holds rows 2p (lanes 0-7) and
// 2p + 1 (lanes 8-15) against key j, each half exactly the 8-lane accumulator the shared dots() keeps for that row and
// key (chunks in order), then the same tree (reduce8) and the scale. The queries come in pairs (group_queries): one
// plain 512-bit load per pair and chunk; the key's chunk is broadcast to both halves (load8_both).
// red[h] holds the scores of keys 2h and 2h + 1, scaled: row r's score of key 2h + e is lane 8e + 4 (r % 2) + r / 2.
template <uint32_t DT, int RP, int KJ>
KVC_TARGET_AVX512 inline __attribute__((always_inline)) void dots_pairs(const float (*q)[kSimdMaxHeadDim],
                                                                        const uint8_t* k, uint64_t row_bytes,
                                                                        uint32_t d, __m512 scale, __m512* red) {
    static_assert(RP >= 1 && RP <= 4 && RP * KJ + KJ + 1 <= 32, "accumulators, K chunks and one q chunk fit");
    __m512 acc[RP][KJ];
    KVC_UNROLL for (int p = 0; p < RP; ++p)
        KVC_UNROLL for (int j = 0; j < KJ; ++j) acc[p][j] = _mm512_setzero_ps();
    const uint32_t full = d / 8, tail = d % 8;
    constexpr uint32_t eb = elem_bytes<DT>();
    const uint8_t* key[KJ]; // the rows' addresses once, so that a chunk's loads share one index
    KVC_UNROLL for (int j = 0; j < KJ; ++j) key[j] = k + j * row_bytes;
    for (uint32_t c = 0; c < full; ++c) {
        __m512 kv[KJ];
        KVC_UNROLL for (int j = 0; j < KJ; ++j) kv[j] = load8_both<DT>(key[j] + c * 8 * eb);
        KVC_UNROLL for (int p = 0; p < RP; ++p) {
            const __m512 qv = _mm512_load_ps(q[2 * p] + 16 * c);
            KVC_UNROLL for (int j = 0; j < KJ; ++j) acc[p][j] = _mm512_fmadd_ps(qv, kv[j], acc[p][j]);
        }
    }
    if (tail) { // q rows are zero-padded to a multiple of 8
        __m512 kv[KJ];
        KVC_UNROLL for (int j = 0; j < KJ; ++j)
            kv[j] = _mm512_broadcast_f32x8(load_tail<DT>(key[j] + full * 8 * eb, tail));
        KVC_UNROLL for (int p = 0; p < RP; ++p) {
            const __m512 qv = _mm512_load_ps(q[2 * p] + 16 * full);
            KVC_UNROLL for (int j = 0; j < KJ; ++j) acc[p][j] = _mm512_fmadd_ps(qv, kv[j], acc[p][j]);
        }
    }
    // two keys' row pairs through the tree together (the lanes never mix)
    KVC_UNROLL for (int h = 0; h < (KJ + 1) / 2; ++h) {
        __m512 z[8];
        KVC_UNROLL for (int p = 0; p < 4; ++p) {
            z[p] = p < RP ? acc[p][2 * h] : _mm512_setzero_ps();
            z[4 + p] = p < RP && 2 * h + 1 < KJ ? acc[p][2 * h + 1] : _mm512_setzero_ps();
        }
        red[h] = _mm512_mul_ps(reduce8_halves(z), scale);
    }
}

// The scores of KJ keys (red[] of dots_pairs) into the rows' score buffers, keys j .. j + KJ - 1: each 4 keys by two
// permutes that put each row's 4 scores side by side (rows 0-3 in one zmm, 4-7 in the other) and one 16-byte store
// per row (scattering them one by one cost a shuffle each, on an FMA port); a last 1-3 keys one by one.
template <int R, int KJ>
KVC_TARGET_AVX512 inline void store_scores(const __m512* red, float (*sc)[kSplitKeys], uint32_t j) {
    // lane 4 r' + kk of half g: row r = 4 g + r', key kk = 2 h + e, found in red[h] at lane 8 e + 4 (r % 2) + r / 2
    // (red[h + 1]: + 16); g = 1 adds 2 (r / 2 + 2)
    const __m512i lo = _mm512_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28, 1, 9, 17, 25, 5, 13, 21, 29);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(2));
    int kk = 0;
    for (; kk + 4 <= KJ; kk += 4) {
        const __m512 half[2] = {_mm512_permutex2var_ps(red[kk / 2], lo, red[kk / 2 + 1]),
                                _mm512_permutex2var_ps(red[kk / 2], hi, red[kk / 2 + 1])};
        store_rows4<R>(half, sc, j + kk);
    }
    if constexpr (KJ % 4 != 0) {
        alignas(64) float out[2][16];
        for (int h = kk / 2; h < (KJ + 1) / 2; ++h) _mm512_store_ps(out[h - kk / 2], red[h]);
        for (int key = kk; key < KJ; ++key)
            for (int r = 0; r < R; ++r) sc[r][j + key] = out[(key - kk) / 2][8 * (key % 2) + 4 * (r % 2) + r / 2];
    }
}

// Phase 1 of the group path in row pairs: R rows as RP = (R + 1) / 2 row pairs (queries in pairs), KJ keys per
// register block, then pairs of keys, then a last key alone.
template <uint32_t DT, int R, int RP, int KJ>
KVC_TARGET_AVX512 void group_scores_rows(const float (*q)[kSimdMaxHeadDim], const uint8_t* kp, uint32_t run,
                                       uint64_t row_bytes, uint32_t d, __m512 scale, RowPrefetcher& pf,
                                       float (*sc)[kSplitKeys], uint32_t j0) {
    static_assert(R >= 4 && R <= kTileRows && RP == (R + 1) / 2, "4 to 8 rows, in (R + 1) / 2 pairs");
    __m512 red[(KJ + 1) / 2];
    uint32_t i = 0;
    for (; i + KJ <= run; i += KJ) {
        pf.upto(j0 + i + KJ);
        dots_pairs<DT, RP, KJ>(q, kp + i * row_bytes, row_bytes, d, scale, red);
        store_scores<R, KJ>(red, sc, j0 + i);
    }
    if constexpr (KJ > 2) {
        for (; i + 2 <= run; i += 2) {
            pf.upto(j0 + i + 2);
            dots_pairs<DT, RP, 2>(q, kp + i * row_bytes, row_bytes, d, scale, red);
            store_scores<R, 2>(red, sc, j0 + i);
        }
    }
    if (i < run) {
        pf.upto(j0 + i + 1);
        dots_pairs<DT, RP, 1>(q, kp + i * row_bytes, row_bytes, d, scale, red);
        store_scores<R, 1>(red, sc, j0 + i);
    }
}

} // namespace
} // namespace kvc::opt
