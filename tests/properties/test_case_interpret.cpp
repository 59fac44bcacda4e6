// harness::interpret(), the parent's reading of what a case process left behind, tested directly on made-up
// ChildRuns: how it ended (exit, signal, timeout, flood), what its result pipe carried, and the memory limit. The
// CLI tests (tests/cli) reach the same code through real plugins; here each rule is shown in both directions.
#include "kvcheck/harness/case_run.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <string>

namespace {

using kvc::harness::ChildRun;
using kvc::prop::CaseResult;
using kvc::prop::Verdict;

constexpr uint64_t kGiB = uint64_t{1} << 30;

CaseResult fresh() {
    CaseResult r;
    r.id = "EQUIV/3";
    r.property = "EQUIV";
    r.seed = 42;
    return r;
}

// The line a case process sends for its final result.
std::string final_line(const CaseResult& r) { return "F " + kvc::prop::to_json(r).dump() + "\n"; }

// A case that ended with an ERROR whose message is `reason`, flagged out of memory or not.
ChildRun ended_with_error(const std::string& reason, bool out_of_memory) {
    CaseResult r = fresh();
    r.verdict = Verdict::Error;
    r.reason = reason;
    r.out_of_memory = out_of_memory;
    ChildRun run;
    run.result = final_line(r);
    return run;
}

CaseResult read(const ChildRun& run, uint64_t memory_limit = 0, bool asked = false) {
    return kvc::harness::interpret(run, fresh(), nullptr, 30, memory_limit, asked);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// OUT_OF_MEMORY after the case process saw the limit refuse an allocation ("M" before the result, child.cpp).
TEST(Interpret, ACallRefusedForMemoryUnderALimitIsTheLimitsError) {
    ChildRun run = ended_with_error("create failed (OUT_OF_MEMORY): no room", true);
    run.result = "M\n" + run.result;
    const CaseResult r = read(run, kGiB, true);
    EXPECT_EQ(r.verdict, Verdict::Error);
    EXPECT_TRUE(starts_with(r.reason, "the case exceeded its memory limit of 1 GiB")) << r.reason;
    EXPECT_NE(r.reason.find("create failed (OUT_OF_MEMORY): no room"), std::string::npos) << r.reason;
}

// OUT_OF_MEMORY with no refused allocation (an engine whose context is full): the engine's words are the reason,
// and the limit is named only to say it was not the cause.
TEST(Interpret, AnEnginesOwnOutOfMemoryUnderALimitQuotesTheEngine) {
    const CaseResult r =
        read(ended_with_error("create failed (OUT_OF_MEMORY): context full", true), 8 * kGiB, false);
    EXPECT_EQ(r.verdict, Verdict::Error);
    EXPECT_EQ(r.reason, "create failed (OUT_OF_MEMORY): context full");
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(r.notes[0].find("OUT_OF_MEMORY on its own"), std::string::npos) << r.notes[0];
    EXPECT_NE(r.notes[0].find("8 GiB"), std::string::npos) << r.notes[0];
}

// The flag decides, never the message: an implementation's text can say anything.
TEST(Interpret, AMessageThatMerelySaysOutOfMemoryIsNotTheLimit) {
    const CaseResult r = read(ended_with_error("append failed (INVALID_ARGUMENT): OUT_OF_MEMORY bad_alloc", false),
                              kGiB, true);
    EXPECT_EQ(r.verdict, Verdict::Error);
    EXPECT_FALSE(starts_with(r.reason, "the case exceeded")) << r.reason;
}

TEST(Interpret, WithoutALimitARefusalIsTheImplementationsOwnError) {
    const CaseResult r = read(ended_with_error("create failed (OUT_OF_MEMORY): no room", true));
    EXPECT_EQ(r.verdict, Verdict::Error);
    EXPECT_EQ(r.reason, "create failed (OUT_OF_MEMORY): no room");
}

TEST(Interpret, OperatorNewsMarkerUnderALimitIsTheLimit) {
    ChildRun run;
    run.result = "M\n";
    run.end = ChildRun::End::Signaled;
    run.code = SIGABRT;
    const CaseResult r = read(run, kGiB, true);
    EXPECT_EQ(r.verdict, Verdict::Error) << r.reason;
    EXPECT_TRUE(starts_with(r.reason, "the case exceeded its memory limit")) << r.reason;
}

TEST(Interpret, TheFlagSurvivesThePipe) {
    CaseResult r = fresh();
    r.verdict = Verdict::Error;
    r.out_of_memory = true;
    EXPECT_TRUE(kvc::prop::case_result_from_json(kvc::prop::to_json(r)).out_of_memory);
    r.out_of_memory = false;
    EXPECT_FALSE(kvc::prop::to_json(r).contains("out_of_memory")); // absent unless true (docs/cli.md)
    EXPECT_FALSE(kvc::prop::case_result_from_json(kvc::prop::to_json(r)).out_of_memory);
}

TEST(Interpret, APassingResultIsKept) {
    CaseResult pass = fresh();
    ChildRun run;
    run.result = final_line(pass);
    const CaseResult r = read(run, kGiB, true);
    EXPECT_EQ(r.verdict, Verdict::Pass) << r.reason;
}

TEST(Interpret, HowTheProcessEndedWithoutAResult) {
    ChildRun signaled;
    signaled.end = ChildRun::End::Signaled;
    signaled.code = SIGSEGV;
    EXPECT_EQ(read(signaled).verdict, Verdict::Crash);

    ChildRun timed_out;
    timed_out.end = ChildRun::End::TimedOut;
    EXPECT_EQ(read(timed_out).verdict, Verdict::Timeout);

    ChildRun exited0; // exit(0) inside a case: the implementation ended the process
    EXPECT_EQ(read(exited0).verdict, Verdict::Crash);

    ChildRun flooded; // a result line, but the pipe was flooded: not trusted
    flooded.end = ChildRun::End::Flooded;
    flooded.flooded = "its result descriptor";
    flooded.result = final_line(fresh());
    EXPECT_EQ(read(flooded).verdict, Verdict::Error);
}

TEST(Interpret, AResultBesideGarbageIsNotTrusted) {
    ChildRun run;
    run.result = "garbage\n" + final_line(fresh());
    const CaseResult r = read(run);
    EXPECT_EQ(r.verdict, Verdict::Error);
    EXPECT_NE(r.reason.find("not trusted"), std::string::npos) << r.reason;

    run.result = final_line(fresh()); // the same result alone is read as it is
    EXPECT_EQ(read(run).verdict, Verdict::Pass);
}

} // namespace
