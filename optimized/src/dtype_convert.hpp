// Cache dtypes: float32 <-> the stored element (f32, IEEE binary16, bfloat16). Rounding is to nearest even, the
// same as Eigen::half / Eigen::bfloat16 (and CUDA), so the bits the engine stores equal kvc::ref::store_dtype's.
// NaN stays NaN (quiet); infinities stay infinities.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/optimized/dtype_math.hpp"

#include <cstdint>
#include <cstring>

namespace kvc::opt {

// The bit-level conversions are dtype_math.hpp's, the one definition the CUDA kernels compile too; these are their
// names in the CPU engine.
inline uint32_t float_bits(float x) { return math::bits_of(x); }
inline float bits_float(uint32_t u) { return math::float_of(u); }
inline uint16_t f32_to_f16(float f) { return math::f32_to_f16_bits(f); } // the F16C path gives the same bits
inline float f16_to_f32(uint16_t h) { return math::f16_bits_to_f32(h); }
inline uint16_t f32_to_bf16(float f) { return math::f32_to_bf16_bits(f); }
inline float bf16_to_f32(uint16_t b) { return math::bf16_bits_to_f32(b); }

// One element, through memcpy: no alignment or aliasing is assumed of the bytes at dst or src.
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
