// Test rig for the example plugin: a model of what the cache must hold, and a driver that runs the plugin through
// the ABI (kvc::Cache) and checks every call against the model and the Eigen reference.
//
// The model keeps each (seq, layer) stream's rows exactly as the cache must store them: K rotated to its position
// with kvc::ref::apply_rope<long double>, rounded to float, then K and V rounded to the cache dtype (what the
// property harness expects, and what the plugin does). Expected attention outputs come from
// kvc::ref::attend_heads<long double> over those rows, with q rotated in long double and never rounded.
#pragma once

#include "example_plugin.h"
#include "kvcheck/abi.hpp"
#include "kvcheck/reference/attention.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/rope.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace kvc_example_test {

inline const kvc_plugin_api* example_api() {
    static const kvc_plugin_api* api = kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    return api;
}

// A cache configuration with defaults small enough for exhaustive checking.
struct Shape {
    uint32_t n_layers = 2;
    uint32_t n_q_heads = 4;
    uint32_t n_kv_heads = 2;
    uint32_t head_dim = 8;
    uint32_t dtype = KVC_DTYPE_F32;
    uint32_t rope = KVC_ROPE_NONE;
    uint32_t max_seqs = 4;
    uint32_t max_tokens = 64;
    float scale = 0.0f; // 0: 1/sqrt(head_dim)
    float theta = 10000.0f;

    kvc_config config() const {
        return kvc::make_config(n_layers, n_q_heads, n_kv_heads, head_dim, dtype, max_seqs, max_tokens, rope, 0,
                                scale, theta);
    }

    // Readable and usable as a gtest parameter name: f16_neox_q4kv2_d8
    std::string name() const {
        return std::string(kvc::dtype_name(dtype)) + "_" + kvc::rope_name(rope) + "_q" + std::to_string(n_q_heads) +
               "kv" + std::to_string(n_kv_heads) + "_d" + std::to_string(head_dim);
    }
};

// The expected contents of a cache.
class Model {
public:
    explicit Model(const kvc_config& cfg) : cfg_(cfg) {}

    const kvc_config& config() const { return cfg_; }
    std::size_t row_elems() const { return std::size_t(cfg_.n_kv_heads) * cfg_.head_dim; }
    std::size_t elem_bytes() const { return kvc::dtype_size(cfg_.cache_dtype); }

    uint32_t length(uint32_t seq, uint32_t layer) const {
        auto it = k_.find({seq, layer});
        return it == k_.end() ? 0 : static_cast<uint32_t>(it->second.size() / row_elems());
    }
    const std::vector<float>& k_rows(uint32_t seq, uint32_t layer) { return k_[{seq, layer}]; }
    const std::vector<float>& v_rows(uint32_t seq, uint32_t layer) { return v_[{seq, layer}]; }

    bool seq_empty(uint32_t seq) const {
        for (uint32_t l = 0; l < cfg_.n_layers; ++l)
            if (length(seq, l) != 0) return false;
        return true;
    }

