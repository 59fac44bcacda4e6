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

// The element paired with y by the rotation (NeoX: y +- d/2; GPT-J: y ^ 1) and the pair's frequency index, for y
// inside the rotated dims of a head of d dims.
uint32_t rope_partner(uint32_t rope, uint32_t d, uint32_t y) {
    return rope == KVC_ROPE_NEOX ? (y < d / 2 ? y + d / 2 : y - d / 2) : (y ^ 1u);
}
uint32_t rope_pair(uint32_t rope, uint32_t d, uint32_t y) { return rope == KVC_ROPE_NEOX ? y % (d / 2) : y / 2; }

// The same for head dim y of a case (y < head_dim, in_rope(y)): the rotated dims form a head of their own of
// rope_len() dims starting at rope_begin().
uint32_t head_partner(const CaseConfig& cfg, uint32_t y) {
    const uint32_t b = cfg.rope_begin();
    return b + rope_partner(cfg.rope, cfg.rope_len(), y - b);
}
uint32_t head_pair(const CaseConfig& cfg, uint32_t y) { return rope_pair(cfg.rope, cfg.rope_len(), y - cfg.rope_begin()); }

} // namespace

namespace {

double pair_inv_freq(uint32_t j, uint32_t head_dim, float theta) {
    return std::pow(static_cast<double>(theta), -2.0 * j / static_cast<double>(head_dim));
}

// inv_freq = theta^(-2j/d) by powf (a few ulp), the product pos * inv_freq rounded, cos and sin of the rounded
// angle (an ulp each): 8 units of 2^-24 relative to the angle, plus two absolute.
double angle_error(uint32_t pos, double inv_freq) { return 0x1p-24 * (8.0 * pos * inv_freq + 2.0); }

} // namespace

double rope_angle_error(uint32_t pos, uint32_t j, uint32_t head_dim, float theta) {
    return angle_error(pos, pair_inv_freq(j, head_dim, theta));
}

namespace {

// |x_a| + |x_b| of the pair key element `element` rotates with, and what an ordinary f32 rotation of that pair
// loses at `pos` (angle pos * theta^(-2j/d), cos and sin in float): 16 * 2^-24 * m * (2 + pos).
struct PairError {
    double m, f32_rotation;
};
// An element outside the RoPE range is stored as given: no rotation error.
PairError pair_error(const CaseConfig& cfg, const float* k_in, uint32_t pos, uint32_t element) {
    const uint32_t d = cfg.head_dim, e = element % d, base = element - e;
    if (!cfg.in_rope(e)) return {std::fabs(k_in[element]), 0.0};
    const double m = std::fabs(k_in[base + e]) + std::fabs(k_in[base + head_partner(cfg, e)]);
    return {m, 16.0 * 0x1p-24 * m * (2.0 + pos)};
}

} // namespace

double stored_key_bound(const CaseConfig& cfg, const float* k_in, uint32_t pos, uint32_t element) {
    const double eps = cfg.cache_dtype == KVC_DTYPE_F32 ? 0x1p-23 : cfg.cache_dtype == KVC_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
    const double tiny = cfg.cache_dtype == KVC_DTYPE_F16 ? 0x1p-24 : 0x1p-126;
    const PairError p = pair_error(cfg, k_in, pos, element);
    return p.f32_rotation + 2.0 * eps * p.m + tiny;
}

bool stored_key_acceptable(const CaseConfig& cfg, uint32_t rope_stage, const float* k_in, uint32_t pos,
                           uint32_t element, float rotated, float got) {
    if (!std::isfinite(got) || !cfg.in_rope(element % cfg.head_dim)) return false; // unrotated dims: bitwise
    const bool f32_rotation =
        rope_stage == KVC_ROUND_F32 || (rope_stage == KVC_ROUND_CACHE && cfg.cache_dtype == KVC_DTYPE_F32);
    if (!f32_rotation) {
        // two units of the stage's dtype where it is wider than the cache's: a rotation in f16 stored in f32 is
        // off by f16 units, not f32 ones
        const double u_stage = rope_stage == KVC_ROUND_F16 ? 0x1p-10 : rope_stage == KVC_ROUND_BF16 ? 0x1p-7 : 0.0;
        const double u_cache = cfg.cache_dtype == KVC_DTYPE_F32 ? 0x1p-23 : cfg.cache_dtype == KVC_DTYPE_F16 ? 0x1p-10
                                                                                                       : 0x1p-7;
        const double wider = 2.0 * std::max(0.0, u_stage - u_cache) * pair_error(cfg, k_in, pos, element).m;
        return std::fabs(static_cast<double>(got) - ref::round_to_dtype(rotated, cfg.cache_dtype)) <=
               stored_key_bound(cfg, k_in, pos, element) + wider;
    }
    // the f32 rotation's error, plus the oracle's own rounding to float and the casts below (2^-24 each)
    const double err =
        pair_error(cfg, k_in, pos, element).f32_rotation + 3.0 * 0x1p-24 * std::fabs(rotated) + 0x1p-149;
    const float lo = ref::round_to_dtype(static_cast<float>(rotated - err), cfg.cache_dtype);
    const float hi = ref::round_to_dtype(static_cast<float>(rotated + err), cfg.cache_dtype);
    return lo <= got && got <= hi;
}

