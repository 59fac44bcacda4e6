#include "dtype_convert.hpp"

#include "simd.hpp"

#include <immintrin.h>

namespace kvc::opt {
namespace {

KVC_TARGET_AVX2 void store_row_avx2(const float* src, uint32_t dtype, void* dst, uint32_t n) {
    uint32_t i = 0;
    if (dtype == KVC_DTYPE_F16) {
        auto* out = static_cast<uint16_t*>(dst);
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
        }
        for (; i < n; ++i) out[i] = f32_to_f16(src[i]);
    } else { // bf16: round to nearest even on the integer bits; NaN -> quiet NaN
        auto* out = static_cast<uint16_t*>(dst);
        const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
        const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
        const __m256i qnan = _mm256_set1_epi32(0x7fc0);
        const __m256i sign16 = _mm256_set1_epi32(0x8000);
        for (; i + 8 <= n; i += 8) {
            const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
            const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
            __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
            const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
            const __m256i nan_bits = _mm256_or_si256(qnan, _mm256_and_si256(_mm256_srli_epi32(x, 16), sign16));
            r = _mm256_blendv_epi8(r, nan_bits, is_nan);
            // 8 x u32 (each < 2^16) -> 8 x u16
            const __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi32(lo, hi));
        }
        for (; i < n; ++i) out[i] = f32_to_bf16(src[i]);
    }
}

KVC_TARGET_AVX2 void load_row_avx2(const void* src, uint32_t dtype, float* dst, uint32_t n) {
    uint32_t i = 0;
    const auto* in = static_cast<const uint16_t*>(src);
    if (dtype == KVC_DTYPE_F16) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
        for (; i < n; ++i) dst[i] = f16_to_f32(in[i]);
    } else {
        for (; i + 8 <= n; i += 8) {
            const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
        for (; i < n; ++i) dst[i] = bf16_to_f32(in[i]);
    }
}

} // namespace

void store_row(const float* src, uint32_t dtype, void* dst, uint32_t n, bool simd) {
    if (dtype == KVC_DTYPE_F32) {
        std::memcpy(dst, src, static_cast<size_t>(n) * 4);
        return;
    }
    if (simd && cpu_has_avx2_f16c()) {
        store_row_avx2(src, dtype, dst, n);
        return;
    }
    auto* out = static_cast<uint16_t*>(dst);
    for (uint32_t i = 0; i < n; ++i) out[i] = dtype == KVC_DTYPE_F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
}

void load_row(const void* src, uint32_t dtype, float* dst, uint32_t n, bool simd) {
    if (dtype == KVC_DTYPE_F32) {
        std::memcpy(dst, src, static_cast<size_t>(n) * 4);
        return;
    }
    if (simd && cpu_has_avx2_f16c()) {
        load_row_avx2(src, dtype, dst, n);
        return;
    }
    const auto* in = static_cast<const uint16_t*>(src);
    for (uint32_t i = 0; i < n; ++i) dst[i] = dtype == KVC_DTYPE_F16 ? f16_to_f32(in[i]) : bf16_to_f32(in[i]);
}

} // namespace kvc::opt
