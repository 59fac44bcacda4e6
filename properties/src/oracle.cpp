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

} // namespace

int64_t ulp_distance(const uint8_t* a, const uint8_t* b, uint32_t dtype) {
    // map sign-magnitude bit patterns onto a line where neighbouring values differ by one
    auto ordered = [dtype](const uint8_t* p) -> int64_t {
        if (dtype == KVC_DTYPE_F32) {
            uint32_t x;
            std::memcpy(&x, p, 4);
            const int64_t mag = x & 0x7FFFFFFFu;
            return (x & 0x80000000u) ? -mag : mag;
        }
        uint16_t x;
        std::memcpy(&x, p, 2);
        const int64_t mag = x & 0x7FFF;
        return (x & 0x8000) ? -mag : mag;
    };
    const int64_t d = ordered(a) - ordered(b);
    return d < 0 ? -d : d;
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
            ref::apply_rope(qf.data(), static_cast<int>(d), before + i, as_rope(cfg.rope), cfg.rope_theta);
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