KeyInterval rotated_key_interval(const CaseConfig& cfg, uint32_t rope_stage, const float* k_in, uint32_t pos,
                                 uint32_t element, float rotated) {
    const PairError p = pair_error(cfg, k_in, pos, element);
    // a rotation declared in 16 bits (cos, sin or the products rounded) moves the result by two of its units
    const double u16 = rope_stage == KVC_ROUND_F16 ? 0x1p-10 : rope_stage == KVC_ROUND_BF16 ? 0x1p-7 : 0.0;
    const double err = p.f32_rotation + 2.0 * u16 * p.m + 3.0 * 0x1p-24 * std::fabs(rotated) + 0x1p-149;
    return {static_cast<float>(rotated - err), static_cast<float>(rotated + err)};
}

void expected_rotated_key(const CaseConfig& cfg, const float* k_in, uint32_t pos, float* out) {
    const uint32_t d = cfg.head_dim;
    std::vector<long double> row(d);
    for (uint32_t h = 0; h < cfg.n_kv_heads; ++h) {
        for (uint32_t x = 0; x < d; ++x) row[x] = k_in[h * d + x];
        ref::apply_rope_range(row.data(), static_cast<int>(cfg.rope_begin()), static_cast<int>(cfg.rope_len()), pos,
                              as_rope(cfg.rope), cfg.rope_theta);
        for (uint32_t x = 0; x < d; ++x) out[h * d + x] = static_cast<float>(row[x]);
    }
}

