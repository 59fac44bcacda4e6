// The model-level engine: the reference's model with the cache. It projects K/V once per token (the documents'
// 5,049 vs 101), and its greedy generation follows the reference's.
#include "kvcheck/optimized/model_engine.hpp"

#include "engine_test_util.hpp"

namespace kvc::test {
namespace {

ref::ModelConfig small_model() {
    ref::ModelConfig c;
    c.d_model = 32;
    c.n_layers = 2;
    c.n_q_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    c.vocab = 64;
    c.rope = ref::Rope::NeoX;
    c.rmsnorm = true;
    c.mlp = true;
    c.d_ff = 64;
    c.out_proj = true;
    c.residual = true;
    c.unembed = true;
    return c;
}

// The document's count: without a cache, 2 + 3 + ... + 100 = 5,049 K/V computations for a 2-token prompt and 99
// generated tokens; with one, 2 + 1 + ... + 1 = 101 (every generated token appended, the last one too).
TEST(ModelEngine, ProjectsEachTokensKVOnce) {
    ref::ModelConfig c;
    c.d_model = 8;
    c.n_layers = 1;
    c.n_q_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 4;
    c.vocab = 16;
    c.out_proj = true;
    c.unembed = true;
    const auto w = ref::random_weights(c, 7);
    const auto reference = ref::generate<double>(c, w, {1, 2}, 99);
    EXPECT_EQ(reference.kv_projections, 5049);
    opt::ModelEngine engine(c, w);
    const auto cached = engine.generate({1, 2}, 99);
    EXPECT_EQ(cached.kv_projections, 101);
    EXPECT_EQ(cached.tokens.size(), 101u);
    EXPECT_EQ(engine.kv_projections(), 101);
}

// Float engine against the double reference on a seeded model with every part switched on (RoPE, GQA, RMSNorm,
// MLP, W_O, residual): logits agree at every step; tokens agree wherever the reference's top-2 gap is clear of the
// float error (a near-tie may legitimately go the other way, after which the two texts differ).
TEST(ModelEngine, GreedyTokensFollowTheReference) {
    const uint64_t seed = test_seed(42);
    const ref::ModelConfig c = small_model();
    const auto w = ref::random_weights(c, seed);
    const std::vector<int> prompt = {3, 14, 15, 9, 2};
    const int steps = 40;
    const auto reference = ref::generate<double>(c, w, prompt, steps);
    for (uint32_t dtype : {uint32_t(KVC_DTYPE_F32), uint32_t(KVC_DTYPE_BF16)}) {
        opt::ModelEngineOptions o;
        o.cache_dtype = dtype;
        o.block_size = 3;
        opt::ModelEngine engine(c, w, o);
        const auto cached = engine.generate(prompt, steps);
        const double tol = dtype == KVC_DTYPE_F32 ? 2e-4 : 5e-2; // a bf16 cache rounds K/V to 8 bits
        int compared = 0;
        for (int s = 0; s < steps; ++s) {
            const auto& want = reference.steps[static_cast<size_t>(s)].logits;
            const Eigen::Index last = want.rows() - 1;
            double top = -INFINITY, second = -INFINITY, worst = 0;
            for (Eigen::Index i = 0; i < want.cols(); ++i) {
                const double x = want(last, i);
                if (x > top) {
                    second = top;
                    top = x;
                } else if (x > second) {
                    second = x;
                }
                worst = std::max(worst, std::abs(x - cached.logits[static_cast<size_t>(s)][static_cast<size_t>(i)]));
            }
            EXPECT_LE(worst, tol * (1 + std::abs(top))) << dtype_name(dtype) << " step " << s;
            const size_t at = prompt.size() + static_cast<size_t>(s);
            if (cached.tokens[at] != reference.tokens[at]) {
                EXPECT_LT(top - second, 2 * tol * (1 + std::abs(top))) << dtype_name(dtype) << " step " << s
                                                                       << ": tokens differ with a clear gap";
                break; // the texts diverge here; later steps are not comparable
            }
            ++compared;
        }
        if (dtype == KVC_DTYPE_F32) {
            EXPECT_EQ(compared, steps);
        }
    }
}

// The prompt may arrive in chunks: the logits of its last token are the same (up to float rounding in the
// projections) as from one prefill, and the K/V count is the same.
TEST(ModelEngine, ChunkedPromptGivesTheSameLogits) {
    const ref::ModelConfig c = small_model();
    const auto w = ref::random_weights(c, 5);
    opt::ModelEngineOptions o;
    o.max_seqs = 2;
    opt::ModelEngine engine(c, w, o);
    const std::vector<int> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const auto whole = engine.forward(0, prompt);
    engine.forward(1, {1, 2, 3, 4});
    engine.forward(1, {5});
    const auto chunked = engine.forward(1, {6, 7, 8, 9});
    ASSERT_EQ(whole.size(), chunked.size());
    for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(whole[i], chunked[i], 1e-4 * (1 + std::abs(whole[i])));
    EXPECT_EQ(engine.kv_projections(), 18);
}

} // namespace
} // namespace kvc::test
