// The quantized cache dtypes for host and device code alike: fp8 E4M3FN / E5M2 with a scale, int8 per token per KV
// head (f32 or f16 scale), llama.cpp's q8_0. The CUDA engine's append and attention kernels call these, and
// tests/cuda/test_cuda_quant_host.cpp runs the very same functions on the CPU, bitwise against kvc::ref (the
// contract: reference/include/kvcheck/reference/quantize.hpp, docs/quantized.md) and against the CPU engine's own
// quantizers (optimized/src/quantize.cpp). No intrinsics and no rounding-mode dependence beyond IEEE round to
// nearest even, which both sides run in (the CUDA sources are compiled without fast math, so / is IEEE division and
// no denormal is flushed).
//
// A stored row (kv_layout.h) is its head_dim one-byte codes, then its scales (scale bytes, little-endian, possibly
// unaligned: always read and written byte by byte): none for fp8 (its scale is the config's, per layer and KV head),
// one f32 or f16 for int8, head_dim / 32 f16 for q8_0.
#pragma once

#include "kvcheck/optimized/dtype_math.hpp"

#include <stdint.h>
#if !defined(__CUDACC__)
#include <math.h>
#endif

namespace kvc::opt::math {

enum : uint32_t { kDtypeFp8E4M3 = 3, kDtypeFp8E5M2 = 4, kDtypeInt8Token = 5, kDtypeQ8_0 = 6 }; // = kvc_dtype
constexpr uint32_t kQ8Block = 32;                 // values per q8_0 scale
constexpr float kFltMin = 1.17549435082228750797e-38f; // FLT_MIN: the smallest normal f32

KVC_HOST_DEVICE inline bool is_fp8(uint32_t dtype) { return dtype == kDtypeFp8E4M3 || dtype == kDtypeFp8E5M2; }
KVC_HOST_DEVICE inline bool is_quantized(uint32_t dtype) { return dtype >= kDtypeFp8E4M3 && dtype <= kDtypeQ8_0; }

// Scale bytes stored in a row after its codes (kv_layout.h scale_bytes).
KVC_HOST_DEVICE inline uint32_t row_scale_bytes(uint32_t dtype, uint32_t head_dim, bool f16_scale) {
    if (dtype == kDtypeInt8Token) return f16_scale ? 2u : 4u;
    if (dtype == kDtypeQ8_0) return 2u * (head_dim / kQ8Block);
    return 0u;
}
// Bytes of one row's scales as read_kv_scales returns them: fp8 one f32, otherwise what the row stores.
KVC_HOST_DEVICE inline uint32_t read_scale_bytes(uint32_t dtype, uint32_t head_dim, bool f16_scale) {
    return is_fp8(dtype) ? 4u : row_scale_bytes(dtype, head_dim, f16_scale);
}

// ---- fp8 ----
// On the f32 bits of |x|: NaN stays NaN (sign kept); at or above max finite (infinity too) saturates (SATFINITE);
// below the smallest normal, adding 2^k whose f32 ulp is the format's subnormal quantum rounds |x| to that quantum
// (nearest even, in the FPU) and the ulps above 2^k are the code; normal: rebias, round the dropped mantissa bits to
// nearest even (half an ulp minus one plus the kept LSB; a carry into the exponent is the next code).
struct Fp8Codec {
    uint32_t mant_bits, bias, max_bits, min_normal;
    float sub_add;
    uint8_t max_code, nan_code;
};
KVC_HOST_DEVICE inline Fp8Codec fp8_codec(uint32_t dtype) {
    if (dtype == kDtypeFp8E4M3) return Fp8Codec{3u, 7u, 0x43e00000u, 0x3c800000u, 16384.0f, 0x7e, 0x7f};
    return Fp8Codec{2u, 15u, 0x47600000u, 0x38800000u, 128.0f, 0x7b, 0x7e};
}

KVC_HOST_DEVICE inline uint8_t fp8_encode(float x, uint32_t dtype) {
    const Fp8Codec c = fp8_codec(dtype);
    uint32_t u = bits_of(x);
    const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return static_cast<uint8_t>(sign | c.nan_code);
    if (u >= c.max_bits) return static_cast<uint8_t>(sign | c.max_code);
    if (u < c.min_normal) {
        const float f = float_of(u) + c.sub_add;
        return static_cast<uint8_t>(sign | static_cast<uint8_t>(bits_of(f) - bits_of(c.sub_add)));
    }
    const uint32_t drop = 23u - c.mant_bits;
    const uint32_t odd = (u >> drop) & 1u;
    u -= (127u - c.bias) << 23;
    u += ((1u << (drop - 1u)) - 1u) + odd;
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(u >> drop));
}

