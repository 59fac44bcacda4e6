// Writes outside the buffers the harness lends a plugin are caught (issue 13, item 4): every buffer of every call
// sits between guard zones (properties/src/lent.hpp) checked when the call returns. Before the guards, 4 bytes past
// `out` left 3 of 4 cases PASS and 216 bytes past `kvc_memory` left all of them PASS. Each double of
// tests/doubles/overrun_cache.c is the example plugin plus one scribble; the example itself passes every property
// (test_conformance), so what fails here is the scribble.
#include "doubles.hpp"

#include <string>

namespace {

using namespace kvc::prop;

struct Scribble {
    const char* double_name;
    const char* property; // a property whose cases make the call that scribbles
    const char* words;    // what the FAIL must say
};

const Scribble kScribbles[] = {
    {"overrun_out_past", "EQUIV", "wrote 4 bytes past `out` in append_attend"},
    {"overrun_memory_past", "MEMORY", "wrote 216 bytes past `kvc_memory` in memory"},
    {"overrun_memory_past", "NO-Q", "wrote 216 bytes past `kvc_memory` in memory"},
    {"overrun_k_out_before", "CACHE-CONTENT", "wrote 8 bytes before `k_out` in read_kv"},
    {"overrun_length_past", "CACHE-CONTENT", "wrote 4 bytes past `seq_length's out` in seq_length"},
    {"overrun_writes_q", "EQUIV", "wrote into `q`, a const input, in append_attend"},
    {"overrun_batch_out_past", "BATCH", "wrote 4 bytes past `batch out` in append_attend_batch"},
};

// Whether a case appends at least one row: the calls that scribble (append_attend, read_kv after it, seq_length and
// memory after an op) all follow one. A drawn script may be empty.
bool appends_a_row(const Case& c) {
    for (const Op& op : c.ops)
        for (const SeqAppend& a : op.appends)
            if (a.n_new > 0) return true;
    return false;
}

// Every case that makes the call is a FAIL of the property that made it, naming buffer, call and bytes: not 1 in 4.
TEST(Guards, EveryWriteOutsideALentBufferFailsEveryCase) {
    for (const Scribble& s : kScribbles) {
        const Target t = kvc::testing::load_implementation(std::string("double-") + s.double_name);
        const Property& p = *find_property(s.property);
        RunSettings rs;
        rs.seed = kvc::testing::kDoublesSeed;
        rs.cases = 12;
        int ran = 0;
        for (int i = 0; i < rs.cases; ++i) {
            const Case c = generate_case(p, rs, i, &t.caps);
            const CaseResult r = evaluate_case(t, p, c);
            if (r.verdict == Verdict::NotSupported || !appends_a_row(c)) continue;
            ++ran;
            EXPECT_EQ(r.verdict, Verdict::Fail) << s.double_name << " " << s.property << "/" << i << ": "
                                                << verdict_name(r.verdict) << " " << r.reason << "\n" << describe(c);
            EXPECT_EQ(r.failed_property, s.property) << s.double_name;
            EXPECT_NE(r.reason.find(s.words), std::string::npos)
                << s.double_name << " " << s.property << "/" << i << ": " << r.reason;
        }
        EXPECT_GT(ran, 0) << s.double_name << ": every case of " << s.property << " was NOT_SUPPORTED";
    }
}

// The failure is a mismatch a report can show: which bytes, and how many.
TEST(Guards, TheMismatchNamesTheBufferAndTheByteCount) {
    const Target t = kvc::testing::load_implementation("double-overrun_memory_past");
    const auto r = kvc::testing::first_failure(t, "MEMORY", 4);
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->mismatch.has_value());
    EXPECT_EQ(r->mismatch->what, "bytes outside `kvc_memory`");
    EXPECT_EQ(r->mismatch->actual, 216);
    EXPECT_EQ(r->mismatch->expected, 0);
}

// The scribbles do not disturb what the guards are not about: the doubles' arithmetic is the example's.
TEST(Guards, ADoubleThatScribblesOnlyInMemoryStillPassesEquiv) {
    const Target t = kvc::testing::load_implementation("double-overrun_memory_past");
    int passed = 0;
    EXPECT_FALSE(kvc::testing::first_failure(t, "EQUIV", 10, &passed).has_value());
    EXPECT_GT(passed, 0);
}

} // namespace
