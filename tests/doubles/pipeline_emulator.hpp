// Attention of one query row over n stored rows, computed the way a real kernel with a given rounding pipeline and
// a given summation order computes it. The tolerance tests use it to prove, in both directions, that the bound of a
// declared pipeline holds for every correct order (forward, reverse, online softmax that re-rounds its accumulator at
// every new maximum, split-KV partials merged, eager normalized probabilities) and that a pipeline claiming more
// precision than its arithmetic has fails. The softmax denominator is summed in f32, as in every kernel seen. Header-only, no dependency beyond abi.h and the reference's dtype helpers,
// so the plugin double (pipeline_cache.cpp) and the in-process tests share one emulation.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/reference/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kvc::emu {

// Which order (and which algorithm) sums the rows.
enum class Order {
    TwoPassForward, // max, then exp and sums first to last
    TwoPassReverse, // the same, last to first (and dot products last to first)
    OnlineForward,  // online softmax: accumulator rescaled and re-rounded at every new maximum
    OnlineReverse,
    SplitKV,        // online partials over chunks of `split` rows, merged at the end
    Eager           // normalized probabilities rounded, then summed (no final division)
};
constexpr Order kAllOrders[] = {Order::TwoPassForward, Order::TwoPassReverse, Order::OnlineForward,
                                Order::OnlineReverse,  Order::SplitKV,        Order::Eager};
inline const char* order_name(Order o) {
    switch (o) {
    case Order::TwoPassForward: return "two-pass forward";
    case Order::TwoPassReverse: return "two-pass reverse";
    case Order::OnlineForward: return "online forward";
    case Order::OnlineReverse: return "online reverse";
    case Order::SplitKV: return "split-KV";
    case Order::Eager: return "eager";
    }
    return "?";
}

// The stages' dtypes (kvc_round values) as the emulated kernel rounds them.
struct Stages {
    uint32_t q = KVC_ROUND_F32, rope = KVC_ROUND_F32, scores = KVC_ROUND_F32, probs = KVC_ROUND_F32,
             accum = KVC_ROUND_F32, output = KVC_ROUND_F32;
};

inline uint32_t stage_dtype(uint32_t r, uint32_t cache_dtype) {
    switch (r) {
    case KVC_ROUND_F16: return KVC_DTYPE_F16;
    case KVC_ROUND_BF16: return KVC_DTYPE_BF16;
    case KVC_ROUND_CACHE: return cache_dtype;
    default: return KVC_DTYPE_F32;
    }
}

struct Row {
    uint32_t d = 4, dtype = KVC_DTYPE_F32, rope = KVC_ROPE_NONE;
    float scale = 0.5f, theta = 10000.0f;
    uint32_t pos = 0;            // the query's position
    const float* q = nullptr;    // [d] as given (unrotated)
    const float* k = nullptr;    // [n] rows of stride ld: keys as stored (rotated, rounded)
    const float* v = nullptr;
    size_t ld = 0;
    uint32_t n = 0;
};

