// 002_*.txt: the 2-d toy through attend_head (scale 1, as the printed softmax shows), and the projection counts
// through generate()'s own kv_projections.
#include "kvcheck/reference/model.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using namespace kvc::ref;
using LD = long double;

HeadAttention<LD> toy(LD scale) {
    Mat<LD> q(1, 2), k(2, 2), v(2, 2);
    q << 1, 2;
    k << 1, 0, 0, 1;
    v << 2, 0, 0, 3;
    return attend_head<LD>(q, k, v, scale);
}

TEST(Toy2d, ScaleOneReproducesThePrintedNumbers) {
    const auto a = toy(1);
    EXPECT_EQ(a.dots(0, 0), 1);
    EXPECT_EQ(a.dots(0, 1), 2);
    EXPECT_LE(std::fabs(static_cast<double>(a.weights(0, 0)) - 0.27), 0.005);
    EXPECT_LE(std::fabs(static_cast<double>(a.weights(0, 1)) - 0.73), 0.005);
    EXPECT_LE(std::fabs(static_cast<double>(a.out(0, 0)) - 0.54), 0.005);
    EXPECT_LE(std::fabs(static_cast<double>(a.out(0, 1)) - 2.19), 0.005);
}

// The page's formula divides by √d; with it the printed weights would be wrong. Recorded as an inconsistency.
TEST(Toy2d, ThePagesOwnScaleDoesNotReproduceThem) {
    const auto a = toy(1 / std::sqrt(2.0L));
    EXPECT_GT(std::fabs(static_cast<double>(a.weights(0, 0)) - 0.27), 0.05);
}

ModelConfig small() {
    ModelConfig c;
    c.d_model = 8;
    c.n_layers = 1;
    c.n_q_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 4;
    c.vocab = 16;
    c.unembed = true;
    return c;
}

// "2 + 3 + … + 100 = 5,049" is generate()'s own count for a 2-token prompt and 99 steps, on any model.
TEST(ProjectionCounts, NoCacheSumIs5049) {
    for (uint64_t seed : {1u, 2u}) {
        const auto g = generate<double>(small(), random_weights(small(), seed), {1, 2}, 99);
        EXPECT_EQ(g.kv_projections, 5049);
        EXPECT_EQ(g.steps.size(), 99u);
        EXPECT_EQ(g.steps.front().kv_projections, 2);
        EXPECT_EQ(g.steps.back().kv_projections, 100);
    }
}

// "2 + 1 + 1 + … + 1 = 101": 2 in prefill, then one projection per generated token when it is appended.
TEST(ProjectionCounts, WithCacheEveryTokenOnceIs101) {
    const auto g = generate<double>(small(), random_weights(small(), 3), {1, 2}, 99);
    const long generated = static_cast<long>(g.tokens.size()) - 2;
    EXPECT_EQ(2 + generated, 101);
    // The same 99 passes only ever need the first 100 tokens: the off-by-one between the page's two sums.
    EXPECT_EQ(g.steps.back().kv_projections, 100);
}

} // namespace
