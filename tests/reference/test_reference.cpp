// Tests of the reference transformer (reference/): the invariants the documents rely on, checked on seeded
// random models. The seed is printed and can be given back with KVCHECK_SEED=N.
#include "kvcheck/reference/model.hpp"
#include "kvcheck/reference/model_json.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

namespace {

using namespace kvc::ref;

uint64_t test_seed() {
    static const uint64_t seed = [] {
        const char* env = std::getenv("KVCHECK_SEED");
        const uint64_t s = env ? std::strtoull(env, nullptr, 10) : 20261129u;
        std::cout << "[reference tests] seed " << s << " (replay with KVCHECK_SEED=" << s << ")\n";
        return s;
    }();
    return seed;
}

ModelConfig small_model(Rope rope = Rope::None, int n_q = 4, int n_kv = 2) {
    ModelConfig c;
    c.d_model = 16;
    c.n_layers = 2;
    c.n_q_heads = n_q;
    c.n_kv_heads = n_kv;
    c.head_dim = 8;
    c.vocab = 32;
    c.rope = rope;
    c.rmsnorm = true;
    c.mlp = true;
    c.d_ff = 24;
    c.out_proj = true;
    c.residual = true;
    c.unembed = true;
    return c;
}

std::vector<int> tokens(int n, uint64_t salt) {
    std::vector<int> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int>((salt * 2654435761u + 7u * i * i + 3u * i) % 32u));
    return t;
}

TEST(Softmax, RowsSumToOneAndMaskedEntriesAreZero) {
    for (Rope rope : {Rope::None, Rope::NeoX, Rope::GptJ}) {
        const ModelConfig cfg = small_model(rope);
        const auto w = random_weights(cfg, test_seed()).cast<long double>();
        const auto tr = forward<long double>(cfg, w, embed(w, tokens(9, 1)));
        for (const auto& layer : tr.layers)
            for (const auto& head : layer.heads)
                for (Eigen::Index i = 0; i < head.weights.rows(); ++i) {
                    EXPECT_NEAR(static_cast<double>(head.weights.row(i).sum()), 1.0, 1e-15);
                    for (Eigen::Index j = i + 1; j < head.weights.cols(); ++j) EXPECT_EQ(head.weights(i, j), 0.0L);
                }
    }
}

// Causality: the reason a cache is valid at all. Earlier positions' K, V and outputs do not change when tokens are
// appended (up to the last bits: Eigen may block a product differently for a different number of rows).
TEST(Causality, AppendingTokensNeverChangesEarlierPositions) {
    for (Rope rope : {Rope::None, Rope::NeoX, Rope::GptJ}) {
        const ModelConfig cfg = small_model(rope);
        const auto w = random_weights(cfg, test_seed() + 1).cast<double>();
        const auto all = tokens(12, 2);
        const auto full = forward<double>(cfg, w, embed(w, all));
        for (int n = 1; n < 12; ++n) {
            const auto prefix = forward<double>(cfg, w, embed(w, std::vector<int>(all.begin(), all.begin() + n)));
            for (int l = 0; l < cfg.n_layers; ++l) {
                const auto& a = prefix.layers[l];
                const auto& b = full.layers[l];
                EXPECT_TRUE(a.k.isApprox(b.k.topRows(n), 1e-14)) << "layer " << l << " prefix " << n;
                EXPECT_TRUE(a.v.isApprox(b.v.topRows(n), 1e-14)) << "layer " << l << " prefix " << n;
                EXPECT_TRUE(a.output.isApprox(b.output.topRows(n), 1e-12)) << "layer " << l << " prefix " << n;
            }
        }
    }
}

// GQA with n_kv_heads == n_q_heads is MHA; and a GQA model equals the MHA model whose K/V heads repeat each
// shared head for its group ("repeat", not "tile").
TEST(Gqa, EqualsMhaWithRepeatedKvHeads) {
    for (int n_kv : {1, 2, 3, 6}) {
        const ModelConfig gqa = small_model(Rope::NeoX, 6, n_kv);
        ModelConfig mha = gqa;
        mha.n_kv_heads = 6;
        const auto wg = random_weights(gqa, test_seed() + 2);
        auto wm = wg;
        const int d = gqa.head_dim, group = 6 / n_kv;
        for (size_t l = 0; l < wg.layers.size(); ++l) {
            wm.layers[l].w_k.resize(gqa.d_model, 6 * d);
            wm.layers[l].w_v.resize(gqa.d_model, 6 * d);
            for (int h = 0; h < 6; ++h) {
                wm.layers[l].w_k.middleCols(h * d, d) = wg.layers[l].w_k.middleCols((h / group) * d, d);
                wm.layers[l].w_v.middleCols(h * d, d) = wg.layers[l].w_v.middleCols((h / group) * d, d);
            }
        }
        const auto x = embed(wg, tokens(7, 3));
        const auto a = forward<double>(gqa, wg, x);
        const auto b = forward<double>(mha, wm, x);
        EXPECT_TRUE(a.logits.isApprox(b.logits, 1e-12)) << "n_kv_heads " << n_kv;
    }
}

