// The reference's tied classifier: logits = h_final · embeddingᵀ, with no W_U of its own. Checked against the untied
// path of the same reference given W_U = embeddingᵀ explicitly (a different expression: f * w_unembed), against a
// hand-written dot product, and through the JSON and seeded-weights routes.
#include "kvcheck/reference/model.hpp"
#include "kvcheck/reference/model_json.hpp"

#include <gtest/gtest.h>

namespace {

using namespace kvc::ref;

ModelConfig llama(bool tied) {
    ModelConfig c;
    c.d_model = 12;
    c.n_layers = 2;
    c.n_q_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 3;
    c.vocab = 19;
    c.rmsnorm = true;
    c.mlp = true;
    c.d_ff = 20;
    c.out_proj = true;
    c.residual = true;
    c.unembed = true;
    c.tied = tied;
    return c;
}

TEST(TiedClassifier, LogitsAreTheEmbeddingTransposedApplied) {
    const ModelConfig tied = llama(true), untied = llama(false);
    const Weights<double> w = random_weights(tied, 5);
    EXPECT_EQ(w.w_unembed.size(), 0) << "a tied model draws no W_U";
    Weights<double> explicit_w = w;
    explicit_w.w_unembed = w.embedding.transpose();
    const std::vector<int> tokens = {3, 1, 18, 0, 7};
    const auto a = forward<double>(tied, w, embed<double>(w, tokens));
    const auto b = forward<double>(untied, explicit_w, embed<double>(explicit_w, tokens));
    ASSERT_EQ(a.logits.rows(), 5);
    ASSERT_EQ(a.logits.cols(), 19);
    EXPECT_EQ((a.logits - b.logits).cwiseAbs().maxCoeff(), 0.0) << "Eigen computes both products the same way";
    // and by hand: logit v of the last token is the final-normed state dotted with embedding row v
    const Mat<double> h = a.layers.back().output.bottomRows(1);
    const double ms = h.squaredNorm() / 12.0;
    for (int v = 0; v < 19; ++v) {
        double dot = 0;
        for (int i = 0; i < 12; ++i) dot += h(0, i) / std::sqrt(ms + tied.rms_eps) * w.rms_final(i) * w.embedding(v, i);
        EXPECT_NEAR(a.logits(4, v), dot, 1e-12) << "logit " << v;
    }
}

TEST(TiedClassifier, SeededWeightsMatchTheUntiedDrawExceptW_U) {
    const Weights<double> t = random_weights(llama(true), 11), u = random_weights(llama(false), 11);
    EXPECT_EQ(t.embedding, u.embedding);
    EXPECT_EQ(t.layers[1].w_down, u.layers[1].w_down);
    EXPECT_EQ(u.w_unembed.rows(), 12);
    EXPECT_EQ(t.w_unembed.size(), 0);
}

TEST(TiedClassifier, NeedsAnUnembedding) {
    ModelConfig c = llama(true);
    c.unembed = false;
    EXPECT_THROW(c.validate(), ConfigError);
}

TEST(TiedClassifier, JsonRoundTrip) {
    const ModelConfig c = llama(true);
    const nlohmann::json j = config_to_json(c);
    EXPECT_EQ(j.at("tied"), true);
    EXPECT_TRUE(config_from_json(j).tied);
    EXPECT_FALSE(config_to_json(llama(false)).contains("tied")) << "untied JSON stays as it was";
    // weights JSON of a tied model carries no w_unembed
    nlohmann::json wj = {{"embedding", matrix_to_json(Mat<double>::Ones(19, 12))}, {"layers", nlohmann::json::array()}};
    ModelConfig one = llama(true);
    one.n_layers = 1;
    one.mlp = false;
    one.rmsnorm = false;
    const Weights<double> w = random_weights(one, 3);
    wj["layers"].push_back({{"w_q", matrix_to_json(w.layers[0].w_q)}, {"w_k", matrix_to_json(w.layers[0].w_k)},
                            {"w_v", matrix_to_json(w.layers[0].w_v)}, {"w_o", matrix_to_json(w.layers[0].w_o)}});
    const Weights<double> back = weights_from_json(wj, one);
    EXPECT_EQ(back.w_unembed.size(), 0);
}

} // namespace
