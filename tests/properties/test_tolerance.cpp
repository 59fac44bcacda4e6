// The tolerance policy in both directions: benign rounding drift passes, real divergence fails, and a precision
// class that is not what the implementation declares is named.
#include "doubles.hpp"

#include "kvcheck/properties/tolerance.hpp"

#include <cmath>
#include <limits>

namespace {

using namespace kvc::prop;

TEST(Tolerance, SummingInAnotherCorrectOrderPasses) {
    const auto t = kvc::testing::load_implementation("double-reverse_sum");
    EXPECT_FALSE(kvc::testing::first_failure(t, "EQUIV", 100).has_value());
}

TEST(Tolerance, OffByOnePositionFails) {
    const auto t = kvc::testing::load_implementation("double-skip_self");
    const auto r = kvc::testing::first_failure(t, "EQUIV", 60);
    ASSERT_TRUE(r.has_value());
    EXPECT_NE(r->reason.find("exceeds the bound"), std::string::npos) << r->reason;
}

TEST(Tolerance, AccumulatingInF16WhileDeclaringF32FailsAndSaysSo) {
    const auto t = kvc::testing::load_implementation("double-f16_accum");
    const auto r = kvc::testing::first_failure(t, "EQUIV", 100);
    ASSERT_TRUE(r.has_value());
    EXPECT_NE(r->reason.find("consistent with q rounded to"), std::string::npos) << r->reason;
    EXPECT_NE(r->reason.find("declares the f32 class"), std::string::npos) << r->reason;
}

TEST(Tolerance, TheSameArithmeticDeclaredHonestlyPassesAndIsGradedBelowF32) {
    const auto t = kvc::testing::load_implementation("double-f16_honest");
    EXPECT_FALSE(kvc::testing::first_failure(t, "EQUIV", 100).has_value());
    // on a 16-bit cache the report says it would fail the stricter class
    RunSettings s;
    s.cases = 100;
    bool graded_below = false;
    for (int i = 0; i < s.cases && !graded_below; ++i) {
        const CaseResult r = run_case(t, *find_property("EQUIV"), s, i);
        for (const auto& n : r.notes) graded_below |= n.find("would fail the f32 class") != std::string::npos;
    }
    EXPECT_TRUE(graded_below);
}

// Unit checks of grade_outputs on a hand-made call.
struct OneCall {
    CaseConfig cfg;
    std::vector<float> q, k, v;
    Expected e;
    OneCall() {
        cfg.head_dim = 4;
        q = {0.5f, -1.f, 0.25f, 2.f};
        k = {1, 0, 0, 1, 0, 1, 1, 0, 1, 1, -1, 0.5f};
        v = {1, 2, 3, 4, -1, 0, 1, 2, 0.5f, 0.5f, 0.5f, 0.5f};
        e = expect_outputs(cfg, q.data(), 1, k, v, 3);
    }
};

TEST(Tolerance, ExactOutputPassesWithZeroHeadroomAndNanFails) {
    OneCall c;
    std::vector<float> out(4);
    for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(c.e.oracle[i]);
    Grade g = grade_outputs(c.cfg, KVC_PRECISION_F32, out.data(), c.e);
    EXPECT_TRUE(g.pass);
    EXPECT_LT(g.headroom, 0.1);
    out[2] = std::numeric_limits<float>::quiet_NaN();
    g = grade_outputs(c.cfg, KVC_PRECISION_F32, out.data(), c.e);
    EXPECT_FALSE(g.pass);
    EXPECT_TRUE(g.nan);
}

TEST(Tolerance, AnErrorAboveTheFloorFailsAndNamesTheCoordinates) {
    OneCall c;
    std::vector<float> out(4);
    for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(c.e.oracle[i]);
    out[3] += 1e-3f; // far above 2x naive f32 error and the 1e-5 floor
    const Grade g = grade_outputs(c.cfg, KVC_PRECISION_F32, out.data(), c.e);
    EXPECT_FALSE(g.pass);
    EXPECT_EQ(g.worst.dim, 3u);
    EXPECT_GT(g.headroom, 1.0);
}

} // namespace
