// 000_*.txt's 4-d toy, run through kvc::ref::forward<long double> with scale 1/√4 = 0.5. The expected numbers
// here are typed from the document, not read from golden/; test_golden_files.cpp does the same for every entry.
#include "kvcheck/golden/toy4d.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using namespace kvc;
using golden::LD;

ref::ForwardTrace<LD> pass(const std::vector<int>& tokens) {
    const auto& t = golden::toy4d();
    return ref::forward<LD>(t.cfg, t.weights, ref::embed<LD>(t.weights, tokens));
}

// Each printed value to within half a unit of its last digit.
void expect_printed(const ref::RowVec<LD>& actual, const std::vector<double>& printed, double tol, const char* what) {
    ASSERT_EQ(actual.size(), static_cast<Eigen::Index>(printed.size())) << what;
    for (size_t i = 0; i < printed.size(); ++i)
        EXPECT_LE(std::fabs(static_cast<double>(actual(static_cast<Eigen::Index>(i))) - printed[i]), tol)
            << what << "[" << i << "] = " << static_cast<double>(actual(static_cast<Eigen::Index>(i)));
}

TEST(Toy4d, TheConfigIsTheDocuments) {
    const auto& t = golden::toy4d();
    EXPECT_EQ(t.cfg.d_model, 4);
    EXPECT_EQ(t.cfg.n_q_heads, 1);
    EXPECT_EQ(t.cfg.head_dim, 4);
    EXPECT_EQ(t.cfg.n_layers, 2);
    EXPECT_EQ(t.cfg.attention_scale(), 0.5);
}

TEST(Toy4d, PrefillReproducesTheFourCachedRowsExactly) {
    const auto l0 = pass({10, 12, 13, 16}).layers[0];
    ref::Mat<LD> k(4, 4), v(4, 4);
    k << 20, 18, 15, 22, 19, 19, 15, 22, 18, 19, 15, 23, 18, 20, 15, 22;
    v << 13, 14, 12, 15, 13, 14, 13, 14, 14, 13, 13, 14, 13, 14, 14, 13;
    EXPECT_EQ(l0.k, k);
    EXPECT_EQ(l0.v, v);
    ref::RowVec<LD> q_the(4);
    q_the << 18, 22, 15, 25;
    EXPECT_EQ(ref::RowVec<LD>(l0.q.row(0)), q_the);
}

TEST(Toy4d, TurnOneMatchesTheTable) {
    const auto t = pass({10, 12, 13, 16});
    const auto& h = t.layers[0].heads[0];
    expect_printed(t.layers[0].q.row(3), {20, 18, 19, 21}, 0, "Q_on");
    expect_printed(h.dots.row(3), {1471, 1469, 1470, 1467}, 0, "Q·K");
    expect_printed(h.scores.row(3), {735.5, 734.5, 735.0, 733.5}, 0, "÷√4");
    expect_printed(h.weights.row(3), {0.47, 0.17, 0.29, 0.06}, 0.005, "softmax");
    expect_printed(h.out.row(3), {13.29, 13.71, 12.59, 14.41}, 0.005, "out");
}

TEST(Toy4d, TurnTwoMatchesTheTable) {
    const auto t = pass({10, 12, 13, 16, 14});
    const auto& l0 = t.layers[0];
    const auto& h = l0.heads[0];
    expect_printed(l0.k.row(4), {10, 11, 8, 12}, 0, "K_mat");
    expect_printed(l0.q.row(4), {11, 11, 9, 13}, 0, "Q_mat");
    expect_printed(h.dots.row(4), {839, 839, 841, 839, 459}, 0, "Q·K");
    expect_printed(h.scores.row(4), {419.5, 419.5, 420.5, 419.5, 229.5}, 0, "÷√4");
    expect_printed(h.weights.row(4), {0.17, 0.17, 0.48, 0.17, 0.00}, 0.005, "softmax");
    expect_printed(h.out.row(4), {13.48, 13.52, 13.00, 14.00}, 0.005, "out");
}

TEST(Toy4d, EachTurnAppendsOneRow) {
    const auto& t = golden::toy4d();
    const auto g = ref::generate<LD>(t.cfg, t.weights, {10, 12, 13, 16}, 2, {14, t.dot_placeholder_id});
    EXPECT_EQ(g.steps[0].layers[0].k.rows(), 4);
    EXPECT_EQ(g.steps[1].layers[0].k.rows(), 5); // "cache now 5 rows"
    EXPECT_EQ(pass(g.tokens).layers[0].k.rows(), 6); // "cache now 6 rows"
    EXPECT_EQ(g.tokens[4], 14);
}

TEST(Toy4d, MatsEmbeddingIsTheUniqueIntegerSolution) {
    const auto& t = golden::toy4d();
    EXPECT_EQ(t.w_k_det, 5.0L); // invertible: unique
    ref::RowVec<LD> e(4), k(4);
    e << 1, 1, 2, 1;
    k << 10, 11, 8, 12;
    EXPECT_EQ(t.mat_embedding, e);
    EXPECT_EQ(ref::RowVec<LD>(e * t.weights.layers[0].w_k), k);
}

TEST(Toy4d, WqFitsThePrintedQueriesButIsNotUnique) {
    const auto& t = golden::toy4d();
    EXPECT_EQ(t.q_system_rank, 3); // 3 independent equations per column, 4 unknowns
    ref::Mat<LD> E(3, 4), Q(3, 4);
    E << 2, 3, 3, 1, 2, 1, 3, 3, 1, 1, 2, 1; // the, on, mat
    Q << 18, 22, 15, 25, 20, 18, 19, 21, 11, 11, 9, 13;
    EXPECT_EQ(ref::Mat<LD>(E * t.w_q), Q);
    // Moving every column along the null direction changes no printed Q.
    ref::Mat<LD> other = t.w_q;
    for (Eigen::Index j = 0; j < 4; ++j) other.col(j) += static_cast<LD>(j + 1) * t.w_q_null.transpose();
    EXPECT_NE(other, t.w_q);
    EXPECT_EQ(ref::Mat<LD>(E * other), Q);
    for (Eigen::Index i = 0; i < 16; ++i) { // the documented choice: every entry in {1, 2, 3}
        EXPECT_GE(t.w_q.data()[i], 1);
        EXPECT_LE(t.w_q.data()[i], 3);
    }
}

} // namespace