    // Records the rows of n_new appended tokens and returns the expected outputs, [n_new][n_q_heads * head_dim].
    std::vector<long double> append(uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                                    const float* v) {
        const int d = static_cast<int>(cfg_.head_dim);
        const int nq = static_cast<int>(cfg_.n_q_heads), nkv = static_cast<int>(cfg_.n_kv_heads);
        const auto rope = static_cast<kvc::ref::Rope>(cfg_.rope);
        const uint32_t len = length(seq, layer);
        std::vector<float>& ks = k_[{seq, layer}];
        std::vector<float>& vs = v_[{seq, layer}];
        for (uint32_t t = 0; t < n_new; ++t) {
            std::vector<long double> row(k + std::size_t(t) * row_elems(), k + std::size_t(t + 1) * row_elems());
            for (int g = 0; g < nkv; ++g)
                kvc::ref::apply_rope<long double>(row.data() + std::size_t(g) * d, d, long(len + t), rope,
                                                  cfg_.rope_theta);
            for (long double x : row) ks.push_back(kvc::ref::round_to_dtype(static_cast<float>(x), cfg_.cache_dtype));
            for (std::size_t i = 0; i < row_elems(); ++i)
                vs.push_back(kvc::ref::round_to_dtype(v[std::size_t(t) * row_elems() + i], cfg_.cache_dtype));
        }

        using Mat = kvc::ref::Mat<long double>;
        const Eigen::Index n_k = len + n_new;
        Mat Q(n_new, nq * d), K(n_k, nkv * d), V(n_k, nkv * d);
        for (uint32_t t = 0; t < n_new; ++t) {
            std::vector<long double> row(q + std::size_t(t) * nq * d, q + std::size_t(t + 1) * nq * d);
            for (int h = 0; h < nq; ++h)
                kvc::ref::apply_rope<long double>(row.data() + std::size_t(h) * d, d, long(len + t), rope,
                                                  cfg_.rope_theta);
            for (int i = 0; i < nq * d; ++i) Q(t, i) = row[std::size_t(i)];
        }
        for (Eigen::Index r = 0; r < n_k; ++r)
            for (int i = 0; i < nkv * d; ++i) {
                K(r, i) = ks[std::size_t(r) * row_elems() + std::size_t(i)];
                V(r, i) = vs[std::size_t(r) * row_elems() + std::size_t(i)];
            }
        const Mat out = kvc::ref::attend_heads<long double>(Q, K, V, nq, nkv, d, static_cast<long double>(cfg_.scale));
        std::vector<long double> flat(std::size_t(n_new) * nq * d);
        for (uint32_t t = 0; t < n_new; ++t)
            for (int i = 0; i < nq * d; ++i) flat[std::size_t(t) * nq * d + std::size_t(i)] = out(t, i);
        return flat;
    }

    void fork(uint32_t parent, uint32_t child) {
        for (uint32_t l = 0; l < cfg_.n_layers; ++l) {
            k_[{child, l}] = k_[{parent, l}];
            v_[{child, l}] = v_[{parent, l}];
        }
    }
    void release(uint32_t seq) {
        for (uint32_t l = 0; l < cfg_.n_layers; ++l) {
            k_[{seq, l}].clear();
            v_[{seq, l}].clear();
        }
    }

    uint64_t live_bytes() const {
        uint64_t tokens = 0;
        for (uint32_t s = 0; s < cfg_.max_seqs; ++s)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l) tokens += length(s, l);
        return 2 * tokens * row_elems() * elem_bytes();
    }
    uint64_t total_bytes() const {
        return 2ull * cfg_.max_seqs * cfg_.n_layers * cfg_.max_tokens * row_elems() * elem_bytes();
    }

private:
    kvc_config cfg_;
    std::map<std::pair<uint32_t, uint32_t>, std::vector<float>> k_, v_;
};

// Sentinel written after every output buffer: a stray write past the end shows up as a changed bit pattern.
constexpr uint32_t kSentinelBits = 0x7fbadbadu; // a NaN no computation produces
constexpr std::size_t kSentinelWords = 16;

inline float sentinel() {
    float f;
    std::memcpy(&f, &kSentinelBits, 4);
    return f;
}

// Drives one cache: every append is checked against the model, every read-back bit for bit.
class Rig {
public:
    explicit Rig(const Shape& shape, uint32_t seed = 1234, const kvc_plugin_api* api = example_api())
        : cache_(api, shape.config()), model_(shape.config()), rng_(seed) {}

    kvc::Cache& cache() { return cache_; }
    Model& model() { return model_; }
    std::mt19937& rng() { return rng_; }
    const kvc_config& config() const { return model_.config(); }

