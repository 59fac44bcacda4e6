#include "kvcheck/properties/quant_rows.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kvc::prop {

namespace {

ref::Fp8 fp8_format(uint32_t dtype) { return dtype == KVC_DTYPE_FP8_E5M2 ? ref::Fp8::E5M2 : ref::Fp8::E4M3FN; }

float load_f32(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
}
uint16_t load_u16(const uint8_t* p) {
    uint16_t u;
    std::memcpy(&u, p, 2);
    return u;
}

// The kept int8 scale of a row whose absmax is a: absmax / 127 in f32, then f16 when declared.
float int8_kept_scale(float a, uint32_t scale_dtype) {
    const float s = a / 127.0f;
    return scale_dtype == KVC_DTYPE_F16 ? ref::f16_value(ref::f16_bits(s)) : s;
}

// The smallest and the largest |x| over x in [lo, hi].
float min_abs(float lo, float hi) { return lo <= 0 && hi >= 0 ? 0.0f : std::min(std::fabs(lo), std::fabs(hi)); }
float max_abs(float lo, float hi) { return std::max(std::fabs(lo), std::fabs(hi)); }

int int8_code(double v) { return static_cast<int>(std::clamp(ref::round_half_even(v), -127.0, 127.0)); }

} // namespace

ref::Q8_0Rounding q8_0_rounding(uint32_t flag) {
    if (flag & KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN) return ref::Q8_0Rounding::RecipAmaxEven;
    if (flag & KVC_PIPELINE_Q8_0_RECIP_D_EVEN) return ref::Q8_0Rounding::RecipDEven;
    return ref::Q8_0Rounding::GgmlRef;
}

size_t scale_bytes_per_head_row(const CaseConfig& cfg) {
    return scales_per_head_row(cfg.cache_dtype, cfg.head_dim) * scale_size(cfg.cache_dtype, cfg.int8_scale_dtype);
}

void quantize_head_row(const CaseConfig& cfg, float fp8_scale, const float* x, uint8_t* codes, uint8_t* scales) {
    const int d = static_cast<int>(cfg.head_dim);
    switch (cfg.cache_dtype) {
    case KVC_DTYPE_FP8_E4M3:
    case KVC_DTYPE_FP8_E5M2:
        ref::quantize_fp8_row(x, d, fp8_scale, fp8_format(cfg.cache_dtype), codes);
        std::memcpy(scales, &fp8_scale, 4);
        return;
    case KVC_DTYPE_INT8_TOKEN: {
        const bool f16 = cfg.int8_scale_dtype == KVC_DTYPE_F16;
        const float s = ref::quantize_int8_row(x, d, f16 ? ref::ScaleDtype::F16 : ref::ScaleDtype::F32,
                                               reinterpret_cast<int8_t*>(codes));
        if (f16) {
            const uint16_t b = ref::f16_bits(s); // exact: s is an f16 value already
            std::memcpy(scales, &b, 2);
        } else {
            std::memcpy(scales, &s, 4);
        }
        return;
    }
    case KVC_DTYPE_Q8_0: {
        std::vector<ref::BlockQ8_0> blocks(cfg.head_dim / ref::QK8_0);
        ref::quantize_row_q8_0(x, d, blocks.data(), q8_0_rounding(cfg.q8_0_rounding));
        for (size_t b = 0; b < blocks.size(); ++b) {
            std::memcpy(codes + b * ref::QK8_0, blocks[b].qs, ref::QK8_0);
            std::memcpy(scales + 2 * b, &blocks[b].d, 2);
        }
        return;
    }
    }
}

void dequantize_head_row(const CaseConfig& cfg, const uint8_t* codes, const uint8_t* scales, float* out) {
    const int d = static_cast<int>(cfg.head_dim);
    switch (cfg.cache_dtype) {
    case KVC_DTYPE_FP8_E4M3:
    case KVC_DTYPE_FP8_E5M2:
        ref::dequantize_fp8_row(codes, d, load_f32(scales), fp8_format(cfg.cache_dtype), out);
        return;
    case KVC_DTYPE_INT8_TOKEN: {
        const float s = cfg.int8_scale_dtype == KVC_DTYPE_F16 ? ref::f16_value(load_u16(scales)) : load_f32(scales);
        ref::dequantize_int8_row(reinterpret_cast<const int8_t*>(codes), d, s, out);
        return;
    }
    case KVC_DTYPE_Q8_0: {
        std::vector<ref::BlockQ8_0> blocks(cfg.head_dim / ref::QK8_0);
        for (size_t b = 0; b < blocks.size(); ++b) {
            std::memcpy(blocks[b].qs, codes + b * ref::QK8_0, ref::QK8_0);
            blocks[b].d = load_u16(scales + 2 * b);
        }
        ref::dequantize_row_q8_0(blocks.data(), d, out);
        return;
    }
    }
}

bool quantized_row_equal(const CaseConfig& cfg, const uint8_t* want_codes, const uint8_t* want_scales,
                         const uint8_t* got_codes, const uint8_t* got_scales) {
    const size_t sb = scale_bytes_per_head_row(cfg);
    if (std::memcmp(want_scales, got_scales, sb) != 0) return false;
    if (cfg.cache_dtype != KVC_DTYPE_Q8_0) return std::memcmp(want_codes, got_codes, cfg.head_dim) == 0;
    for (uint32_t b = 0; b < cfg.head_dim / ref::QK8_0; ++b) {
        if ((load_u16(want_scales + 2 * b) & 0x7fffu) == 0) continue; // d = 0: judged by value (all zero)
        if (std::memcmp(want_codes + b * ref::QK8_0, got_codes + b * ref::QK8_0, ref::QK8_0) != 0) return false;
    }
    return true;
}

