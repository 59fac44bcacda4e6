// Proof that the properties can fail, and fail for the right reason: each deliberately broken implementation is
// caught by the property it was built to break, and passes the properties that have nothing to do with its bug.
#include "doubles.hpp"

namespace {

using kvc::testing::expect_caught_only_by;

TEST(Doubles, CorrectControlPassesEverything) {
    const auto t = kvc::testing::load_implementation("double-correct");
    for (const auto& p : kvc::prop::properties()) {
        int passed = 0;
        EXPECT_FALSE(kvc::testing::first_failure(t, p.id, 40, &passed).has_value()) << p.id;
        if (p.feature == 0 || (t.caps.features & p.feature)) {
            EXPECT_GT(passed, 0) << p.id << ": nothing ran";
        }
    }
}

// The allocator half of NO-Q on its own: a Q cache that never influences an output.
TEST(Doubles, HoardingQueriesIsCaughtByNoQsAllocatorWatch) {
    expect_caught_only_by("q_hoarder", "NO-Q", {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "MEMORY"});
    const auto t = kvc::testing::load_implementation("double-q_hoarder");
    const auto r = kvc::testing::first_failure(t, "NO-Q", 60);
    ASSERT_TRUE(r.has_value());
    EXPECT_NE(r->reason.find("hidden storage"), std::string::npos) << r->reason;
}

TEST(Doubles, KeepingPastQueriesIsCaughtByNoQ) {
    expect_caught_only_by("q_keeper", "NO-Q", {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "MEMORY", "LAYERS", "GQA"});
}

TEST(Doubles, RewritingAPastRowIsCaughtByAppendOnly) {
    expect_caught_only_by("rewriter", "APPEND-ONLY", {"EQUIV", "CACHE-CONTENT", "NO-Q", "MEMORY", "GQA"});
}

TEST(Doubles, OffByOnePositionIsCaughtByEquiv) {
    expect_caught_only_by("skip_self", "EQUIV", {"CACHE-CONTENT", "APPEND-ONLY", "NO-Q", "MEMORY"});
}

TEST(Doubles, TiledGqaMappingIsCaughtByGqaAndNamed) {
    const auto t = kvc::testing::load_implementation("double-tile");
    const auto r = kvc::testing::first_failure(t, "GQA", 60);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->failed_property, "GQA");
    EXPECT_NE(r->reason.find("'tile'"), std::string::npos) << r->reason;
    EXPECT_FALSE(kvc::testing::first_failure(t, "CACHE-CONTENT", 30).has_value());
}

TEST(Doubles, MisreportedBytesAreCaughtByMemory) {
    expect_caught_only_by("misreport", "MEMORY", {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY"});
}

// A failure replays: the shrunk counterexample, run again, fails the same way.
TEST(Doubles, ShrunkCounterexampleReplays) {
    const auto t = kvc::testing::load_implementation("double-skip_self");
    const auto r = kvc::testing::first_failure(t, "EQUIV", 60);
    ASSERT_TRUE(r.has_value());
    const auto doc = kvc::prop::replay_document(*r);
    const kvc::prop::Case again = kvc::prop::case_from_json(doc["case"]);
    const auto r2 = kvc::prop::evaluate_case(t, *kvc::prop::find_property("EQUIV"), again);
    EXPECT_EQ(r2.verdict, kvc::prop::Verdict::Fail);
    EXPECT_EQ(r2.reason, r->reason);
    // shrinking made it small: one sequence, few tokens
    EXPECT_LE(again.ops.size(), 2u) << kvc::prop::describe(again);
}

} // namespace
