// The x86 split kernel of the quantized cache dtypes (fp8 E4M3FN / E5M2, int8 per token, q8_0), included by the AVX2
// and the AVX-512 translation units after attention_kernel_x86.hpp, whose f32 phases it runs.
//
// Why it is shaped this way: each piece of at most kPieceKeys rows of one head (within one block run) is
// dequantized exactly into an L1 scratch, decode(code) * scale rounded once in f32 as the reference's dequantizers
// do, and the f32 kernel's score and value loops then read the scratch as f32 rows. The cache itself stays codes and
// scales (a piece of 16 rows is at most 16 KiB of stack), the attention is exactly "the f32 path over the dequantized
// rows", and the f32 loops keep their bits: both kernels give the same bits here too.
#pragma once

#include "quantize.hpp"

#include <cstring>

namespace kvc::opt {
namespace {

constexpr bool is_quant_dtype(uint32_t dt) { return dt >= KVC_DTYPE_FP8_E4M3 && dt <= KVC_DTYPE_Q8_0; }

// 8 codes -> 8 exact floats, before the scale: fp8 decoded (E5M2 is an f16's high byte; E4M3FN's fields placed in an
// f16 give its value times 2^-8, and its one NaN magnitude 0x7f gets the f16 NaN exponent), int8 widened.
template <uint32_t DT>
KVC_KERNEL_TARGET inline __m256 widen_codes8(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    if constexpr (DT == KVC_DTYPE_FP8_E5M2) {
        return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(b), 8));
    } else if constexpr (DT == KVC_DTYPE_FP8_E4M3) {
        const __m128i w = _mm_cvtepu8_epi16(b);
        const __m128i mag = _mm_and_si128(w, _mm_set1_epi16(0x7f));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8), _mm_slli_epi16(mag, 7));
        h = _mm_or_si128(h, _mm_and_si128(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7c00)));
        return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    } else {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
}

// rows [count] of one head at src (row_bytes apart) -> out [count][dq] floats: each element decode(code) * scale,
// one f32 multiply (the last d % 8 through dequantize_row, the same multiply). fp8_scale: the head's (fp8 only).
template <uint32_t DT>
KVC_KERNEL_TARGET void dequantize_piece(const uint8_t* src, uint32_t count, const kvc_kv_layout& L, float fp8_scale,
                                        uint32_t dq, float* out) {
    const uint32_t d = L.head_dim, full = d / 8 * 8;
    const QuantFormat f{DT, d, L.scale_bytes == 2};
    for (uint32_t i = 0; i < count; ++i) {
        const uint8_t* row = src + i * L.row_bytes;
        float* o = out + i * dq;
        if constexpr (DT == KVC_DTYPE_Q8_0) { // d % 32 == 0: four chunks per f16 scale
            for (uint32_t b = 0; b < d / kQ8Block; ++b) {
                uint16_t bits;
                std::memcpy(&bits, row + d + 2 * b, 2);
                const __m256 s = _mm256_set1_ps(f16_to_f32(bits));
                KVC_UNROLL for (uint32_t c = 0; c < kQ8Block; c += 8)
                    _mm256_store_ps(o + b * kQ8Block + c, _mm256_mul_ps(widen_codes8<DT>(row + b * kQ8Block + c), s));
            }
            continue;
        }
        float scale = fp8_scale;
        if constexpr (DT == KVC_DTYPE_INT8_TOKEN) {
            if (f.f16_scale) {
                uint16_t bits;
                std::memcpy(&bits, row + d, 2);
                scale = f16_to_f32(bits);
            } else {
                std::memcpy(&scale, row + d, 4);
            }
        }
        const __m256 s = _mm256_set1_ps(scale);
        for (uint32_t c = 0; c < full; c += 8) _mm256_store_ps(o + c, _mm256_mul_ps(widen_codes8<DT>(row + c), s));
        if (full < d) { // the tail: the scalar dequantizer on the whole row is simplest, and the same multiply
            alignas(32) float all[kSimdMaxHeadDim];
            dequantize_row(row, f, fp8_scale, all);
            for (uint32_t c = full; c < d; ++c) o[c] = all[c];
        }
    }
}

