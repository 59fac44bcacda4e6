// The x86 kernels' lane-level pieces (part of attention_kernel_x86.hpp, compiled once per instruction set): cached
// elements widened to f32, the fixed 8-lane sum tree, and exp on 8 lanes. Every dot product, sum and exponential of
// both kernels goes through these, which is what makes the AVX2 and AVX-512 kernels give the same bits.
#pragma once

#ifndef KVC_KERNEL_TARGET
#error "include attention_kernel_x86.hpp, which defines the target, not attention_kernel_x86_lanes.hpp on its own"
#endif

#include "dtype_convert.hpp"
#include "fp8_widen_x86.hpp"
#include "simd.hpp"

#include <immintrin.h>

#include <cstdint>

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

} // namespace
} // namespace kvc::opt
