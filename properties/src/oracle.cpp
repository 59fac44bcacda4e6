#include "kvcheck/properties/oracle.hpp"

#include "kvcheck/reference/attention.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/rope.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvc::prop {

namespace {

ref::Rope as_rope(uint32_t r) { return static_cast<ref::Rope>(r); }

// Naive attention of one query row over rows 0..last, the way a plain loop in float would do it.
//   q: [d] (already rotated, already rounded for the 16-bit class), k, v: rows of one KV head, stride `ld`
void naive_row(const float* q, const float* k, const float* v, uint32_t last, uint32_t d, size_t ld, float scale,
               bool accumulate_in_cache_dtype, uint32_t dtype, float* out) {
    std::vector<float> s(last + 1);
    float m = -INFINITY;
    for (uint32_t j = 0; j <= last; ++j) {
        float dot = 0.f;
        for (uint32_t x = 0; x < d; ++x) dot += q[x] * k[j * ld + x];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
    }
    float sum = 0.f;
    for (uint32_t j = 0; j <= last; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
    }
    for (uint32_t x = 0; x < d; ++x) {
        float acc = 0.f;
        for (uint32_t j = 0; j <= last; ++j) {
            acc += s[j] * v[j * ld + x];
            if (accumulate_in_cache_dtype) acc = ref::round_to_dtype(acc, dtype);
        }
        out[x] = acc / sum;
    }
}

// RoPE as a plain float implementation does it: frequency, angle, cos and sin all in float. The naive baselines use
// it, so the tolerance allows the error any ordinary f32 rotation makes (it grows with the position).
void rope_in_float(float* x, uint32_t d, uint32_t pos, uint32_t variant, float theta) {
    if (variant == KVC_ROPE_NONE) return;
    const uint32_t half = d / 2;
    for (uint32_t j = 0; j < half; ++j) {
        const float inv_freq = std::pow(theta, -2.0f * static_cast<float>(j) / static_cast<float>(d));
        const float angle = static_cast<float>(pos) * inv_freq;
        const float c = std::cos(angle), s = std::sin(angle);
        const uint32_t a = variant == KVC_ROPE_NEOX ? j : 2 * j, b = variant == KVC_ROPE_NEOX ? j + half : 2 * j + 1;
        const float xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xa * s + xb * c;
    }
}

} // namespace

double stored_key_bound(const CaseConfig& cfg, const float* k_in, uint32_t pos, uint32_t element) {
    const double eps = cfg.dtype == KVC_DTYPE_F32 ? 0x1p-23 : cfg.dtype == KVC_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
    const double tiny = cfg.dtype == KVC_DTYPE_F16 ? 0x1p-24 : 0x1p-126;
    const uint32_t d = cfg.head_dim, e = element % d, base = element - e;
    const uint32_t partner = cfg.rope == KVC_ROPE_NEOX ? (e < d / 2 ? e + d / 2 : e - d / 2) : (e ^ 1u);
    const double m = std::fabs(k_in[base + e]) + std::fabs(k_in[base + partner]);
    return 16.0 * 0x1p-24 * m * (2.0 + pos) + 2.0 * eps * m + tiny;
}

void expected_stored_key(const CaseConfig& cfg, const float* k_in, uint32_t pos, float* out) {
    const uint32_t d = cfg.head_dim;
    std::vector<long double> row(d);
    for (uint32_t h = 0; h < cfg.n_kv_heads; ++h) {
        for (uint32_t x = 0; x < d; ++x) row[x] = k_in[h * d + x];
        ref::apply_rope(row.data(), static_cast<int>(d), pos, as_rope(cfg.rope), cfg.rope_theta);
        for (uint32_t x = 0; x < d; ++x) out[h * d + x] = ref::round_to_dtype(static_cast<float>(row[x]), cfg.dtype);
    }
}

Expected expect_outputs(const CaseConfig& cfg, const float* q, uint32_t n_new, const std::vector<float>& k,
                        const std::vector<float>& v, uint32_t T, HeadMap map) {
    const uint32_t d = cfg.head_dim, Hq = cfg.n_q_heads, Hkv = cfg.n_kv_heads;
    const size_t ld = static_cast<size_t>(Hkv) * d;
    const uint32_t before = T - n_new;
    const long double scale = cfg.scale();
    Expected e;
    e.n_new = n_new;
    e.oracle.assign(static_cast<size_t>(n_new) * Hq * d, 0.0L);
    e.naive_f32.assign(e.oracle.size(), 0.f);
    e.naive_cache_accum.assign(e.oracle.size(), 0.f);
    e.v_scale.assign(static_cast<size_t>(n_new) * Hq, 0.f);

    for (uint32_t h = 0; h < Hq; ++h) {
        const uint32_t g = map == HeadMap::Repeat ? h / cfg.group() : h % Hkv;
        // the KV head's history: [T x d] in long double (exact widening of the stored values)
        ref::Mat<long double> K(T, d), V(T, d);
        for (uint32_t t = 0; t < T; ++t)
            for (uint32_t x = 0; x < d; ++x) {
                K(t, x) = k[t * ld + g * d + x];
                V(t, x) = v[t * ld + g * d + x];
            }
        // queries of this head, rotated by their positions: [n_new x d]
        ref::Mat<long double> Q(n_new, d);
        std::vector<float> qf(d), q16(d);
        for (uint32_t i = 0; i < n_new; ++i) {
            const float* qi = q + (static_cast<size_t>(i) * Hq + h) * d;
            std::vector<long double> row(qi, qi + d);
            ref::apply_rope(row.data(), static_cast<int>(d), before + i, as_rope(cfg.rope), cfg.rope_theta);
            for (uint32_t x = 0; x < d; ++x) Q(i, x) = row[x];

            // the naive computations rotate in float, as a plain implementation would
            qf.assign(qi, qi + d);
            rope_in_float(qf.data(), d, before + i, cfg.rope, cfg.rope_theta);
            for (uint32_t x = 0; x < d; ++x) q16[x] = ref::round_to_dtype(qf[x], cfg.dtype);
            const size_t o = (static_cast<size_t>(i) * Hq + h) * d;
            naive_row(qf.data(), k.data() + g * d, v.data() + g * d, before + i, d, ld, cfg.scale(), false, cfg.dtype,
                      e.naive_f32.data() + o);
            naive_row(q16.data(), k.data() + g * d, v.data() + g * d, before + i, d, ld, cfg.scale(),
                      cfg.dtype != KVC_DTYPE_F32, cfg.dtype, e.naive_cache_accum.data() + o);
            float vs = 1e-30f;
            for (uint32_t t = 0; t <= before + i; ++t)
                for (uint32_t x = 0; x < d; ++x) vs = std::max(vs, std::fabs(v[t * ld + g * d + x]));
            e.v_scale[static_cast<size_t>(i) * Hq + h] = vs;
        }
        const auto r = ref::attend_head<long double>(Q, K, V, scale);
        for (uint32_t i = 0; i < n_new; ++i)
            for (uint32_t x = 0; x < d; ++x) e.oracle[(static_cast<size_t>(i) * Hq + h) * d + x] = r.out(i, x);
    }
    return e;
}

} // namespace kvc::prop