// Exact. E5M2 is the high byte of an f16; E4M3FN's fields placed in an f16 give its value times 2^-8 (subnormals
// included), and only its NaN magnitude 0x7f needs the f16 NaN exponent.
KVC_HOST_DEVICE inline float fp8_decode(uint8_t code, uint32_t dtype) {
    if (dtype == kDtypeFp8E5M2) return f16_bits_to_f32(static_cast<uint16_t>(code << 8));
    uint16_t h = static_cast<uint16_t>(((code & 0x80u) << 8) | ((code & 0x7fu) << 7));
    if ((code & 0x7fu) == 0x7fu) h = static_cast<uint16_t>(h | 0x7c00u);
    return f16_bits_to_f32(h) * 256.0f;
}

// code = encode(x / scale), x / scale rounded to f32 first (never x * (1 / scale)).
KVC_HOST_DEVICE inline uint8_t fp8_code(float x, float scale, uint32_t dtype) { return fp8_encode(x / scale, dtype); }

// ---- int8 per token per KV head, and q8_0 ----

KVC_HOST_DEVICE inline float abs_of(float x) { return float_of(bits_of(x) & 0x7fffffffu); }
KVC_HOST_DEVICE inline bool finite(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }

// max |x| over n finite values (exact: the order does not matter).
KVC_HOST_DEVICE inline float absmax(const float* x, uint32_t n) {
    float m = 0.0f;
    for (uint32_t i = 0; i < n; ++i) {
        const float a = abs_of(x[i]);
        if (a > m) m = a;
    }
    return m;
}

// int8: the kept scale absmax / 127 (f32), rounded to f16 when the cache keeps it so.
KVC_HOST_DEVICE inline float int8_scale(float amax, bool f16_scale) {
    const float s = amax / 127.0f;
    return f16_scale ? f16_bits_to_f32(f32_to_f16_bits(s)) : s;
}

// round_half_even(x / scale) clamped to [-127, 127]; a kept scale of 0 gives 0 (rintf rounds ties to even in the
// default rounding mode, on the host and the device; a subnormal scale can take |x / scale| past 127).
KVC_HOST_DEVICE inline int8_t int8_code(float x, float scale) {
    if (scale == 0.0f) return 0;
    float q = rintf(x / scale);
    if (q > 127.0f) q = 127.0f;
    if (q < -127.0f) q = -127.0f;
    return static_cast<int8_t>(q);
}

// q8_0, ggml's quantize_row_q8_0_ref: d = amax / 127 in f32; below the smallest normal f32 the block stores d = 0
// and codes 0 (ggml's codes are undefined there, its f16 d is 0 anyway).
KVC_HOST_DEVICE inline float q8_0_d(float amax) {
    const float d = amax / 127.0f;
    return d < kFltMin ? 0.0f : d;
}
// id = 1 / d (f32), 0 for d = 0.
KVC_HOST_DEVICE inline float q8_0_id(float d) { return d == 0.0f ? 0.0f : 1.0f / d; }
// roundf(x * id): the product with the f32 reciprocal of the f32 d, rounded half away from zero.
KVC_HOST_DEVICE inline int8_t q8_0_code(float x, float id) {
    if (id == 0.0f) return 0;
    return static_cast<int8_t>(roundf(x * id));
}

// ---- scale bytes: little-endian, byte by byte (a row's scales need not be aligned) ----

KVC_HOST_DEVICE inline void put_u32(uint8_t* dst, uint32_t u) {
    for (uint32_t i = 0; i < 4; ++i) dst[i] = static_cast<uint8_t>(u >> (8 * i));
}
KVC_HOST_DEVICE inline uint32_t get_u32(const uint8_t* src) {
    return static_cast<uint32_t>(src[0]) | (static_cast<uint32_t>(src[1]) << 8) | (static_cast<uint32_t>(src[2]) << 16) |
           (static_cast<uint32_t>(src[3]) << 24);
}
KVC_HOST_DEVICE inline void put_f16(uint8_t* dst, float x) {
    const uint16_t b = f32_to_f16_bits(x);
    dst[0] = static_cast<uint8_t>(b & 0xffu);
    dst[1] = static_cast<uint8_t>(b >> 8);
}
KVC_HOST_DEVICE inline float get_f16(const uint8_t* src) {
    return f16_bits_to_f32(static_cast<uint16_t>(src[0] | (src[1] << 8)));
}
// The int8 scale of a row (its stored f32 or f16).
KVC_HOST_DEVICE inline void put_int8_scale(uint8_t* dst, float scale, bool f16_scale) {
    if (f16_scale) put_f16(dst, scale);
    else put_u32(dst, bits_of(scale));
}
KVC_HOST_DEVICE inline float get_int8_scale(const uint8_t* src, bool f16_scale) {
    return f16_scale ? get_f16(src) : float_of(get_u32(src));
}

