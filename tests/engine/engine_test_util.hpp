// Shared by the engine tests: seeds (printed, and taken back from KVCHECK_SEED), random tensors, configs, and the
// reference oracle for one call.
#pragma once

#include "kvcheck/abi.hpp"
#include "kvcheck/optimized/engine.hpp"
#include "kvcheck/reference/attention.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/rope.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace kvc::test {

// The seed of a random test: KVCHECK_SEED when set, else `fallback` (fixed, so CI is repeatable). Printed either
// way, so any failure can be replayed with KVCHECK_SEED=<printed value>.
inline uint64_t test_seed(uint64_t fallback) {
    uint64_t seed = fallback;
    if (const char* env = std::getenv("KVCHECK_SEED")) seed = std::strtoull(env, nullptr, 0);
    std::cout << "[ seed     ] KVCHECK_SEED=" << seed << "\n";
    ::testing::Test::RecordProperty("seed", std::to_string(seed));
    return seed;
}

struct Rng {
    explicit Rng(uint64_t seed) : gen(seed) {}
    std::vector<float> normal(size_t n, float sigma = 1.0f) {
        std::normal_distribution<float> dist(0.0f, sigma);
        std::vector<float> x(n);
        for (float& e : x) e = dist(gen);
        return x;
    }
    uint32_t below(uint32_t n) { return static_cast<uint32_t>(gen() % n); }
    std::mt19937_64 gen;
};

inline kvc_config make_config(uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t dtype,
                              uint32_t block, uint32_t rope = KVC_ROPE_NONE, uint32_t n_layers = 1,
                              uint32_t max_seqs = 8, uint32_t max_tokens = 1u << 20) {
    return kvc::make_config(n_layers, n_q_heads, n_kv_heads, head_dim, dtype, max_seqs, max_tokens, rope, block);
}

inline std::unique_ptr<opt::Engine> make_engine(const kvc_config& c, const opt::EngineOptions& o = {}) {
    kvc_status s = KVC_OK;
    std::string err;
    auto e = opt::Engine::create(c, o, &s, &err);
    EXPECT_TRUE(e) << err;
    return e;
}

inline size_t esize(uint32_t dtype) { return dtype == KVC_DTYPE_F32 ? 4 : 2; }

// The whole history of one (sequence, layer) as the reference sees it: K rotated by its position (long double) and
// rounded to the cache dtype, V rounded to the cache dtype, exactly what the cache should hold. [len][H_kv * d].
struct History {
    explicit History(const kvc_config& config) : c(config) {}
    void add(const std::vector<float>& k, const std::vector<float>& v) {
        const size_t d = c.head_dim, row = static_cast<size_t>(c.n_kv_heads) * d, n = k.size() / row;
        std::vector<long double> kr(d);
        for (size_t t = 0; t < n; ++t, ++len)
            for (size_t h = 0; h < c.n_kv_heads; ++h) {
                for (size_t i = 0; i < d; ++i) kr[i] = k[t * row + h * d + i];
                ref::apply_rope(kr.data(), static_cast<int>(d), len, static_cast<ref::Rope>(c.rope), c.rope_theta);
                for (size_t i = 0; i < d; ++i) {
                    K.push_back(ref::round_to_dtype(static_cast<float>(kr[i]), c.cache_dtype));
                    V.push_back(ref::round_to_dtype(v[t * row + h * d + i], c.cache_dtype));
                }
            }
    }
    kvc_config c;
    std::vector<long double> K, V;
    long len = 0;
};

// What kvc::ref::attend_heads<long double> says the outputs of the last n_q tokens of h are, for queries q
// ([n_q][H_q][d], unrotated; rotated here by their positions in long double). Causal, bottom-right aligned.
inline std::vector<double> oracle(const History& h, const std::vector<float>& q) {
    using LD = long double;
    const kvc_config& c = h.c;
    const int d = static_cast<int>(c.head_dim), Hq = static_cast<int>(c.n_q_heads), Hkv = static_cast<int>(c.n_kv_heads);
    const long n_q = static_cast<long>(q.size() / (static_cast<size_t>(Hq) * d));
    ref::Mat<LD> K(h.len, Hkv * d), V(h.len, Hkv * d), Q(n_q, Hq * d);
    std::copy(h.K.begin(), h.K.end(), K.data());
    std::copy(h.V.begin(), h.V.end(), V.data());
    for (long t = 0; t < n_q; ++t)
        for (int hh = 0; hh < Hq; ++hh) {
            LD* row = &Q(t, hh * d);
            for (int i = 0; i < d; ++i) row[i] = q[(static_cast<size_t>(t) * Hq + hh) * d + i];
            ref::apply_rope(row, d, h.len - n_q + t, static_cast<ref::Rope>(c.rope), c.rope_theta);
        }
    const ref::Mat<LD> out = ref::attend_heads<LD>(Q, K, V, Hq, Hkv, d, static_cast<LD>(c.scale));
    return std::vector<double>(out.data(), out.data() + out.size());
}

// The tolerance the engine promises against that oracle (KVC_PRECISION_F32, docs/engine.md): for unit-scale
// inputs, |engine - oracle| <= kAbsTol + kRelTol * |oracle| elementwise.
constexpr double kAbsTol = 5e-6;
constexpr double kRelTol = 1e-5;

inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::abs(got[i] - want[i]) - kRelTol * std::abs(want[i]);
        if (!(err <= worst) || std::isnan(got[i])) {
            worst = std::isnan(got[i]) ? INFINITY : err;
            at = i;
        }
    }
    EXPECT_LE(worst, kAbsTol) << what << ": element " << at << " is " << got[at] << ", the reference says "
                              << want[at];
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace kvc::test