// out: [d]. `split` is the chunk size of SplitKV.
inline void attend(const Row& r, const Stages& st, Order order, float* out, uint32_t split = 64) {
    const uint32_t d = r.d, n = r.n;
    const auto R = [&](uint32_t stage, float x) { return ref::round_to_dtype(x, stage_dtype(stage, r.dtype)); };
    // q: rounded, then rotated in the RoPE stage's dtype with f32 angles
    std::vector<float> q(r.q, r.q + d);
    if (st.q != KVC_ROUND_F32)
        for (float& x : q) x = R(st.q, x);
    if (r.rope != KVC_ROPE_NONE) {
        const uint32_t half = d / 2;
        for (uint32_t j = 0; j < half; ++j) {
            const float inv = std::pow(r.theta, -2.0f * static_cast<float>(j) / static_cast<float>(d));
            const float angle = static_cast<float>(r.pos) * inv;
            const float c = R(st.rope, std::cos(angle)), s = R(st.rope, std::sin(angle));
            const uint32_t a = r.rope == KVC_ROPE_NEOX ? j : 2 * j, b = r.rope == KVC_ROPE_NEOX ? j + half : 2 * j + 1;
            const float xa = q[a], xb = q[b];
            q[a] = R(st.rope, R(st.rope, xa * c) - R(st.rope, xb * s));
            q[b] = R(st.rope, R(st.rope, xa * s) + R(st.rope, xb * c));
        }
    }
    const bool reverse = order == Order::TwoPassReverse || order == Order::OnlineReverse;
    std::vector<float> s(n);
    for (uint32_t j = 0; j < n; ++j) {
        float dot = 0.f;
        if (reverse)
            for (uint32_t x = d; x-- > 0;) dot += q[x] * r.k[j * r.ld + x];
        else
            for (uint32_t x = 0; x < d; ++x) dot += q[x] * r.k[j * r.ld + x];
        s[j] = R(st.scores, dot * r.scale);
    }
    const auto RA = [&](float x) { return R(st.accum, x); };
    std::vector<float> acc(d, 0.f);
    // online softmax over rows [from, to) in the given direction: (max, denominator, accumulator)
    const auto online = [&](uint32_t from, uint32_t to, bool rev, float& m, float& l, std::vector<float>& a) {
        m = -INFINITY;
        l = 0.f;
        a.assign(d, 0.f);
        for (uint32_t t = from; t < to; ++t) {
            const uint32_t j = rev ? to - 1 - (t - from) : t;
            if (s[j] > m) {
                const float f = m == -INFINITY ? 0.f : std::exp(m - s[j]);
                for (float& x : a) x = RA(x * f);
                l = l * f;
                m = s[j];
            }
            const float p = R(st.probs, std::exp(s[j] - m));
            for (uint32_t x = 0; x < d; ++x) a[x] = RA(a[x] + p * r.v[j * r.ld + x]);
            l = l + p;
        }
    };
    switch (order) {
    case Order::TwoPassForward:
    case Order::TwoPassReverse: {
        float m = -INFINITY;
        for (float x : s) m = std::max(m, x);
        float l = 0.f;
        for (uint32_t t = 0; t < n; ++t) {
            const uint32_t j = reverse ? n - 1 - t : t;
            const float p = R(st.probs, std::exp(s[j] - m));
            l = l + p;
            for (uint32_t x = 0; x < d; ++x) acc[x] = RA(acc[x] + p * r.v[j * r.ld + x]);
        }
        for (uint32_t x = 0; x < d; ++x) out[x] = R(st.output, acc[x] / l);
        return;
    }
    case Order::OnlineForward:
    case Order::OnlineReverse: {
        float m, l;
        online(0, n, reverse, m, l, acc);
        for (uint32_t x = 0; x < d; ++x) out[x] = R(st.output, acc[x] / l);
        return;
    }
    case Order::SplitKV: {
        const uint32_t c = std::max(split, 1u);
        std::vector<float> ms, ls;
        std::vector<std::vector<float>> parts;
        for (uint32_t from = 0; from < n; from += c) {
            float m, l;
            std::vector<float> a;
            online(from, std::min(n, from + c), false, m, l, a);
            ms.push_back(m);
            ls.push_back(l);
            parts.push_back(std::move(a));
        }
        float M = -INFINITY;
        for (float m : ms) M = std::max(M, m);
        float l = 0.f;
        for (size_t i = 0; i < parts.size(); ++i) {
            const float f = std::exp(ms[i] - M);
            l = l + ls[i] * f;
            for (uint32_t x = 0; x < d; ++x) acc[x] = RA(acc[x] + RA(parts[i][x] * f));
        }
        for (uint32_t x = 0; x < d; ++x) out[x] = R(st.output, acc[x] / l);
        return;
    }
    case Order::Eager: {
        float m = -INFINITY;
        for (float x : s) m = std::max(m, x);
        float l = 0.f;
        for (uint32_t j = 0; j < n; ++j) l += std::exp(s[j] - m);
        for (uint32_t j = 0; j < n; ++j) {
            const float p = R(st.probs, std::exp(s[j] - m) / l);
            for (uint32_t x = 0; x < d; ++x) acc[x] = RA(acc[x] + p * r.v[j * r.ld + x]);
        }
        for (uint32_t x = 0; x < d; ++x) out[x] = R(st.output, acc[x]);
        return;
    }
    }
}

} // namespace kvc::emu
