// The online-softmax state: merge and normalize agree with a direct softmax, and the empty state is exactly neutral.
#include "kvcheck/optimized/softmax_state.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

using kvc::opt::SoftmaxState;

// The state of keys with scores s and values v (d = 2), computed directly.
struct Owned {
    std::vector<float> o;
    SoftmaxState st;
    Owned(const std::vector<float>& s, const std::vector<float>& v) : o(2, 0.0f) {
        st.o = o.data();
        kvc::opt::state_clear(st, 2);
        if (s.empty()) return;
        float m = s[0];
        for (float x : s) m = std::max(m, x);
        st.m = m;
        for (size_t j = 0; j < s.size(); ++j) {
            const float p = std::exp(s[j] - m);
            st.l += p;
            o[0] += p * v[2 * j];
            o[1] += p * v[2 * j + 1];
        }
    }
};

TEST(SoftmaxState, MergeThenNormalizeIsSoftmaxOfTheUnion) {
    const std::vector<float> s1 = {0.5f, -1.0f, 3.0f}, v1 = {1, 2, 3, 4, 5, 6};
    const std::vector<float> s2 = {10.0f, 2.0f}, v2 = {-1, 0, 7, 8};
    Owned a(s1, v1), b(s2, v2);
    kvc::opt::state_merge(a.st, b.st, 2);
    float out[2];
    kvc::opt::state_normalize(a.st, out, 2);
    // direct, in double
    const std::vector<double> s = {0.5, -1.0, 3.0, 10.0, 2.0}, v = {1, 2, 3, 4, 5, 6, -1, 0, 7, 8};
    double sum = 0, o0 = 0, o1 = 0;
    for (size_t j = 0; j < s.size(); ++j) {
        const double p = std::exp(s[j] - 10.0);
        sum += p;
        o0 += p * v[2 * j];
        o1 += p * v[2 * j + 1];
    }
    EXPECT_NEAR(out[0], o0 / sum, 1e-6);
    EXPECT_NEAR(out[1], o1 / sum, 1e-6);
    EXPECT_EQ(a.st.m, 10.0f);
}

// Bug class 12: an empty split (a query's causal limit before it) must not turn the result into NaN, nor change a
// single bit of it, on either side of the merge.
TEST(SoftmaxState, EmptyStateIsExactlyNeutral) {
    Owned a({0.25f, 1.5f}, {1, 2, 3, 4}), empty({}, {});
    const float m = a.st.m, l = a.st.l, o0 = a.o[0], o1 = a.o[1];
    kvc::opt::state_merge(a.st, empty.st, 2); // from empty: unchanged
    EXPECT_EQ(std::memcmp(&m, &a.st.m, 4), 0);
    EXPECT_EQ(std::memcmp(&l, &a.st.l, 4), 0);
    EXPECT_EQ(std::memcmp(&o0, &a.o[0], 4), 0);
    EXPECT_EQ(std::memcmp(&o1, &a.o[1], 4), 0);
    Owned into({}, {});
    kvc::opt::state_merge(into.st, a.st, 2); // into empty: a copy
    EXPECT_EQ(std::memcmp(&into.st.m, &a.st.m, 4), 0);
    EXPECT_EQ(std::memcmp(&into.st.l, &a.st.l, 4), 0);
    EXPECT_EQ(std::memcmp(into.o.data(), a.o.data(), 8), 0);
    Owned e1({}, {}), e2({}, {});
    kvc::opt::state_merge(e1.st, e2.st, 2); // empty with empty: still empty, no NaN
    EXPECT_TRUE(e1.st.empty());
    EXPECT_EQ(e1.st.l, 0.0f);
    float out[2] = {-1, -1};
    kvc::opt::state_normalize(e1.st, out, 2); // the empty state normalizes to zeros, never NaN
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[1], 0.0f);
}

TEST(SoftmaxState, MergeOrderOnlyMovesRounding) {
    Owned a({1, 2}, {1, 1, 2, 2}), b({3, -4}, {5, 6, 7, 8}), c({0.5f}, {9, 10});
    Owned a2({1, 2}, {1, 1, 2, 2}), b2({3, -4}, {5, 6, 7, 8}), c2({0.5f}, {9, 10});
    kvc::opt::state_merge(a.st, b.st, 2);
    kvc::opt::state_merge(a.st, c.st, 2); // (a b) c
    kvc::opt::state_merge(b2.st, c2.st, 2);
    kvc::opt::state_merge(a2.st, b2.st, 2); // a (b c)
    float x[2], y[2];
    kvc::opt::state_normalize(a.st, x, 2);
    kvc::opt::state_normalize(a2.st, y, 2);
    EXPECT_NEAR(x[0], y[0], 1e-5);
    EXPECT_NEAR(x[1], y[1], 1e-5);
}

} // namespace