Expected expect_outputs(const CaseConfig& cfg, const float* q, uint32_t n_new, const std::vector<float>& k,
                        const std::vector<float>& v, uint32_t T, HeadMap map, uint32_t oracle_rotated_keys,
                        uint32_t layer) {
    const uint32_t d = cfg.head_dim, dv = cfg.dv(), Hq = cfg.n_q_heads, Hkv = cfg.n_kv_heads, dr = cfg.rope_len();
    const size_t ld = static_cast<size_t>(Hkv) * d, ldv = static_cast<size_t>(Hkv) * dv;
    const uint32_t before = T - n_new;
    const long double scale = cfg.scale();
    const bool rope = cfg.rope != KVC_ROPE_NONE;
    Expected e;
    e.n_new = n_new;
    const size_t n_out = static_cast<size_t>(n_new) * Hq * dv;
    e.oracle.assign(n_out, 0.0L);
    for (auto* s : {&e.s_qk, &e.s_rope, &e.s_angle, &e.s_score, &e.s_diff, &e.s_abs, &e.s_part}) s->assign(n_out, 0.0);
    e.v_scale.assign(static_cast<size_t>(n_new) * Hq, 0.f);
    const ref::Visibility vis{cfg.window(layer), cfg.n_sinks};
    e.visible.assign(n_new, 0);
    for (uint32_t i = 0; i < n_new; ++i)
        for (uint32_t j = 0; j <= before + i; ++j) e.visible[i] += vis.sees(before + i, j) ? 1u : 0u;

    std::vector<double> qa(d), qpair(d), qangle(d), s(T), w(T), Tqk(T), Trope(T), Tangle(T);
    // each rotated dim's pair frequency, once: the bound's inner loops ask for it per key
    std::vector<double> inv_freq(d, 0.0);
    for (uint32_t y = 0; y < d; ++y)
        if (rope && cfg.in_rope(y)) inv_freq[y] = pair_inv_freq(head_pair(cfg, y), dr, cfg.rope_theta);
    for (uint32_t h = 0; h < Hq; ++h) {
        const uint32_t g = map == HeadMap::Repeat ? h / cfg.group() : h % Hkv;
        // the KV head's history: [T x d] in long double (exact widening of the attended values)
        ref::Mat<long double> K(T, d), V(T, dv);
        for (uint32_t t = 0; t < T; ++t) {
            for (uint32_t x = 0; x < d; ++x) K(t, x) = k[t * ld + g * d + x];
            for (uint32_t x = 0; x < dv; ++x) V(t, x) = v[t * ldv + g * dv + x];
        }
        // queries of this head, rotated by their positions: [n_new x d]
        ref::Mat<long double> Q(n_new, d);
        for (uint32_t i = 0; i < n_new; ++i) {
            const float* qi = q + (static_cast<size_t>(i) * Hq + h) * d;
            std::vector<long double> row(qi, qi + d);
            ref::apply_rope_range(row.data(), static_cast<int>(cfg.rope_begin()), static_cast<int>(dr), before + i,
                                  as_rope(cfg.rope), cfg.rope_theta);
            for (uint32_t x = 0; x < d; ++x) Q(i, x) = row[x];
        }
        const auto r = ref::attend_head<long double>(Q, K, V, scale, vis);

        // sensitivities of each output element (oracle.hpp), in double: they size a bound, not a result
        for (uint32_t i = 0; i < n_new; ++i) {
            const float* qi = q + (static_cast<size_t>(i) * Hq + h) * d;
            const uint32_t n = before + i + 1, pos = before + i;
            for (uint32_t y = 0; y < d; ++y) {
                qa[y] = std::fabs(static_cast<double>(Q(i, y)));
                const bool rotated = rope && cfg.in_rope(y);
                qpair[y] = rotated ? std::fabs(qi[y]) + std::fabs(qi[head_partner(cfg, y)]) : 0.0;
                qangle[y] = rotated ? qpair[y] * angle_error(pos, inv_freq[y]) : 0.0;
            }
            double smax = -INFINITY, sabs = 0;
            for (uint32_t j = 0; j < n; ++j) {
                if (!vis.sees(pos, j)) continue; // outside the window: weight exactly 0 below
                double dot = 0, tq = 0, tr = 0, ta = 0;
                const bool oracle_key = rope && j + oracle_rotated_keys >= T;
                for (uint32_t y = 0; y < d; ++y) {
                    const double kj = k[j * ld + g * d + y];
                    dot += static_cast<double>(Q(i, y)) * kj;
                    tq += qa[y] * std::fabs(kj);
                    tr += qpair[y] * std::fabs(kj);
                    ta += qangle[y] * std::fabs(kj);
                    if (oracle_key && cfg.in_rope(y)) // rotated in f32 by the implementation: |k_a|+|k_b| <= sqrt2 (...)
                        ta += qa[y] * angle_error(j, inv_freq[y]) * 1.4142136 *
                              (std::fabs(kj) + std::fabs(k[j * ld + g * d + head_partner(cfg, y)]));
                }
                s[j] = static_cast<double>(scale) * dot;
                Tqk[j] = static_cast<double>(scale) * tq;
                Trope[j] = static_cast<double>(scale) * tr;
                Tangle[j] = static_cast<double>(scale) * ta;
                smax = std::max(smax, s[j]);
                sabs = std::max(sabs, std::fabs(s[j]));
            }
            double sum = 0;
            for (uint32_t j = 0; j < n; ++j) sum += (w[j] = vis.sees(pos, j) ? std::exp(s[j] - smax) : 0.0);
            for (uint32_t j = 0; j < n; ++j) w[j] /= sum;
            const size_t o = (static_cast<size_t>(i) * Hq + h) * dv;
            float vs = 1e-30f;
            for (uint32_t x = 0; x < dv; ++x) {
                const long double out = r.out(i, x);
                e.oracle[o + x] = out;
                double qk = 0, rp = 0, an = 0, sc = 0, df = 0, ab = 0, prefix = 0, part = 0;
                for (uint32_t j = 0; j < n; ++j) {
                    if (!vis.sees(pos, j)) continue;
                    const double vj = v[j * ldv + g * dv + x];
                    const double D = w[j] * std::fabs(vj - static_cast<double>(out));
                    qk += D * Tqk[j];
                    rp += D * Trope[j];
                    an += D * Tangle[j];
                    sc += D * (std::fabs(s[j]) + sabs);
                    df += D;
                    ab += w[j] * std::fabs(vj);
                    prefix += w[j] * vj;
                    part = std::max(part, std::fabs(prefix));
                    vs = std::max(vs, std::fabs(static_cast<float>(vj)));
                }
                e.s_qk[o + x] = qk;
                e.s_rope[o + x] = rp;
                e.s_angle[o + x] = an;
                e.s_score[o + x] = sc;
                e.s_diff[o + x] = df;
                e.s_abs[o + x] = ab;
                e.s_part[o + x] = part;
            }
            e.v_scale[static_cast<size_t>(i) * Hq + h] = vs;
        }
    }
    return e;
}

} // namespace kvc::prop
