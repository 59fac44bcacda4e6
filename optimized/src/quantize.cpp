// The engine's quantizers: bit manipulation on the f32 encoding, one rounding each where the contract has one.
#include "quantize.hpp"

#include "dtype_convert.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace kvc::opt {
namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu, kF32Inf = 0x7f800000u;

// The fp8 codec of one format, on the f32 bits of |x|:
//  - at or above max finite (infinity too): max finite (SATFINITE: the rounding of anything there is max or beyond);
//  - below the smallest normal: adding 2^k, whose f32 ulp is the format's subnormal quantum, rounds |x| to that
//    quantum in the FPU (nearest even), and the ulps above 2^k are the code;
//  - normal: rebias the exponent and round the dropped mantissa bits to nearest even by adding half an ulp minus
//    one plus the kept LSB; a carry moves into the exponent, which is the next code.
struct Fp8Codec {
    uint32_t mant_bits;    // 3, 2
    uint32_t bias;         // 7, 15
    uint32_t max_bits;     // f32 bits of max finite: 448, 57344
    uint32_t min_normal;   // f32 bits of the smallest normal: 2^-6, 2^-14
    float sub_add;         // 2^k with ulp = the subnormal quantum: 2^14 (2^-9), 2^7 (2^-16)
    uint8_t max_code, nan_code;
};
constexpr Fp8Codec kE4M3{3, 7, 0x43e00000u, 0x3c800000u, 16384.0f, 0x7e, 0x7f};
constexpr Fp8Codec kE5M2{2, 15, 0x47600000u, 0x38800000u, 128.0f, 0x7b, 0x7e};

inline uint8_t fp8_encode(float x, const Fp8Codec& c) {
    uint32_t u = float_bits(x);
    const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
    u &= kAbsMask;
    if (u > kF32Inf) return sign | c.nan_code;
    if (u >= c.max_bits) return sign | c.max_code;
    if (u < c.min_normal) {
        const float f = bits_float(u) + c.sub_add;
        return sign | static_cast<uint8_t>(float_bits(f) - float_bits(c.sub_add));
    }
    const uint32_t drop = 23 - c.mant_bits;
    const uint32_t odd = (u >> drop) & 1u;
    u -= (127u - c.bias) << 23;
    u += ((1u << (drop - 1)) - 1u) + odd;
    return sign | static_cast<uint8_t>(u >> drop);
}

inline void put_f16(uint8_t* dst, float x) {
    const uint16_t b = f32_to_f16(x);
    std::memcpy(dst, &b, 2);
}
inline float get_f16(const uint8_t* src) {
    uint16_t b;
    std::memcpy(&b, src, 2);
    return f16_to_f32(b);
}

