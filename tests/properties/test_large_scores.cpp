// Large attention scores (docs/conformance.md, EQUIV): the case's score_scale in JSON, the scores its inputs give
// (rows beyond f32 exp's range in both directions), and the doubles of tests/doubles/naive_softmax.cpp end to end: a
// softmax that subtracts its maximum passes EQUIV and LONG, one that accumulates exp(s) directly fails EQUIV.
#include "doubles.hpp"
#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/case.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace {

using namespace kvc::prop;
using kvc::testing::first_failure;
using kvc::testing::load_implementation;

using kvc::testing::contains;

Case large_case(float score_scale) {
    Case c;
    c.cfg.head_dim = 16;
    c.cfg.score_scale = score_scale;
    c.data_seed = 7;
    c.ops.push_back({});
    c.ops.back().appends.push_back({0, 64, false});
    return c;
}

TEST(LargeScoreCase, JsonRoundTripsAndOrdinaryCasesAreWrittenAsBefore) {
    const Case c = large_case(1000.0f);
    EXPECT_EQ(case_from_json(to_json(c)).cfg.score_scale, 1000.0f);
    const Case plain = large_case(0.0f);
    EXPECT_FALSE(to_json(plain)["config"].contains("score_scale"));
    EXPECT_EQ(case_from_json(to_json(plain)).cfg.score_scale, 0.0f);
    contains(describe(c), "score_scale=1000");
}

TEST(LargeScoreCase, BadScoreScalesAreRefused) {
    const auto refused = [](const nlohmann::json& value, const char* words) {
        nlohmann::json j = to_json(large_case(100.0f));
        j["config"]["score_scale"] = value;
        try {
            case_from_json(j);
            ADD_FAILURE() << "accepted: " << j["config"].dump();
        } catch (const std::invalid_argument& e) {
            contains(e.what(), words);
        }
    };
    refused("big", "must be a number");
    refused(true, "must be a number");
    refused(0, "not a number > 0");
    refused(-5.0, "not a number > 0");
    refused(1e6, "<= 100000");
    refused(1e300, "out of the range of a float32");
}

// The scores of each query over the keys it sees (one layer, one head, no RoPE): some rows lie wholly below -88 (a
// naive exp underflows to 0 everywhere), some wholly above +88 (it overflows), and the inputs stay finite and in
// range of a 16-bit cache.
TEST(LargeScoreInputs, RowsReachBeyondExpRangeBothWays) {
    const Case c = large_case(1000.0f);
    const uint32_t n = 64, d = c.cfg.head_dim;
    const AppendInputs in = append_inputs(c.cfg, c.data_seed, 0, 0, 0, n);
    int all_low = 0, all_high = 0, dominated = 0;
    for (uint32_t i = 0; i < n; ++i) {
        std::vector<double> s;
        for (uint32_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (uint32_t x = 0; x < d; ++x) dot += double(in.q[i * d + x]) * in.k[j * d + x];
            s.push_back(dot * c.cfg.scale());
        }
        std::sort(s.begin(), s.end());
        all_low += s.back() < -88;
        all_high += s.front() > 88;
        dominated += s.size() > 1 && s.back() - s[s.size() - 2] > 20;
    }
    EXPECT_GT(all_low, 3);
    EXPECT_GT(all_high, 3);
    EXPECT_GT(dominated, 10);
    for (float x : in.q) ASSERT_LT(std::fabs(x), 30000.0f);
    for (float x : in.k) ASSERT_LT(std::fabs(x), 60000.0f);
    // the ordinary values are untouched outside the regime: V always, K everywhere but the shared component
    const AppendInputs plain = append_inputs(large_case(0.0f).cfg, c.data_seed, 0, 0, 0, n);
    EXPECT_EQ(plain.v, in.v);
    for (uint32_t i = 0; i < n; ++i)
        for (uint32_t x = 0; x + 1 < d; ++x) ASSERT_EQ(plain.k[i * d + x], in.k[i * d + x]);
}

TEST(LargeScoreDoubles, MaxSubtractedSoftmaxPassesEquivAndLong) {
    const auto t = load_implementation("double-softmax_max_subtracted");
    for (const auto& [id, cases] : {std::pair{"EQUIV", 60}, std::pair{"LONG", 8}}) {
        int passed = 0;
        const auto r = first_failure(t, id, cases, &passed);
        EXPECT_FALSE(r.has_value()) << id << ": " << (r ? r->reason : "");
        EXPECT_GT(passed, 0) << id;
    }
}

TEST(LargeScoreDoubles, NaiveExpFailsEquiv) {
    const auto t = load_implementation("double-softmax_naive_exp");
    const auto r = first_failure(t, "EQUIV", 60);
    ASSERT_TRUE(r.has_value()) << "a softmax without its maximum was not caught by EQUIV";
    EXPECT_EQ(r->verdict, Verdict::Fail);
    EXPECT_EQ(r->failed_property, "EQUIV");
    EXPECT_GT(r->counterexample.cfg.score_scale, 0.0f) << "caught outside the large-score regime";
}

} // namespace
