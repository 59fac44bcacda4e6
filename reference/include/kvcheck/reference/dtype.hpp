// Cache dtypes on the host: rounding a float to what an f16/bf16 cache stores, and the raw bits of those values.
// Eigen's half and bfloat16 round to nearest even and match CUDA's conversions bit for bit (NaN payloads aside).
#pragma once

#include "kvcheck/abi.h"

#include <Eigen/Core>

#include <cstdint>
#include <cstring>

namespace kvc::ref {

inline uint16_t f16_bits(float x) { return Eigen::numext::bit_cast<uint16_t>(Eigen::half(x)); }
inline uint16_t bf16_bits(float x) { return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(x)); }
inline float f16_value(uint16_t b) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(b)); }
inline float bf16_value(uint16_t b) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(b)); }

// x as a cache of this dtype stores it, widened back to float.
inline float round_to_dtype(float x, uint32_t dtype) {
    switch (dtype) {
    case KVC_DTYPE_F16: return f16_value(f16_bits(x));
    case KVC_DTYPE_BF16: return bf16_value(bf16_bits(x));
    default: return x;
    }
}

// Writes x in the dtype's storage format at dst (4 bytes for f32, 2 otherwise).
inline void store_dtype(float x, uint32_t dtype, void* dst) {
    if (dtype == KVC_DTYPE_F32) {
        std::memcpy(dst, &x, 4);
    } else {
        const uint16_t b = dtype == KVC_DTYPE_F16 ? f16_bits(x) : bf16_bits(x);
        std::memcpy(dst, &b, 2);
    }
}

// Reads one stored element back as float.
inline float load_dtype(const void* src, uint32_t dtype) {
    if (dtype == KVC_DTYPE_F32) {
        float x;
        std::memcpy(&x, src, 4);
        return x;
    }
    uint16_t b;
    std::memcpy(&b, src, 2);
    return dtype == KVC_DTYPE_F16 ? f16_value(b) : bf16_value(b);
}

} // namespace kvc::ref
