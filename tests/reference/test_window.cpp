// The reference's windowed, sink and latent-shaped attention against numbers worked out by hand (written in each
// test): the rule every windowed cache is judged by must be right before anything is compared with it.
#include "kvcheck/reference/attention.hpp"
#include "kvcheck/reference/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using namespace kvc::ref;
using M = Mat<double>;

// n_k keys of one dim whose scores are ln(weights[j]) (q = 1, scale 1), so the softmax weight of a visible key j is
// weights[j] / (sum of the visible weights); values v_j = j. The output of a query is then a weighted mean of the
// visible positions, which is easy to work out by hand.
struct Toy {
    M k, v;
    explicit Toy(int n_k, const std::vector<double>& weights = {}) : k(n_k, 1), v(n_k, 1) {
        for (int j = 0; j < n_k; ++j) {
            k(j, 0) = weights.empty() ? 0.0 : std::log(weights[j]);
            v(j, 0) = j;
        }
    }
    // outputs of the last n_q positions
    M out(int n_q, Visibility vis) const { return attend_head<double>(M::Ones(n_q, 1), k, v, 1.0, vis).out; }
};

TEST(Window, DecodeSeesTheLastWKeys) {
    const Toy t(6); // equal scores: the output is the mean of the visible positions
    EXPECT_DOUBLE_EQ(t.out(1, {0, 0})(0, 0), 2.5);  // (0+1+2+3+4+5)/6
    EXPECT_DOUBLE_EQ(t.out(1, {2, 0})(0, 0), 4.5);  // positions 4, 5
    EXPECT_DOUBLE_EQ(t.out(1, {1, 0})(0, 0), 5.0);  // only itself
    EXPECT_DOUBLE_EQ(t.out(1, {6, 0})(0, 0), 2.5);  // a window as long as the sequence: everything
    EXPECT_DOUBLE_EQ(t.out(1, {5, 0})(0, 0), 3.0);  // positions 1..5: W - 1 keys before the query, never W
}

TEST(Window, SinksStayVisibleAndCountOnce) {
    const Toy t(6);
    EXPECT_DOUBLE_EQ(t.out(1, {2, 1})(0, 0), 3.0);  // positions 0, 4, 5
    EXPECT_DOUBLE_EQ(t.out(1, {2, 2})(0, 0), 2.5);  // positions 0, 1, 4, 5
    // position 1 with W = 2, S = 1: key 0 is both a sink and inside the window; counted once: (0+1)/2
    const Toy early(2);
    EXPECT_DOUBLE_EQ(early.out(1, {2, 1})(0, 0), 0.5);
    // sinks without a window change nothing
    EXPECT_DOUBLE_EQ(t.out(1, {0, 3})(0, 0), 2.5);
}

TEST(Window, UnequalScoresWeightOnlyVisibleKeys) {
    // weights 1..5 at positions 0..4, query at 4 with W = 2, S = 1: keys 0, 3, 4 with weights 1, 4, 5:
    // (0*1 + 3*4 + 4*5) / 10 = 3.2
    const Toy t(5, {1, 2, 3, 4, 5});
    EXPECT_NEAR(t.out(1, {2, 1})(0, 0), 3.2, 1e-12);
}

TEST(Window, EachRowOfAChunkHasItsOwnWindow) {
    // rows at positions 3, 4, 5 of a 6-key chunk, W = 2: (2+3)/2, (3+4)/2, (4+5)/2. A kernel that masks the chunk
    // with its first row's window would give the last row keys 2..5: 3.5.
    const M o = Toy(6).out(3, {2, 0});
    EXPECT_DOUBLE_EQ(o(0, 0), 2.5);
    EXPECT_DOUBLE_EQ(o(1, 0), 3.5);
    EXPECT_DOUBLE_EQ(o(2, 0), 4.5);
    // the masked entries are exactly zero weights
    const auto r = attend_head<double>(M::Ones(3, 1), Toy(6).k, Toy(6).v, 1.0, {2, 0});
    EXPECT_EQ(r.weights(0, 1), 0.0);
    EXPECT_EQ(r.weights(2, 3), 0.0);
    EXPECT_DOUBLE_EQ(r.weights(2, 4), 0.5);
}

TEST(Latent, ValueDimDiffersFromKeyDim) {
    // MLA's decode form: one KV head, keys of 2 dims, values of 3, two query heads. Key 0 = (0, 0), key 1 = (1, 0);
    // values (1, 10, -1) and (3, 30, -3). Head 0's query (0, 0) weighs both equally: (2, 20, -2). Head 1's query
    // (ln 3, 0) scores ln 3 on key 1 (scale 1): weights 1/4, 3/4: (2.5, 25, -2.5).
    M q(1, 4), k(2, 2), v(2, 3);
    q << 0, 0, std::log(3.0), 0;
    k << 0, 0, 1, 0;
    v << 1, 10, -1, 3, 30, -3;
    const M o = attend_heads<double>(q, k, v, 2, 1, 2, 1.0, {}, 3);
    ASSERT_EQ(o.cols(), 6);
    const double want[6] = {2, 20, -2, 2.5, 25, -2.5};
    for (int x = 0; x < 6; ++x) EXPECT_NEAR(o(0, x), want[x], 1e-12) << "element " << x;
}

TEST(Rope, RangeRotatesOnlyItsDims) {
    // dims 2..3 of (1, 2, 3, 4) rotated as a 2-dim head at position 1: angle 1 rad whatever theta.
    //   x2 = 3 cos 1 - 4 sin 1 = -1.7449770216271667,  x3 = 3 sin 1 + 4 cos 1 = 4.685622177896248
    double x[4] = {1, 2, 3, 4};
    apply_rope_range(x, 2, 2, 1, Rope::NeoX, 10000.0);
    EXPECT_EQ(x[0], 1.0);
    EXPECT_EQ(x[1], 2.0);
    EXPECT_NEAR(x[2], -1.7449770216271667, 1e-14);
    EXPECT_NEAR(x[3], 4.685622177896248, 1e-14);
    // frequencies follow the range's own size: 4 dims at theta 100, pair 1 turns by 100^(-2/4) = 0.1 rad per
    // position. The range is y[1..4]; its NeoX pairs are (y[1], y[3]) and (y[2], y[4]). At position 10 pair 1,
    // (1, 0), turns by 1 rad to (cos 1, sin 1); pair 0 is zero and stays zero; y[0] and y[5] are outside.
    double y[6] = {9, 0, 1, 0, 0, 7};
    apply_rope_range(y, 1, 4, 10, Rope::NeoX, 100.0);
    EXPECT_EQ(y[0], 9.0);
    EXPECT_EQ(y[5], 7.0);
    EXPECT_EQ(y[1], 0.0);
    EXPECT_EQ(y[3], 0.0);
    EXPECT_NEAR(y[2], std::cos(1.0), 1e-14);
    EXPECT_NEAR(y[4], std::sin(1.0), 1e-14);
}

} // namespace