    // Appends n_new random tokens to (seq, layer) and checks the outputs against the reference:
    // |out - ref| <= rel_tol * max|V| over the stream, elementwise (the f32 precision class on unit-scale data).
    void append_and_check(uint32_t seq, uint32_t layer, uint32_t n_new, double rel_tol = 1e-5) {
        SCOPED_TRACE("append_attend seq " + std::to_string(seq) + " layer " + std::to_string(layer) + " n_new " +
                     std::to_string(n_new) + " after " + std::to_string(model_.length(seq, layer)) + " rows");
        const std::size_t qn = std::size_t(n_new) * config().n_q_heads * config().head_dim;
        const std::size_t kn = std::size_t(n_new) * model_.row_elems();
        std::vector<float> q = random_vector(qn, 2.0f), k = random_vector(kn, 1.0f), v = random_vector(kn, 1.0f);
        std::vector<float> out(qn + kSentinelWords, sentinel());

        cache_.append_attend(seq, layer, n_new, q.data(), k.data(), v.data(), out.data());
        const std::vector<long double> expected = model_.append(seq, layer, n_new, q.data(), k.data(), v.data());

        // The harness poisons its buffers after each call; so do we, so a plugin holding on to them would show.
        std::fill(q.begin(), q.end(), std::nanf(""));
        std::fill(k.begin(), k.end(), std::nanf(""));
        std::fill(v.begin(), v.end(), std::nanf(""));

        for (std::size_t i = qn; i < out.size(); ++i)
            ASSERT_EQ(bits(out[i]), kSentinelBits) << "append_attend wrote past the end of out at word " << i - qn;

        float max_v = 0.0f;
        for (float x : model_.v_rows(seq, layer)) max_v = std::max(max_v, std::fabs(x));
        const long double tol = static_cast<long double>(rel_tol) * std::max(max_v, 1e-30f);
        for (std::size_t i = 0; i < qn; ++i) {
            ASSERT_FALSE(std::isnan(out[i])) << "NaN at output element " << i;
            ASSERT_LE(std::fabs(static_cast<long double>(out[i]) - expected[i]), tol)
                << "output element " << i << " (token " << i / (config().n_q_heads * config().head_dim) << ", head "
                << (i / config().head_dim) % config().n_q_heads << ", dim " << i % config().head_dim
                << "): plugin " << out[i] << ", reference " << static_cast<double>(expected[i]);
        }
        ASSERT_EQ(cache_.seq_length(seq, layer), model_.length(seq, layer));
    }

    // Reads back every row of (seq, layer) and compares the stored bits with the model's rounded values.
    void check_readback(uint32_t seq, uint32_t layer) {
        SCOPED_TRACE("read_kv seq " + std::to_string(seq) + " layer " + std::to_string(layer));
        const uint32_t n = model_.length(seq, layer);
        ASSERT_EQ(cache_.seq_length(seq, layer), n);
        const std::size_t bytes = std::size_t(n) * model_.row_elems() * model_.elem_bytes();
        std::vector<unsigned char> k(bytes + 64, 0xA5), v(bytes + 64, 0xA5);
        cache_.read_kv(seq, layer, 0, n, k.data(), v.data());
        for (std::size_t i = bytes; i < k.size(); ++i) {
            ASSERT_EQ(k[i], 0xA5) << "read_kv wrote past the end of k_out";
            ASSERT_EQ(v[i], 0xA5) << "read_kv wrote past the end of v_out";
        }
        const std::vector<float>& mk = model_.k_rows(seq, layer);
        const std::vector<float>& mv = model_.v_rows(seq, layer);
        unsigned char want[4];
        for (std::size_t i = 0; i < mk.size(); ++i) {
            const std::size_t at = i * model_.elem_bytes();
            kvc::ref::store_dtype(mk[i], config().cache_dtype, want);
            ASSERT_EQ(std::memcmp(k.data() + at, want, model_.elem_bytes()), 0)
                << "K element " << i << " (row " << i / model_.row_elems() << ") differs from " << mk[i];
            kvc::ref::store_dtype(mv[i], config().cache_dtype, want);
            ASSERT_EQ(std::memcmp(v.data() + at, want, model_.elem_bytes()), 0)
                << "V element " << i << " (row " << i / model_.row_elems() << ") differs from " << mv[i];
        }
    }

    // The ABI's memory formula, for an exact-per-token cache that allocated everything up front.
    void check_memory() {
        const kvc_memory m = cache_.memory();
        EXPECT_EQ(m.block_size, 1u);
        EXPECT_EQ(m.live_bytes, model_.live_bytes());
        EXPECT_EQ(m.capacity_bytes, model_.live_bytes());
        EXPECT_EQ(m.pool_bytes, model_.total_bytes() - model_.live_bytes());
    }

    static uint32_t bits(float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return u;
    }

private:
    std::vector<float> random_vector(std::size_t n, float amplitude) {
        std::uniform_real_distribution<float> dist(-amplitude, amplitude);
        std::vector<float> x(n);
        for (float& e : x) e = dist(rng_);
        return x;
    }

    kvc::Cache cache_;
    Model model_;
    std::mt19937 rng_;
};

} // namespace kvc_example_test