TEST(Rope, PositionZeroIsIdentityAndRotationPreservesNorm) {
    for (Rope rope : {Rope::NeoX, Rope::GptJ}) {
        std::vector<long double> x(16), y;
        for (int i = 0; i < 16; ++i) x[i] = 0.1L * i - 0.7L;
        y = x;
        apply_rope(y.data(), 16, 0, rope, 10000.0);
        EXPECT_EQ(x, y);
        long double n0 = 0, n1 = 0;
        for (long pos : {1L, 7L, 4095L, 1000000L}) {
            y = x;
            apply_rope(y.data(), 16, pos, rope, 10000.0);
            n0 = n1 = 0;
            for (int i = 0; i < 16; ++i) n0 += x[i] * x[i], n1 += y[i] * y[i];
            EXPECT_NEAR(static_cast<double>(n0), static_cast<double>(n1), 1e-15) << "pos " << pos;
            EXPECT_NE(x, y);
        }
    }
}

// The variants differ: NeoX pairs (0, d/2), GPT-J pairs (0, 1).
TEST(Rope, VariantsPairDifferentElements) {
    std::vector<double> e0(8, 0.0);
    e0[0] = 1.0;
    auto neox = e0, gptj = e0;
    apply_rope(neox.data(), 8, 1, Rope::NeoX, 10000.0);
    apply_rope(gptj.data(), 8, 1, Rope::GptJ, 10000.0);
    EXPECT_NEAR(neox[4], std::sin(1.0), 1e-15);
    EXPECT_EQ(neox[1], 0.0);
    EXPECT_NEAR(gptj[1], std::sin(1.0), 1e-15);
    EXPECT_EQ(gptj[4], 0.0);
}

// Stated bound: on these unit-scale models float logits agree with the long double oracle to 1e-4 absolute
// (measured ~1e-6; float's epsilon is 1.2e-7 and the network is 2 layers deep with d_model 16).
TEST(Precision, FloatAgreesWithLongDoubleWithinStatedBound) {
    const ModelConfig cfg = small_model(Rope::NeoX);
    const auto w = random_weights(cfg, test_seed() + 3);
    const auto x = embed(w, tokens(10, 4));
    const auto lf = forward<float>(cfg, w.cast<float>(), x.cast<float>());
    const auto ll = forward<long double>(cfg, w.cast<long double>(), x.cast<long double>());
    const double err = static_cast<double>((lf.logits.cast<long double>() - ll.logits).cwiseAbs().maxCoeff());
    std::cout << "float vs long double: max |logit error| = " << err << "\n";
    EXPECT_LT(err, 1e-4);
    EXPECT_GT(err, 0.0); // the two really are different computations
}

TEST(Generate, CountsKvProjectionsOfFullRecompute) {
    const ModelConfig cfg = small_model();
    const auto w = random_weights(cfg, test_seed() + 4).cast<double>();
    const auto g = generate<double>(cfg, w, {1, 2}, 5);
    EXPECT_EQ(g.tokens.size(), 7u);
    EXPECT_EQ(g.kv_projections, 2 + 3 + 4 + 5 + 6);
    // greedy: every generated token is the argmax of the previous pass
    for (size_t s = 0; s < g.steps.size(); ++s) EXPECT_EQ(g.tokens[2 + s], g.steps[s].next_token);
}

TEST(BadInput, ImpossibleConfigsAreRefusedWithAClearMessage) {
    auto expect_refused = [](ModelConfig c, const std::string& words) {
        try {
            c.validate();
            FAIL() << "accepted a config that should fail with: " << words;
        } catch (const ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
    };
    ModelConfig c = small_model(Rope::None, 6, 4);
    expect_refused(c, "must be a multiple of n_kv_heads");
    c = small_model();
    c.head_dim = 0;
    expect_refused(c, "head_dim must be positive");
    c = small_model(Rope::NeoX);
    c.head_dim = 7;
    c.out_proj = true;
    expect_refused(c, "RoPE needs an even head_dim");
}

TEST(BadInput, MalformedModelJsonNamesTheField) {
    nlohmann::json j = {{"d_model", 4}, {"n_layers", 1}, {"n_q_heads", 1}, {"n_kv_heads", 1}, {"vocab", 4}};
    EXPECT_THROW(
        {
            try {
                config_from_json(j);
            } catch (const ConfigError& e) {
                EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos);
                throw;
            }
        },
        ConfigError);
    j["head_dim"] = "four";
    EXPECT_THROW(config_from_json(j), ConfigError);
    j["head_dim"] = 4;
    const ModelConfig cfg = config_from_json(j);
    EXPECT_THROW(weights_from_json(nlohmann::json::object(), cfg), ConfigError);
    EXPECT_THROW(matrix_from_json(nlohmann::json::parse("[[1,2],[3]]"), "m"), ConfigError);
}

} // namespace