// ---- whole rows (serial; the kernels split the same steps over threads) ----

// Why a row x [head_dim] cannot be stored: 0 it can; 1 a non-finite value (int8 and q8_0 store finite values only);
// 2 its int8 f16 scale absmax / 127 overflows f16. fp8 stores anything (saturation; NaN stays NaN).
KVC_HOST_DEVICE inline int unquantizable(const float* x, uint32_t dtype, uint32_t head_dim, bool f16_scale) {
    if (dtype != kDtypeInt8Token && dtype != kDtypeQ8_0) return 0;
    for (uint32_t i = 0; i < head_dim; ++i)
        if (!finite(x[i])) return 1;
    if (dtype == kDtypeInt8Token && f16_scale && !finite(int8_scale(absmax(x, head_dim), true))) return 2;
    return 0;
}

// x [head_dim] -> the row's codes and scales at dst. fp8_scale: the scale of the row's (layer, KV head), fp8 only.
KVC_HOST_DEVICE inline void quantize_row(const float* x, uint32_t dtype, uint32_t head_dim, bool f16_scale,
                                         float fp8_scale, uint8_t* dst) {
    if (is_fp8(dtype)) {
        for (uint32_t i = 0; i < head_dim; ++i) dst[i] = fp8_code(x[i], fp8_scale, dtype);
    } else if (dtype == kDtypeInt8Token) {
        const float scale = int8_scale(absmax(x, head_dim), f16_scale);
        for (uint32_t i = 0; i < head_dim; ++i) dst[i] = static_cast<uint8_t>(int8_code(x[i], scale));
        put_int8_scale(dst + head_dim, scale, f16_scale);
    } else {
        for (uint32_t b = 0; b < head_dim / kQ8Block; ++b) {
            const float d = q8_0_d(absmax(x + b * kQ8Block, kQ8Block)), id = q8_0_id(d);
            put_f16(dst + head_dim + 2 * b, d);
            for (uint32_t j = b * kQ8Block; j < (b + 1) * kQ8Block; ++j)
                dst[j] = static_cast<uint8_t>(q8_0_code(x[j], id));
        }
    }
}

// The scale element `dim` of a stored row is multiplied by: fp8 fp8_scale, int8 the row's, q8_0 its block's d.
KVC_HOST_DEVICE inline float elem_scale(const uint8_t* row, uint32_t dtype, uint32_t head_dim, bool f16_scale,
                                        float fp8_scale, uint32_t dim) {
    if (is_fp8(dtype)) return fp8_scale;
    if (dtype == kDtypeInt8Token) return get_int8_scale(row + head_dim, f16_scale);
    return get_f16(row + head_dim + 2 * (dim / kQ8Block));
}
// One code times its scale, rounded once in f32: what the reference's dequantizers give.
KVC_HOST_DEVICE inline float dequantize_code(uint8_t code, uint32_t dtype, float scale) {
    if (is_fp8(dtype)) return fp8_decode(code, dtype) * scale;
    return static_cast<float>(static_cast<int8_t>(code)) * scale;
}
KVC_HOST_DEVICE inline float dequantize_elem(const uint8_t* row, uint32_t dtype, uint32_t head_dim, bool f16_scale,
                                             float fp8_scale, uint32_t dim) {
    return dequantize_code(row[dim], dtype, elem_scale(row, dtype, head_dim, f16_scale, fp8_scale, dim));
}

// 16 fp8 codes (four 32-bit words, the code at the lower address in the lower byte) times scale, in address order.
// The attention kernel stages fp8 rows of whole 16-byte pieces this way.
KVC_HOST_DEVICE inline void widen_fp8_words(const uint32_t w[4], uint32_t dtype, float scale, float* out) {
    for (uint32_t i = 0; i < 4; ++i)
        for (uint32_t b = 0; b < 4; ++b)
            out[4 * i + b] = dequantize_code(static_cast<uint8_t>(w[i] >> (8 * b)), dtype, scale);
}

} // namespace kvc::opt::math
