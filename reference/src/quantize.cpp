// Quantized KV-cache formats: the contract is in quantize.hpp. Plain code: one function per rule, all arithmetic
// in the precision the contract names.
#include "kvcheck/reference/quantize.hpp"

#include "kvcheck/reference/dtype.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace kvc::ref {
namespace {

// What differs between the two fp8 formats. Positive codes are ordered like their values, so code = (biased
// exponent << mant_bits) | mantissa field, and the subnormals (biased exponent 0) sit below the normals.
struct Fp8Spec {
    int mant_bits;    // 3 (E4M3FN), 2 (E5M2)
    int bias;         // 7, 15
    uint8_t max_code; // largest finite magnitude: 0x7e (448), 0x7b (57344)
    uint8_t nan_code; // the NaN we write, before the sign: 0x7f, 0x7e (quiet)
    bool has_inf;     // E5M2: 0x7c is infinity
};

constexpr Fp8Spec kE4M3FN{3, 7, 0x7e, 0x7f, false};
constexpr Fp8Spec kE5M2{2, 15, 0x7b, 0x7e, true};

const Fp8Spec& spec(Fp8 format) { return format == Fp8::E4M3FN ? kE4M3FN : kE5M2; }

bool is_nan_magnitude(uint8_t mag, const Fp8Spec& s) {
    if (s.has_inf) return mag > 0x7c;   // E5M2: exponent 11111, mantissa != 0
    return mag == 0x7f;                 // E4M3FN: S.1111.111 only
}

// Value of a code without its sign bit (0 <= mag <= max_code).
double magnitude_value(uint8_t mag, const Fp8Spec& s) {
    const int biased = mag >> s.mant_bits;
    const int frac = mag & ((1 << s.mant_bits) - 1);
    if (biased == 0) return std::ldexp(frac, 1 - s.bias - s.mant_bits); // subnormal: 0.frac * 2^(1 - bias)
    return std::ldexp((1 << s.mant_bits) + frac, biased - s.bias - s.mant_bits); // 1.frac * 2^(biased - bias)
}

float decode(uint8_t code, const Fp8Spec& s) {
    const bool negative = (code & 0x80) != 0;
    const uint8_t mag = code & 0x7f;
    const double sign = negative ? -1.0 : 1.0;
    if (is_nan_magnitude(mag, s)) return std::copysign(std::numeric_limits<float>::quiet_NaN(), sign);
    if (s.has_inf && mag == 0x7c) return std::copysign(std::numeric_limits<float>::infinity(), sign);
    return static_cast<float>(std::copysign(magnitude_value(mag, s), sign)); // exact: at most 4 significant bits
}

// Rounds |x| once, ties to even. Works in double, where x is exact and the scaling below by a power of two is too.
uint8_t encode(float x, const Fp8Spec& s) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return sign | s.nan_code;
    const double a = std::fabs(static_cast<double>(x));
    // Saturation: everything at or above max finite (infinity too) becomes max finite. Between max and the next
    // would-be code the nearest value is max or a non-finite code, and SATFINITE maps both to max.
    if (a >= magnitude_value(s.max_code, s)) return sign | s.max_code;
    if (a == 0.0) return sign;
    // The fp8 values in a's binade [2^e, 2^(e+1)) are multiples of quantum = 2^(e - mant_bits). The subnormals
    // share the quantum of the smallest normal binade, so e is clamped to 1 - bias.
    const int min_exp = 1 - s.bias;
    const int e = std::max(std::ilogb(a), min_exp);
    const double quantum = std::ldexp(1.0, e - s.mant_bits);
    const int n = static_cast<int>(round_half_even(a / quantum)); // 0 <= n <= 2^(mant_bits + 1)
    // Code of n * quantum: ((e - min_exp) << mant_bits) + n. For e = min_exp and n < 2^mant_bits that is the
    // subnormal n; otherwise n = 2^mant_bits + mantissa adds the implicit 1 as one more exponent step, and a
    // rounding carry (n = 2^(mant_bits + 1)) lands on the first code of the next binade.
    const int code = ((e - min_exp) << s.mant_bits) + n;
    return sign | static_cast<uint8_t>(code);
}

void require(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("kvc::ref quantize: " + what);
}

void require_finite_scale(float scale) {
    require(std::isfinite(scale) && scale > 0.0f, "an fp8 scale must be finite and > 0, got " + std::to_string(scale));
}

float absmax(const float* x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; ++i) {
        require(std::isfinite(x[i]), "non-finite input at index " + std::to_string(i));
        m = std::max(m, std::fabs(x[i]));
    }
    return m;
}

} // namespace

