// Names the mechanism behind a quantized row stored unlike the reference: each hypothesis is a bug class real
// quantized caches have shipped, recomputed from the row's own input, and named only when it reproduces what was stored exactly.
#include "kvcheck/abi.hpp"
#include "kvcheck/properties/quant_rows.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <vector>

namespace kvc::prop {

namespace {

ref::Fp8 fp8_format(uint32_t dtype) { return dtype == KVC_DTYPE_FP8_E5M2 ? ref::Fp8::E5M2 : ref::Fp8::E4M3FN; }

std::string hex(uint8_t c) {
    char b[8];
    std::snprintf(b, sizeof b, "0x%02x", c);
    return b;
}

float scale_value(const CaseConfig& cfg, const uint8_t* scales, uint32_t block) {
    if (cfg.cache_dtype == KVC_DTYPE_Q8_0 ||
        (cfg.cache_dtype == KVC_DTYPE_INT8_TOKEN && cfg.int8_scale_dtype == KVC_DTYPE_F16)) {
        uint16_t u;
        std::memcpy(&u, scales + 2 * block, 2);
        return ref::f16_value(u);
    }
    float f;
    std::memcpy(&f, scales, 4);
    return f;
}

// Whether every code of the row equals code(i) for i in 0 .. n-1.
bool codes_are(const uint8_t* got, uint32_t n, const std::function<uint8_t(uint32_t)>& code) {
    for (uint32_t i = 0; i < n; ++i)
        if (got[i] != code(i)) return false;
    return true;
}

uint8_t int8_byte(double v) { return static_cast<uint8_t>(static_cast<int8_t>(std::clamp(v, -127.0, 127.0))); }

// Every hypothesis that reproduces the row; several may (a wrong head's scale can equal V's), and all are named.
std::string fp8_mechanism(const QuantEvidence& e, uint32_t i) {
    const CaseConfig& c = *e.cfg;
    const ref::Fp8 f = fp8_format(c.cache_dtype);
    const uint32_t d = c.head_dim;
    const float s = c.fp8_scale(e.which, e.layer, e.kv_head);
    const float want = ref::decode_fp8(e.want_codes[i], f), got = ref::decode_fp8(e.got_codes[i], f);
    const float max = ref::fp8_max_finite(f);
    if (!std::isfinite(got) && std::fabs(want) == max)
        return std::string(std::isnan(got) ? "NaN" : "an infinity") + " where the reference saturates to " +
               (want < 0 ? "-" : "+") + (f == ref::Fp8::E4M3FN ? "448" : "57344") +
               ": a non-saturating conversion (use the SATFINITE form)";
    const auto enc = [&](float v) { return ref::encode_fp8(v, f); };
    std::vector<std::string> found;
    const auto rows_as = [&](const std::function<float(float)>& y) {
        return codes_are(e.got_codes, d, [&](uint32_t k) { return enc(y(e.x[k])); });
    };
    if (s != 1.0f && rows_as([&](float x) { return x / s / s; }))
        found.push_back("the scale applied twice (codes = fp8(x / scale / scale))");
    if (s != 1.0f && rows_as([&](float x) { return x; })) found.push_back("the scale not applied (codes = fp8(x))");
    if (s != 1.0f && rows_as([&](float x) { return x * s; }))
        found.push_back("the scale multiplied instead of divided (codes = fp8(x * scale))");
    const float other = c.fp8_scale(3 - e.which, e.layer, e.kv_head);
    if (other != s && rows_as([&](float x) { return x / other; }))
        found.push_back(e.which == 2 ? "k_scale used for V" : "v_scale used for K");
    if (c.kv_scale_mode == KVC_SCALE_KV_HEAD)
        for (uint32_t g = 0; g < c.n_kv_heads; ++g) {
            const float sg = c.fp8_scale(e.which, e.layer, g);
            if (g != e.kv_head && sg != s && rows_as([&](float x) { return x / sg; }))
                found.push_back("KV head " + std::to_string(e.kv_head) + " encoded with the scale of KV head " +
                                std::to_string(g) + ": the per-head scale indexed by query head instead of KV head");
        }
    if (s != 1.0f && rows_as([&](float x) { return x * (1.0f / s); }))
        found.push_back("x multiplied by a precomputed 1 / scale instead of divided by the scale (a different rounding)");
    if (f == ref::Fp8::E4M3FN && (rows_as([&](float x) { return 2.0f * (x / s); }) ||
                                  (std::isfinite(got) && want != 0 && (got == 2 * want || 2 * got == want))))
        found.push_back("the E4M3FNUZ bias (decode(stored) = " + std::string(got == 2 * want ? "2 x" : "1/2 x") +
                        " the reference: exponent bias 8 of E4M3FNUZ used for E4M3FN, bias 7)");
    std::string all;
    for (const std::string& w : found) all += (all.empty() ? "" : "; or ") + w;
    return all;
}

std::string int8_mechanism(const QuantEvidence& e) {
    const CaseConfig& c = *e.cfg;
    const float s = scale_value(c, e.want_scales, 0);
    if (s == 0) return "";
    const auto by = [&](double (*r)(double)) {
        return codes_are(e.got_codes, c.head_dim, [&](uint32_t k) { return int8_byte(r(static_cast<double>(e.x[k] / s))); });
    };
    if (by([](double v) { return std::trunc(v); })) return "int8 rounded toward zero (truncation) instead of to nearest even";
    if (by([](double v) { return std::round(v); })) return "int8 rounded half away from zero instead of half to even";
    if (by([](double v) { return std::floor(v); })) return "int8 rounded down (floor) instead of to nearest even";
    return "";
}

// ggml's codes of block b made with the f32 scale d (id = 1 / d).
uint8_t q8_code(float x, float d) { return int8_byte(std::round(x * (d != 0 ? 1.0f / d : 0.0f))); }

std::string q8_0_mechanism(const QuantEvidence& e, uint32_t block) {
    const CaseConfig& c = *e.cfg;
    const uint32_t nb = c.head_dim / ref::QK8_0;
    std::vector<float> d32(nb);
    for (uint32_t b = 0; b < nb; ++b) {
        float amax = 0;
        for (uint32_t k = 0; k < ref::QK8_0; ++k) amax = std::max(amax, std::fabs(e.x[b * ref::QK8_0 + k]));
        d32[b] = amax / 127.0f;
    }
    const uint8_t* got = e.got_codes + block * ref::QK8_0;
    const float* x = e.x + block * ref::QK8_0;
    uint16_t got_d, want_d;
    std::memcpy(&got_d, e.got_scales + 2 * block, 2);
    std::memcpy(&want_d, e.want_scales + 2 * block, 2);
    for (uint32_t b = 0; b < nb; ++b) {
        if (b == block || d32[b] == d32[block]) continue;
        const bool d_from_b = got_d == ref::f16_bits(d32[b]) && got_d != want_d;
        if (d_from_b || codes_are(got, ref::QK8_0, [&](uint32_t k) { return q8_code(x[k], d32[b]); }))
            return "q8_0 block " + std::to_string(block) + " quantized with the scale of block " + std::to_string(b) +
                   ": a block scale from the wrong block";
    }
    if (got_d == want_d) {
        // the roundings ggml's kernels use, other than the declared one (the one the expected codes have)
        struct Kernel {
            ref::Q8_0Rounding rounding;
            uint32_t flag;
            const char* text;
        };
        static const Kernel kernels[] = {
            {ref::Q8_0Rounding::RecipAmaxEven, KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN,
             "q8_0 codes rounded as ggml's x86 kernel does (x * 127/amax, ties to even): declare "
             "KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN"},
            {ref::Q8_0Rounding::RecipDEven, KVC_PIPELINE_Q8_0_RECIP_D_EVEN,
             "q8_0 codes rounded as ggml's ARM NEON kernel does (x * 1/d, ties to even): declare "
             "KVC_PIPELINE_Q8_0_RECIP_D_EVEN"},
            {ref::Q8_0Rounding::GgmlRef, 0,
             "q8_0 codes rounded as ggml's reference quantize_row_q8_0_ref does (roundf(x * 1/d), half away from "
             "zero), not as the declared kernel rounding: drop the KVC_PIPELINE_Q8_0_* flag"},
        };
        std::vector<ref::BlockQ8_0> mine(1);
        std::string kernel; // every rounding that reproduces the block (an exact tie alone fits x86 and NEON)
        for (const Kernel& k : kernels) {
            if (k.flag == c.q8_0_rounding) continue;
            ref::quantize_row_q8_0(x, ref::QK8_0, mine.data(), k.rounding);
            if (mine[0].d == got_d && codes_are(got, ref::QK8_0, [&](uint32_t i) {
                    return static_cast<uint8_t>(mine[0].qs[i]);
                }))
                kernel += (kernel.empty() ? "" : "; or ") + std::string(k.text);
        }
        if (!kernel.empty()) return kernel;
        const float dk = d32[block];
        if (dk != 0 && codes_are(got, ref::QK8_0, [&](uint32_t k) { return int8_byte(std::round(x[k] / dk)); }))
            return "codes from x / d instead of ggml's x * (1 / d)";
        const float d16 = ref::f16_value(want_d);
        if (d16 != dk && codes_are(got, ref::QK8_0, [&](uint32_t k) { return q8_code(x[k], d16); }))
            return "codes made with the f16-rounded d instead of ggml's f32 d";
        if (dk != 0 && codes_are(got, ref::QK8_0, [&](uint32_t k) {
                return int8_byte(std::trunc(static_cast<double>(x[k] * (1.0f / dk))));
            }))
            return "codes rounded toward zero (truncation) instead of ggml's roundf";
    }
    return "";
}

} // namespace

QuantFinding diagnose_quantized_row(const QuantEvidence& e) {
    const CaseConfig& c = *e.cfg;
    QuantFinding f;
    const uint32_t n_scales = scales_per_head_row(c.cache_dtype, c.head_dim);
    const size_t ss = scale_size(c.cache_dtype, c.int8_scale_dtype);
    bool found = false;
    for (uint32_t b = 0; b < n_scales && !found; ++b)
        if (std::memcmp(e.want_scales + b * ss, e.got_scales + b * ss, ss) != 0) {
            f.scale = true;
            f.index = b;
            f.expected = scale_value(c, e.want_scales, b);
            f.actual = scale_value(c, e.got_scales, b);
            found = true;
        }
    for (uint32_t i = 0; i < c.head_dim && !found; ++i)
        if (e.want_codes[i] != e.got_codes[i]) {
            f.index = i;
            found = true;
        }
    const bool fp8 = dtype_is_fp8(c.cache_dtype);
    std::ostringstream t;
    t.precision(9);
    if (f.scale) {
        t << "stored scale " << f.actual << " where the reference quantizer gives " << f.expected
          << (c.cache_dtype == KVC_DTYPE_Q8_0 ? " (block " + std::to_string(f.index) + ")" : std::string());
    } else {
        const uint8_t w = e.want_codes[f.index], g = e.got_codes[f.index];
        f.expected = fp8 ? w : static_cast<int8_t>(w);
        f.actual = fp8 ? g : static_cast<int8_t>(g);
        t << "stored code ";
        if (fp8) t << hex(g) << " where the reference quantizer gives " << hex(w);
        else t << f.actual << " where the reference quantizer gives " << f.expected;
    }
    const std::string why = fp8 ? fp8_mechanism(e, f.index)
                            : c.cache_dtype == KVC_DTYPE_INT8_TOKEN
                                ? int8_mechanism(e)
                                : q8_0_mechanism(e, f.scale ? f.index : f.index / ref::QK8_0);
    if (!why.empty()) t << ": " << why;
    f.text = t.str();
    return f;
}

} // namespace kvc::prop
