// Cache dtypes: float32 <-> the stored element (f32, IEEE binary16, bfloat16). Rounding is to nearest even, the
// same as Eigen::half / Eigen::bfloat16 (and CUDA), so the bits the engine stores equal kvc::ref::store_dtype's.
// NaN stays NaN (quiet); infinities stay infinities.
#pragma once

#include "kvcheck/abi.h"

#include <cstdint>
#include <cstring>

namespace kvc::opt {

inline uint32_t float_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
inline float bits_float(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

// float -> binary16, round to nearest even (portable; the F16C path gives the same bits).
inline uint16_t f32_to_f16(float f) {
    const uint32_t x = float_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u); // NaN -> quiet NaN
    if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); // >= 65520 rounds to infinity
    if (ax < 0x38800000u) {                                             // below 2^-14: subnormal or zero
        if (ax <= 0x33000000u) return sign;                             // <= 2^-25 rounds to (signed) zero
        const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - (ax >> 23);                       // value / 2^-24 = mant >> shift
        uint32_t h = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) ++h;               // may carry into the smallest normal
        return static_cast<uint16_t>(sign | h);
    }
    uint32_t h = (ax - 0x38000000u) >> 13;                              // rebias 127 -> 15, keep 10 mantissa bits
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;             // a carry into the exponent is right
    return static_cast<uint16_t>(sign | h);
}

inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float mag = static_cast<float>(m) * 5.9604644775390625e-8f; // m * 2^-24, exact
        return bits_float(float_bits(mag) | sign);
    }
    if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
    return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t f32_to_bf16(float f) {
    const uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u);
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_to_f32(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// One element.
inline void store_elem(float x, uint32_t dtype, void* dst) {
    if (dtype == KVC_DTYPE_F32) {
        std::memcpy(dst, &x, 4);
    } else {
        const uint16_t b = dtype == KVC_DTYPE_F16 ? f32_to_f16(x) : f32_to_bf16(x);
        std::memcpy(dst, &b, 2);
    }
}
inline float load_elem(const void* src, uint32_t dtype) {
    if (dtype == KVC_DTYPE_F32) {
        float x;
        std::memcpy(&x, src, 4);
        return x;
    }
    uint16_t b;
    std::memcpy(&b, src, 2);
    return dtype == KVC_DTYPE_F16 ? f16_to_f32(b) : bf16_to_f32(b);
}

// The bit pattern of a quiet NaN in the dtype, for poisoning unused slots.
inline void store_nan(uint32_t dtype, void* dst) {
    if (dtype == KVC_DTYPE_F32) {
        const uint32_t n = 0x7fc00000u;
        std::memcpy(dst, &n, 4);
    } else {
        const uint16_t n = dtype == KVC_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
        std::memcpy(dst, &n, 2);
    }
}

// n floats -> n stored elements (SIMD when simd is true and the CPU has it; same bits either way).
void store_row(const float* src, uint32_t dtype, void* dst, uint32_t n, bool simd);
// n stored elements -> n floats.
void load_row(const void* src, uint32_t dtype, float* dst, uint32_t n, bool simd);

} // namespace kvc::opt