double round_half_even(double v) {
    const double f = std::floor(v);
    const double r = v - f; // exact for |v| < 2^52
    if (r > 0.5) return f + 1.0;
    if (r < 0.5) return f;
    return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

// ---- fp8 ----

uint8_t encode_e4m3fn(float x) { return encode(x, kE4M3FN); }
float decode_e4m3fn(uint8_t code) { return decode(code, kE4M3FN); }
uint8_t encode_e5m2(float x) { return encode(x, kE5M2); }
float decode_e5m2(uint8_t code) { return decode(code, kE5M2); }
uint8_t encode_fp8(float x, Fp8 format) { return encode(x, spec(format)); }
float decode_fp8(uint8_t code, Fp8 format) { return decode(code, spec(format)); }
float fp8_max_finite(Fp8 format) { return decode(spec(format).max_code, spec(format)); }

// ---- fp8 with a scale ----

uint8_t encode_fp8_scaled(float x, float scale, Fp8 format) {
    require_finite_scale(scale);
    const float scaled = x / scale; // rounded to f32 here, then encoded: two roundings, both declared
    return encode_fp8(scaled, format);
}

float decode_fp8_scaled(uint8_t code, float scale, Fp8 format) {
    require_finite_scale(scale);
    const float value = decode_fp8(code, format);
    return value * scale;
}

void quantize_fp8_row(const float* x, int n, float scale, Fp8 format, uint8_t* codes) {
    for (int i = 0; i < n; ++i) codes[i] = encode_fp8_scaled(x[i], scale, format);
}

void dequantize_fp8_row(const uint8_t* codes, int n, float scale, Fp8 format, float* out) {
    for (int i = 0; i < n; ++i) out[i] = decode_fp8_scaled(codes[i], scale, format);
}

// ---- int8 symmetric, per token per KV head ----

float quantize_int8_row(const float* x, int head_dim, ScaleDtype scale_dtype, int8_t* codes) {
    const float scale_f32 = absmax(x, head_dim) / 127.0f;
    float scale = scale_f32;
    if (scale_dtype == ScaleDtype::F16) {
        scale = f16_value(f16_bits(scale_f32)); // the scale the cache stores, so the codes agree with it
        require(std::isfinite(scale), "int8 row scale " + std::to_string(scale_f32) + " overflows f16");
    }
    for (int i = 0; i < head_dim; ++i) {
        if (scale == 0.0f) { // absmax 0, or so small that its scale rounded to 0
            codes[i] = 0;
            continue;
        }
        const float q = x[i] / scale; // f32, as the contract says
        // A subnormal scale is inexact, so q can pass 127: clamp after rounding.
        const double r = std::clamp(round_half_even(q), -127.0, 127.0);
        codes[i] = static_cast<int8_t>(r);
    }
    return scale;
}

void dequantize_int8_row(const int8_t* codes, int head_dim, float scale, float* out) {
    for (int i = 0; i < head_dim; ++i) out[i] = static_cast<float>(codes[i]) * scale;
}

void quantize_int8_token(const float* x, int n_kv_heads, int head_dim, ScaleDtype scale_dtype, int8_t* codes,
                         float* scales) {
    for (int h = 0; h < n_kv_heads; ++h)
        scales[h] = quantize_int8_row(x + h * head_dim, head_dim, scale_dtype, codes + h * head_dim);
}

// ---- q8_0 (llama.cpp) ----

void quantize_row_q8_0(const float* x, int k, BlockQ8_0* y, Q8_0Rounding rounding) {
    require(k % QK8_0 == 0, "q8_0 needs a multiple of 32 values, got " + std::to_string(k));
    for (int b = 0; b < k / QK8_0; ++b) {
        const float* xb = x + b * QK8_0;
        const float amax = absmax(xb, QK8_0);
        const float d = amax / 127.0f;
        if (d < FLT_MIN) { // tiny block: ggml's codes are undefined here and its f16 d is 0 (see the header)
            y[b].d = f16_bits(0.0f);
            std::fill(y[b].qs, y[b].qs + QK8_0, int8_t{0});
            continue;
        }
        // ggml: id = d ? 1.0f/d : 0.0f, with the f32 d; its x86 kernel: 127.f / amax
        const float id = rounding == Q8_0Rounding::RecipAmaxEven ? 127.0f / amax : 1.0f / d;
        y[b].d = f16_bits(d);
        for (int j = 0; j < QK8_0; ++j) {
            const float p = xb[j] * id;
            // roundf: half away from zero; the SIMD kernels: half to even. |q| <= 127 as d is normal.
            const double q = rounding == Q8_0Rounding::GgmlRef ? std::round(p) : round_half_even(p);
            y[b].qs[j] = static_cast<int8_t>(std::clamp(q, -127.0, 127.0));
        }
    }
}

void dequantize_row_q8_0(const BlockQ8_0* y, int k, float* out) {
    require(k % QK8_0 == 0, "q8_0 needs a multiple of 32 values, got " + std::to_string(k));
    for (int b = 0; b < k / QK8_0; ++b) {
        const float d = f16_value(y[b].d);
        for (int j = 0; j < QK8_0; ++j) out[b * QK8_0 + j] = static_cast<float>(y[b].qs[j]) * d;
    }
}

} // namespace kvc::ref