bool quantized_row_acceptable(const CaseConfig& cfg, float fp8_scale, const float* lo, const float* hi,
                              const uint8_t* codes, const uint8_t* scales) {
    const uint32_t d = cfg.head_dim;
    if (dtype_is_fp8(cfg.cache_dtype)) {
        const ref::Fp8 f = fp8_format(cfg.cache_dtype);
        if (std::memcmp(scales, &fp8_scale, 4) != 0) return false;
        for (uint32_t i = 0; i < d; ++i) {
            const float got = ref::decode_fp8(codes[i], f);
            if (std::isnan(got)) return false;
            const float a = ref::decode_fp8(ref::encode_fp8_scaled(lo[i], fp8_scale, f), f);
            const float b = ref::decode_fp8(ref::encode_fp8_scaled(hi[i], fp8_scale, f), f);
            if (!(a <= got && got <= b)) return false;
            // -0 and +0 compare equal above: a zero code keeps the sign of x, which lo .. hi must allow
            if (got == 0 && (std::signbit(got) ? lo[i] > 0 : hi[i] < 0)) return false;
        }
        return true;
    }
    if (cfg.cache_dtype == KVC_DTYPE_INT8_TOKEN) {
        float a_lo = 0, a_hi = 0;
        for (uint32_t i = 0; i < d; ++i) {
            a_lo = std::max(a_lo, min_abs(lo[i], hi[i]));
            a_hi = std::max(a_hi, max_abs(lo[i], hi[i]));
        }
        const bool f16 = cfg.int8_scale_dtype == KVC_DTYPE_F16;
        const float s = f16 ? ref::f16_value(load_u16(scales)) : load_f32(scales);
        if (!(int8_kept_scale(a_lo, cfg.int8_scale_dtype) <= s && s <= int8_kept_scale(a_hi, cfg.int8_scale_dtype)))
            return false;
        const int8_t* q = reinterpret_cast<const int8_t*>(codes);
        for (uint32_t i = 0; i < d; ++i) {
            if (s == 0) {
                if (q[i] != 0) return false;
                continue;
            }
            const int c_lo = int8_code(static_cast<double>(lo[i] / s)), c_hi = int8_code(static_cast<double>(hi[i] / s));
            if (q[i] < c_lo || q[i] > c_hi) return false;
        }
        return true;
    }
    // q8_0, block by block
    for (uint32_t b = 0; b < d / ref::QK8_0; ++b) {
        const uint32_t o = b * ref::QK8_0;
        float a_lo = 0, a_hi = 0;
        for (uint32_t i = o; i < o + ref::QK8_0; ++i) {
            a_lo = std::max(a_lo, min_abs(lo[i], hi[i]));
            a_hi = std::max(a_hi, max_abs(lo[i], hi[i]));
        }
        const float d_lo = a_lo / 127.0f, d_hi = a_hi / 127.0f;
        const float got_d = ref::f16_value(load_u16(scales + 2 * b));
        if (!(ref::f16_value(ref::f16_bits(d_lo)) <= got_d && got_d <= ref::f16_value(ref::f16_bits(d_hi))))
            return false;
        if (got_d == 0) continue; // every value dequantizes to 0 whatever the codes
        // id = 1 / d for the f32 d the implementation computed, somewhere in [d_lo, d_hi]; or, for the x86 kernel,
        // id = 127 / amax for its amax in [a_lo, a_hi]
        const ref::Q8_0Rounding rounding = q8_0_rounding(cfg.q8_0_rounding);
        const bool x86 = rounding == ref::Q8_0Rounding::RecipAmaxEven;
        const float id_a = x86 ? (a_hi != 0 ? 127.0f / a_hi : 0.0f) : d_hi != 0 ? 1.0f / d_hi : 0.0f;
        const float id_b = x86 ? (a_lo != 0 ? 127.0f / a_lo : INFINITY) : d_lo != 0 ? 1.0f / d_lo : INFINITY;
        const auto round = [&](float p) {
            return rounding == ref::Q8_0Rounding::GgmlRef ? std::round(p)
                                                          : static_cast<float>(ref::round_half_even(p));
        };
        const int8_t* q = reinterpret_cast<const int8_t*>(codes + o);
        for (uint32_t i = 0; i < ref::QK8_0; ++i) {
            float c_min = 127, c_max = -127;
            for (float x : {lo[o + i], hi[o + i]})
                for (float id : {id_a, id_b}) {
                    const float p = std::isinf(id) ? (x > 0 ? 127.0f : x < 0 ? -127.0f : 0.0f) : x * id;
                    const float c = std::clamp(round(p), -127.0f, 127.0f);
                    c_min = std::min(c_min, c);
                    c_max = std::max(c_max, c);
                }
            if (q[i] < c_min || q[i] > c_max) return false;
        }
    }
    return true;
}

} // namespace kvc::prop