float absmax(const float* x, uint32_t n) {
    float m = 0.0f;
    for (uint32_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
}

// int8: the kept scale (f16-rounded when kept so), from which the codes are made.
float int8_scale(const float* x, const QuantFormat& f) {
    const float s = absmax(x, f.head_dim) / 127.0f;
    return f.f16_scale ? f16_to_f32(f32_to_f16(s)) : s;
}

void quantize_int8(const float* x, const QuantFormat& f, uint8_t* dst) {
    const float scale = int8_scale(x, f);
    auto* codes = reinterpret_cast<int8_t*>(dst);
    for (uint32_t i = 0; i < f.head_dim; ++i) {
        // nearbyint rounds half to even in the default rounding mode; a subnormal scale can take |q| past 127
        const float q = scale == 0.0f ? 0.0f : std::nearbyint(x[i] / scale);
        codes[i] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
    if (f.f16_scale) put_f16(dst + f.head_dim, scale);
    else std::memcpy(dst + f.head_dim, &scale, 4);
}

// ggml's quantize_row_q8_0_ref, block by block: the codes from x * (1 / d) with the f32 d, rounded half away from
// zero, d stored in f16. A d below the smallest normal f32 stores d = 0 and codes 0 (ggml's codes are undefined
// there and its f16 d is 0 anyway).
void quantize_q8_0(const float* x, const QuantFormat& f, uint8_t* dst) {
    auto* codes = reinterpret_cast<int8_t*>(dst);
    uint8_t* scales = dst + f.head_dim;
    for (uint32_t b = 0; b < f.head_dim / kQ8Block; ++b) {
        const float* xb = x + b * kQ8Block;
        const float d = absmax(xb, kQ8Block) / 127.0f;
        if (d < FLT_MIN) {
            put_f16(scales + 2 * b, 0.0f);
            std::fill(codes + b * kQ8Block, codes + (b + 1) * kQ8Block, int8_t{0});
            continue;
        }
        const float id = 1.0f / d;
        put_f16(scales + 2 * b, d);
        for (uint32_t j = 0; j < kQ8Block; ++j) codes[b * kQ8Block + j] = static_cast<int8_t>(std::round(xb[j] * id));
    }
}

} // namespace

uint32_t row_scale_bytes(const QuantFormat& f) {
    if (f.dtype == KVC_DTYPE_INT8_TOKEN) return f.f16_scale ? 2 : 4;
    if (f.dtype == KVC_DTYPE_Q8_0) return 2 * (f.head_dim / kQ8Block);
    return 0;
}

uint32_t row_scales_bytes(const QuantFormat& f) {
    return f.dtype == KVC_DTYPE_FP8_E4M3 || f.dtype == KVC_DTYPE_FP8_E5M2 ? 4 : row_scale_bytes(f);
}

uint8_t fp8_e4m3_encode(float x) { return fp8_encode(x, kE4M3); }
uint8_t fp8_e5m2_encode(float x) { return fp8_encode(x, kE5M2); }

// E5M2 is the high byte of an f16. E4M3FN's fields, placed in an f16 (exponent bias 15 instead of 7), give its
// value times 2^-8, subnormals included; only its one NaN magnitude (0x7f) needs the f16 NaN exponent.
float fp8_e5m2_decode(uint8_t code) { return f16_to_f32(static_cast<uint16_t>(code << 8)); }
float fp8_e4m3_decode(uint8_t code) {
    uint16_t h = static_cast<uint16_t>(((code & 0x80u) << 8) | ((code & 0x7fu) << 7));
    if ((code & 0x7f) == 0x7f) h |= 0x7c00;
    return f16_to_f32(h) * 256.0f;
}

bool fp8_scales_fuse(uint32_t dtype, float softmax_scale, const float* k_scales, const float* v_scales, uint64_t n) {
    if (dtype != KVC_DTYPE_FP8_E4M3 && dtype != KVC_DTYPE_FP8_E5M2) return false;
    for (uint64_t i = 0; i < n; ++i)
        if (!std::isnormal(fp8_fused_k_scale(dtype, softmax_scale, k_scales[i])) ||
            !std::isnormal(fp8_fused_v_scale(dtype, v_scales[i])))
            return false;
    return true;
}

const char* unquantizable(const float* x, const QuantFormat& f) {
    if (f.dtype != KVC_DTYPE_INT8_TOKEN && f.dtype != KVC_DTYPE_Q8_0) return nullptr;
    for (uint32_t i = 0; i < f.head_dim; ++i)
        if (!std::isfinite(x[i])) return "a non-finite value (int8 and q8_0 store finite values only)";
    if (f.dtype == KVC_DTYPE_INT8_TOKEN && f.f16_scale && !std::isfinite(int8_scale(x, f)))
        return "its int8 scale absmax / 127 overflows f16";
    return nullptr;
}

void quantize_row(const float* x, const QuantFormat& f, float fp8_scale, uint8_t* dst) {
    switch (f.dtype) {
    case KVC_DTYPE_FP8_E4M3:
        for (uint32_t i = 0; i < f.head_dim; ++i) dst[i] = fp8_e4m3_encode(x[i] / fp8_scale);
        break;
    case KVC_DTYPE_FP8_E5M2:
        for (uint32_t i = 0; i < f.head_dim; ++i) dst[i] = fp8_e5m2_encode(x[i] / fp8_scale);
        break;
    case KVC_DTYPE_INT8_TOKEN: quantize_int8(x, f, dst); break;
    default: quantize_q8_0(x, f, dst); break;
    }
}

void dequantize_row(const uint8_t* src, const QuantFormat& f, float fp8_scale, float* out) {
    const auto* codes = reinterpret_cast<const int8_t*>(src);
    switch (f.dtype) {
    case KVC_DTYPE_FP8_E4M3:
        for (uint32_t i = 0; i < f.head_dim; ++i) out[i] = fp8_e4m3_decode(src[i]) * fp8_scale;
        break;
    case KVC_DTYPE_FP8_E5M2:
        for (uint32_t i = 0; i < f.head_dim; ++i) out[i] = fp8_e5m2_decode(src[i]) * fp8_scale;
        break;
    case KVC_DTYPE_INT8_TOKEN: {
        float scale;
        if (f.f16_scale) scale = get_f16(src + f.head_dim);
        else std::memcpy(&scale, src + f.head_dim, 4);
        for (uint32_t i = 0; i < f.head_dim; ++i) out[i] = static_cast<float>(codes[i]) * scale;
        break;
    }
    default:
        for (uint32_t i = 0; i < f.head_dim; ++i)
            out[i] = static_cast<float>(codes[i]) * get_f16(src + f.head_dim + 2 * (i / kQ8Block));
        break;
    }
}

void row_scales(const uint8_t* src, const QuantFormat& f, float fp8_scale, uint8_t* out) {
    if (f.dtype == KVC_DTYPE_FP8_E4M3 || f.dtype == KVC_DTYPE_FP8_E5M2) std::memcpy(out, &fp8_scale, 4);
    else std::memcpy(out, src + f.head_dim, row_scale_bytes(f));
}

} // namespace kvc::opt
