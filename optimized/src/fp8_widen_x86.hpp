// fp8 codes -> exact floats for the x86 kernels' direct fp8 path (an fp8 cache whose scales fuse: fp8_scales_fuse,
// quantize.hpp): each code is read as the f16 whose bits are made from it, exactly decode(code) / fold (E5M2 is an
// f16's high byte, fold 1; E4M3FN's fields placed in an f16 are its value times 2^-8, fold 256). The fold and the
// scales are applied once per head by the kernel (fp8_fused_k_scale, fp8_fused_v_scale). Part of the including
// kernel's unnamed namespace, compiled for its target (KVC_KERNEL_TARGET; KVC_KERNEL_REGS 32: the AVX-512 unit).
//
// Why these sequences: on one Zen 4 core the MHA decode is bound by the kernel's instructions per element, not by
// memory, so every instruction of the widening shows in the step time (docs/performance.md, group 8).
//  - E4M3FN: the code sign-extended to 16 bits and shifted left by 7 is h = s s mmmmmmm 0000000 (sign at bits 15 and
//    14, the 7 magnitude bits at 7-13). Bit 14 must become 0, except for the one NaN magnitude 0x7f, which takes the
//    f16 NaN exponent 11111. h + 0x80 adds 1 to the magnitude: its bit 14 is still the sign's copy unless the
//    magnitude is 0x7f, where the carry flips it. So h ^ ((h + 0x80) & 0x4000) has bit 14 = 0 for every finite code
//    and 1 for both NaN codes (0x7f -> 0x7f80, 0xff -> 0xff80: the bits the scalar decoder makes, quantize.cpp). Four
//    operations from the load (three with AVX-512's vpternlogd), where a NaN compare and a blend took eight.
//  - 16 codes at a time where the loops can take two chunks of one row: the integer steps run once on 16 lanes of a
//    ymm (full width on these cores), and only the conversion to f32 runs per chunk.
// Every sequence gives the same f16 bits for all 256 codes, so every path gives the same floats.
#pragma once

#ifndef KVC_KERNEL_TARGET
#error "include fp8_widen_x86.hpp from an x86 kernel (after defining KVC_KERNEL_TARGET and KVC_KERNEL_REGS)"
#endif

#include "dtype_convert.hpp"
#include "quantize.hpp"

#include <immintrin.h>

namespace kvc::opt {
namespace {

// h = s s mmmmmmm 0000000 -> the E4M3FN f16 bits (above), on 8 or 16 lanes.
KVC_KERNEL_TARGET inline __m128i e4m3_fix_nan(__m128i h) {
#if KVC_KERNEL_REGS >= 32
    return _mm_ternarylogic_epi32(h, _mm_add_epi16(h, _mm_set1_epi16(0x80)), _mm_set1_epi16(0x4000), 0x78); // A^(B&C)
#else
    return _mm_xor_si128(h, _mm_and_si128(_mm_add_epi16(h, _mm_set1_epi16(0x80)), _mm_set1_epi16(0x4000)));
#endif
}
KVC_KERNEL_TARGET inline __m256i e4m3_fix_nan(__m256i h) {
#if KVC_KERNEL_REGS >= 32
    return _mm256_ternarylogic_epi32(h, _mm256_add_epi16(h, _mm256_set1_epi16(0x80)), _mm256_set1_epi16(0x4000),
                                     0x78);
#else
    return _mm256_xor_si256(h, _mm256_and_si256(_mm256_add_epi16(h, _mm256_set1_epi16(0x80)),
                                                _mm256_set1_epi16(0x4000)));
#endif
}

// The 8 codes in the low half of b -> the bits of 8 f16.
template <uint32_t DT>
KVC_KERNEL_TARGET inline __m128i fp8_halves8_of(__m128i b) {
    if constexpr (DT == KVC_DTYPE_FP8_E5M2) return _mm_unpacklo_epi8(_mm_setzero_si128(), b); // code << 8
    else return e4m3_fix_nan(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7));
}
// 8 codes at p -> the bits of 8 f16.
template <uint32_t DT>
KVC_KERNEL_TARGET inline __m128i fp8_halves8(const uint8_t* p) {
    return fp8_halves8_of<DT>(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// The 16 codes of b -> the bits of 16 f16, in order.
template <uint32_t DT>
KVC_KERNEL_TARGET inline __m256i fp8_halves16_of(__m128i b) {
    if constexpr (DT == KVC_DTYPE_FP8_E5M2) return _mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8);
    else return e4m3_fix_nan(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7));
}
// 16 codes at p -> the bits of 16 f16.
template <uint32_t DT>
KVC_KERNEL_TARGET inline __m256i fp8_halves16(const uint8_t* p) {
    return fp8_halves16_of<DT>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// 16 codes at p -> two chunks of 8 floats (decode(code) / fold), the first 8 codes in lo.
template <uint32_t DT>
KVC_KERNEL_TARGET inline __attribute__((always_inline)) void fp8_load16(const uint8_t* p, __m256& lo, __m256& hi) {
    const __m256i h = fp8_halves16<DT>(p);
    lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// One code -> decode(code) / fold (the tails of rows whose length is not a multiple of 8).
template <uint32_t DT>
KVC_KERNEL_TARGET inline float fp8_folded(uint8_t code) {
    return DT == KVC_DTYPE_FP8_E4M3 ? fp8_e4m3_decode(code) / kFp8FoldE4M3 : fp8_e5m2_decode(code);
}

} // namespace
} // namespace kvc::opt
