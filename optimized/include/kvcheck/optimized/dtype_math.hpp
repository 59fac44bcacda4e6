// Cache dtypes for host and device code alike: float32 <-> IEEE binary16 and bfloat16, round to nearest even,
// NaN kept quiet, infinities kept. The one bit-level definition of both engines (the CPU engine's
// optimized/src/dtype_convert.hpp calls these), so the CUDA kernels store exactly the bits the CPU engine stores;
// the reference's own conversion (Eigen::half / Eigen::bfloat16) is independent on purpose, and the unit tests
// (tests/engine/test_dtype.cpp, tests/cuda/test_cuda_math_host.cpp) hold these to it. No intrinsics: the device
// compiles the same integer code the host runs, so the host tests exercise what the kernels do.
#pragma once

#include "kvcheck/optimized/kv_layout.h" // KVC_HOST_DEVICE

#include <stdint.h>
#if !defined(__CUDACC__)
#include <string.h>
#endif

namespace kvc::opt::math {

enum : uint32_t { kDtypeF32 = 0, kDtypeF16 = 1, kDtypeBF16 = 2 }; // = kvc_dtype

KVC_HOST_DEVICE inline uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
#endif
}

KVC_HOST_DEVICE inline float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, 4);
    return x;
#endif
}

// float -> binary16 bits, round to nearest even.
KVC_HOST_DEVICE inline uint16_t f32_to_f16_bits(float f) {
    const uint32_t x = bits_of(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u); // NaN -> quiet NaN
    if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); // >= 65520 rounds to infinity
    if (ax < 0x38800000u) {                                             // below 2^-14: subnormal or zero
        if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);      // <= 2^-25 rounds to (signed) zero
        const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - (ax >> 23); // value / 2^-24 = mant >> shift
        uint32_t h = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) ++h; // may carry into the smallest normal: right
        return static_cast<uint16_t>(sign | h);
    }
    uint32_t h = (ax - 0x38000000u) >> 13; // rebias 127 -> 15, keep 10 mantissa bits
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h; // a carry into the exponent is right
    return static_cast<uint16_t>(sign | h);
}

// binary16 bits -> float (exact).
KVC_HOST_DEVICE inline float f16_bits_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return float_of(bits_of(static_cast<float>(m) * 5.9604644775390625e-8f) | sign); // m * 2^-24
    if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

// float -> bfloat16 bits, round to nearest even.
KVC_HOST_DEVICE inline uint16_t f32_to_bf16_bits(float f) {
    const uint32_t x = bits_of(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u);
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

KVC_HOST_DEVICE inline float bf16_bits_to_f32(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

// Store one float as a cache element at dst (4 or 2 bytes, naturally aligned), and load one back as float.
KVC_HOST_DEVICE inline void store_elem(float x, uint32_t dtype, void* dst) {
    if (dtype == kDtypeF32) *static_cast<float*>(dst) = x;
    else *static_cast<uint16_t*>(dst) = dtype == kDtypeF16 ? f32_to_f16_bits(x) : f32_to_bf16_bits(x);
}

KVC_HOST_DEVICE inline float load_elem(const void* src, uint32_t dtype) {
    if (dtype == kDtypeF32) return *static_cast<const float*>(src);
    const uint16_t b = *static_cast<const uint16_t*>(src);
    return dtype == kDtypeF16 ? f16_bits_to_f32(b) : bf16_bits_to_f32(b);
}

// 16 bytes of a cached row, read as four 32-bit words (a little-endian machine: the element at the lower address is
// the lower half of its word), widened to f32 in address order: 4 f32 or 8 16-bit elements into out[]. The CUDA
// kernel stages rows this way (kernels.cu); the host test holds it to load_elem element by element.
KVC_HOST_DEVICE inline void widen_words(const uint32_t w[4], uint32_t dtype, float* out) {
    for (uint32_t i = 0; i < 4; ++i) {
        if (dtype == kDtypeF32) {
            out[i] = float_of(w[i]);
        } else {
            const uint16_t lo = static_cast<uint16_t>(w[i] & 0xffffu), hi = static_cast<uint16_t>(w[i] >> 16);
            out[2 * i] = dtype == kDtypeF16 ? f16_bits_to_f32(lo) : bf16_bits_to_f32(lo);
            out[2 * i + 1] = dtype == kDtypeF16 ? f16_bits_to_f32(hi) : bf16_bits_to_f32(hi);
        }
    }
}

} // namespace kvc::opt::math