// The kernel for R rows of nh consecutive KV heads over one split: the phases of split_x86 (scores, softmax state,
// values) over the stretches some row sees (SplitView), each block run cut into pieces of kPieceKeys rows, each
// piece of each head dequantized and then read by the f32 loops.
template <uint32_t DT, int R>
KVC_KERNEL_TARGET void split_quant(const SplitArgs& a, uint32_t nh, const RowTile* tiles, uint32_t k0,
                                   SoftmaxState* st) {
    const kvc_kv_layout& L = *a.layout;
    const RowTile& t = tiles[0]; // the limits, windows and sinks are the same for every head
    const kvc_kv_layout& Lv = a.v_layout ? *a.v_layout : L; // V rows: as wide as K rows or not
    const uint32_t d = L.head_dim, dq = padded_dim(d), B = L.block_size, dvq = padded_dim(Lv.head_dim);
    const SplitView sv = split_view(t, R, k0);
    const uint32_t n_max = sv.end;
    alignas(32) float sc[kMaxCallRows][kSplitKeys]; // row r of head h is sc[h * R + r]
    // one piece of one head, dequantized: K rows dq floats apart, V rows dvq
    alignas(64) float wide[kPieceKeys * kSimdMaxHeadDim];
    const auto* wide_rows = reinterpret_cast<const uint8_t*>(wide);
    const uint64_t wide_row_bytes = uint64_t{dq} * sizeof(float), wide_row_bytes_v = uint64_t{dvq} * sizeof(float);
    const __m256 scale = _mm256_set1_ps(a.scale);
    const WalkPlan walk = avx2_walk();
    // the next split's first keys, as far as some row sees them in a row (visible_run)
    const uint32_t n_next =
        static_cast<uint32_t>(std::min<uint64_t>(visible_run(t, R, uint64_t(k0) + kSplitKeys), walk.prefetch_rows));
    RowPrefetcher pf[kMaxCallRows];
    for (uint32_t h = 0; h < nh; ++h) {
        pf[h] = RowPrefetcher{&L, a.table, a.kv_head + h, k0, n_max, n_next, walk.prefetch_rows,
                              walk.prefetch_to_l2, false, 0, 0};
        pf[h].skip_to(sv.walk_from());
    }
    RowPrefetcher idle{}; // the sinks' stretch when a window stretch follows: nothing to fetch
    const auto piece_of = [&](uint32_t j, uint32_t end) {
        const uint64_t pos = uint64_t{k0} + j;
        return std::min({B - static_cast<uint32_t>(pos % B), end - j, kPieceKeys});
    };

    // phase 1: scores s = (q . k) * scale over each dequantized piece
    for (int g = 0; g < sv.n_ranges; ++g) {
        const bool fetch = g + 1 == sv.n_ranges;
        for (uint32_t j = sv.first[g]; j < sv.last[g];) {
            const uint32_t run = piece_of(j, sv.last[g]);
            const uint8_t* kp = kvc_kv_address(&L, a.table, uint64_t{k0} + j, KVC_PLANE_K, a.kv_head, 0);
            for (uint32_t h = 0; h < nh; ++h) {
                (fetch ? pf[h] : idle).upto(j + run);
                const float ks = a.k_scales ? a.k_scales[a.kv_head + h] : 1.0f;
                dequantize_piece<DT>(kp + h * L.head_bytes, run, L, ks, dq, wide);
                score_run_kj<KVC_DTYPE_F32, R, (R >= 5 ? 1 : 8 / R)>(tiles[h].q, wide_rows, run, wide_row_bytes, d,
                                                                    scale, nullptr, sc + h * R, j);
            }
            j += run;
        }
    }

    // phase 2: the maximum of each row; phase 3: p = exp(s - m) in place, and l = sum p in 8 lanes (as split_x86)
    for (uint32_t h = 0; h < nh; ++h)
        for (int r = 0; r < R; ++r) row_softmax(sv, r, sc[h * R + r], dvq, st[h * kTileRows + r]);

    // phase 4: o = sum_j p_j v_j over each dequantized piece; keys not every row sees go key by key
    for (int g = 0; g < sv.n_ranges; ++g) {
        const bool fetch = g + 1 == sv.n_ranges;
        for (uint32_t j = sv.first[g]; j < sv.last[g];) {
            const uint32_t run = piece_of(j, sv.last[g]);
            const uint8_t* vp = kvc_kv_address(&Lv, a.table, uint64_t{k0} + j, KVC_PLANE_V, a.kv_head, 0);
            for (uint32_t h = 0; h < nh; ++h) {
                (fetch ? pf[h] : idle).upto(n_max + j + run);
                const float vs = a.v_scales ? a.v_scales[a.kv_head + h] : 1.0f;
                dequantize_piece<DT>(vp + h * Lv.head_bytes, run, Lv, vs, dvq, wide);
                SoftmaxState* sh = st + h * kTileRows;
                const float (*sch)[kSplitKeys] = sc + h * R;
                for (uint32_t i = 0; i < run;) {
                    const uint32_t jj = j + i, live = sv.live_until(jj);
                    if (live == 0) {
                        accumulate_key<KVC_DTYPE_F32, R>(sv, wide_rows + i * wide_row_bytes_v, jj, Lv.head_dim, sch,
                                                         sh);
                        ++i;
                        continue;
                    }
                    const uint32_t count = std::min(run - i, live - jj);
                    const float* p[R];
                    for (int r = 0; r < R; ++r) p[r] = sch[r] + jj;
                    accumulate_all_live<KVC_DTYPE_F32, R>(wide_rows + i * wide_row_bytes_v, wide_row_bytes_v, count, p,
                                                          sh, Lv.head_dim, nullptr, 0);
                    i += count;
                }
            }
            j += run;
        }
    }
}

// split_quant<DT, R> for R = the tile's rows (as split_rows).
template <uint32_t DT, int R = kTileRows>
KVC_KERNEL_TARGET void split_quant_rows(const SplitArgs& a, uint32_t nh, const RowTile* t, uint32_t k0,
                                        SoftmaxState* st) {
    if constexpr (R > 1) {
        if (t[0].n < R) return split_quant_rows<DT, R - 1>(a, nh, t, k0, st);
    }
    split_quant<DT, R>(a, nh, t, k0, st);
}

// The quantized kernel of a dtype, or nullptr for the others.
inline SplitKernel split_kernel_quant(uint32_t dtype) {
    switch (dtype) {
    case KVC_DTYPE_FP8_E4M3: return split_quant_rows<KVC_DTYPE_FP8_E4M3>;
    case KVC_DTYPE_FP8_E5M2: return split_quant_rows<KVC_DTYPE_FP8_E5M2>;
    case KVC_DTYPE_INT8_TOKEN: return split_quant_rows<KVC_DTYPE_INT8_TOKEN>;
    case KVC_DTYPE_Q8_0: return split_quant_rows<KVC_DTYPE_Q8_0>;
    default: return nullptr;
    }
}

} // namespace
} // namespace kvc::opt
