// Non-finite numbers in results (issue 8, item 1): a NaN output is a FAIL with coordinates, shrunk like any other
// failure, and NaN and infinities survive the JSON every result travels in (child protocol, reports, replay files).
// The implementation is the read_past_end double (tests/doubles/read_past_end.cpp): its attention reads one row past
// the end of its storage, into NaN-poisoned slack.
#include "doubles.hpp"

#include <cmath>
#include <limits>

namespace {

using kvc::prop::CaseResult;
using kvc::prop::Verdict;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

uint64_t tokens(const kvc::prop::Case& c) {
    uint64_t n = 0;
    for (const auto& op : c.ops)
        for (const auto& a : op.appends) n += a.n_new;
    return n;
}

TEST(NonFinite, NumbersSpelledAsStringsAndReadBack) {
    using kvc::prop::json_number;
    using kvc::prop::number_from_json;
    EXPECT_EQ(json_number(kNaN), "NaN");
    EXPECT_EQ(json_number(-kNaN), "NaN");
    EXPECT_EQ(json_number(kInf), "Infinity");
    EXPECT_EQ(json_number(-kInf), "-Infinity");
    EXPECT_TRUE(json_number(1.5).is_number());
    EXPECT_EQ(json_number(-0.25).get<double>(), -0.25);
    EXPECT_TRUE(std::isnan(number_from_json("NaN")));
    EXPECT_EQ(number_from_json("Infinity"), kInf);
    EXPECT_EQ(number_from_json("-Infinity"), -kInf);
    EXPECT_EQ(number_from_json(3), 3.0);
    // anything else is refused, with what was found
    for (const char* bad : {"nan", "inf", "", "1.5"}) EXPECT_THROW(number_from_json(bad), std::invalid_argument) << bad;
    EXPECT_THROW(number_from_json(nlohmann::json(nullptr)), std::invalid_argument);
    EXPECT_THROW(number_from_json(nlohmann::json::array()), std::invalid_argument);
}

// The child sends its result as JSON text and the parent parses it: NaN and infinities must come back as they were.
TEST(NonFinite, CaseResultRoundTripsThroughJsonText) {
    CaseResult r;
    r.id = "EQUIV/3";
    r.property = "EQUIV";
    r.verdict = Verdict::Fail;
    r.failed_property = "EQUIV";
    r.headroom = kInf;
    kvc::prop::Mismatch m;
    m.what = "output";
    m.op = 0; m.seq = 1; m.layer = 0; m.pos = 2; m.head = 0; m.dim = 5;
    m.expected = -kInf;
    m.actual = kNaN;
    r.mismatch = m;
    const std::string text = kvc::prop::to_json(r).dump();
    EXPECT_EQ(text.find("null"), std::string::npos) << text;
    const CaseResult back = kvc::prop::case_result_from_json(nlohmann::json::parse(text));
    EXPECT_EQ(back.headroom, kInf);
    ASSERT_TRUE(back.mismatch.has_value());
    EXPECT_TRUE(std::isnan(back.mismatch->actual));
    EXPECT_EQ(back.mismatch->expected, -kInf);
    EXPECT_EQ(back.mismatch->dim, 5);
    EXPECT_NE(kvc::prop::to_json(r)["mismatch"]["text"].get<std::string>().find("expected -Infinity, got NaN"),
              std::string::npos);
    // a number JSON cannot hold any other way is a clear error, not a crash or a silent zero
    nlohmann::json broken = kvc::prop::to_json(r);
    broken["mismatch"]["actual"] = nullptr;
    EXPECT_THROW(kvc::prop::case_result_from_json(broken), std::invalid_argument);
}

// NaN outputs fail EQUIV with the coordinates of a NaN, and the failure is shrunk.
TEST(NonFinite, ReadingPastTheEndFailsEquivWithCoordinates) {
    const auto t = kvc::testing::load_implementation("double-read_past_end");
    const auto r = kvc::testing::first_failure(t, "EQUIV", 30);
    ASSERT_TRUE(r.has_value()) << "the double was not caught by EQUIV in 30 cases";
    EXPECT_EQ(r->verdict, Verdict::Fail) << r->reason;
    EXPECT_EQ(r->failed_property, "EQUIV");
    EXPECT_NE(r->reason.find("NaN in the output"), std::string::npos) << r->reason;
    ASSERT_TRUE(r->mismatch.has_value());
    EXPECT_EQ(r->mismatch->what, "output");
    EXPECT_TRUE(std::isnan(r->mismatch->actual));
    EXPECT_TRUE(std::isfinite(r->mismatch->expected));
    for (int coordinate : {r->mismatch->op, r->mismatch->seq, r->mismatch->layer, r->mismatch->pos,
                           r->mismatch->head, r->mismatch->dim})
        EXPECT_GE(coordinate, 0) << kvc::prop::mismatch_text(*r->mismatch);
    // the shrunk case replays to the same failure
    const auto again = kvc::prop::evaluate_case(t, *kvc::prop::find_property("EQUIV"),
                                                kvc::prop::case_from_json(kvc::prop::replay_document(*r)["case"]));
    EXPECT_EQ(again.verdict, Verdict::Fail);
    EXPECT_EQ(again.reason, r->reason);
}

TEST(NonFinite, NanFailuresAreShrunkLikeAnyOther) {
    const auto t = kvc::testing::load_implementation("double-read_past_end");
    const kvc::prop::Property& p = *kvc::prop::find_property("EQUIV");
    kvc::prop::RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    s.cases = 30;
    int shrunk = 0;
    for (int i = 0; i < s.cases; ++i) {
        const kvc::prop::Case generated = kvc::prop::generate_case(p, s, i, &t.caps);
        const CaseResult r = kvc::prop::run_case(t, p, s, i);
        if (r.verdict != Verdict::Fail) continue;
        EXPECT_LE(tokens(r.counterexample), tokens(generated)) << r.id;
        if (r.shrink_steps > 0 && tokens(r.counterexample) < tokens(generated)) ++shrunk;
        // with shrinking switched off the same case is reported as generated
        kvc::prop::RunSettings none = s;
        none.max_shrink_runs = 0;
        const CaseResult as_is = kvc::prop::run_case(t, p, none, i);
        EXPECT_EQ(as_is.verdict, Verdict::Fail);
        EXPECT_EQ(as_is.shrink_steps, 0);
        EXPECT_EQ(tokens(as_is.counterexample), tokens(generated));
    }
    EXPECT_GT(shrunk, 0) << "no NaN failure was made smaller by shrinking";
}

} // namespace
