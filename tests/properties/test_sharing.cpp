// Caches whose fork shares blocks: FORK and RELEASE release one side of a fork while the other still
// shares its blocks and then reuse them, and a cache that declares KVC_FEATURE_FORK_SHARES is held to it by FORK and
// MEMORY. Each rule both ways: the doubles of tests/doubles/shared_block_cache.cpp that break it fail the right
// property with the cause named, and the correct ones (sharing, or copying and saying so) pass.
#include "doubles.hpp"
#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/runner.hpp"

#include <gtest/gtest.h>

#include <iostream>

namespace {

using namespace kvc::prop;
using kvc::testing::first_failure;
using kvc::testing::load_implementation;

constexpr int kDefaultCases = 30; // what `kvcheck validate` runs per property

using kvc::testing::contains;

// Whether the case forks a sequence, releases one side while the other still holds the shared rows, restarts the
// released one with at least as many rows as it held, and appends to the survivor after that.
bool releases_while_shared(const Case& c) {
    for (size_t i = 0; i < c.ops.size(); ++i) {
        if (c.ops[i].kind != OpKind::Fork) continue;
        const uint32_t parent = c.ops[i].seq, child = c.ops[i].child;
        size_t r = i + 1;
        while (r < c.ops.size() && c.ops[r].kind == OpKind::Append && c.ops[r].appends.size() == 1 &&
               c.ops[r].appends[0].extreme)
            ++r; // RELEASE's stale fill of the side about to go
        if (r + 2 >= c.ops.size() || c.ops[r].kind != OpKind::Release) continue;
        const uint32_t gone = c.ops[r].seq;
        if (gone != parent && gone != child) continue;
        const uint32_t survivor = gone == parent ? child : parent;
        const Op& restart = c.ops[r + 1];
        const Op& after = c.ops[r + 2];
        if (restart.kind == OpKind::Append && restart.appends.size() == 1 && restart.appends[0].seq == gone &&
            after.kind == OpKind::Append && after.appends.size() == 1 && after.appends[0].seq == survivor)
            return true;
    }
    return false;
}

// The generator half of the rule: every FORK and RELEASE case of a default run has the scenario, for a cache that
// declares fork and release; a cache with only one of them keeps cases it can run.
TEST(SharingCases, ForkAndReleaseReleaseOneSideWhileTheOtherShares) {
    const auto t = load_implementation("double-share_correct");
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    s.cases = kDefaultCases;
    for (const char* id : {"FORK", "RELEASE"}) {
        int with = 0;
        for (int i = 0; i < s.cases; ++i) with += releases_while_shared(generate_case(*find_property(id), s, i, &t.caps));
        std::cout << id << ": " << with << " of " << s.cases << " cases release a side of a fork that still shares\n";
        EXPECT_EQ(with, s.cases) << id;
    }
    kvc_caps release_only = t.caps;
    release_only.features &= ~(KVC_FEATURE_FORK | KVC_FEATURE_FORK_SHARES);
    for (int i = 0; i < s.cases; ++i) {
        const Case c = generate_case(*find_property("RELEASE"), s, i, &release_only);
        for (const Op& op : c.ops) EXPECT_NE(op.kind, OpKind::Fork) << "RELEASE case " << i << " forks";
    }
    kvc_caps fork_only = t.caps;
    fork_only.features &= ~KVC_FEATURE_RELEASE;
    for (int i = 0; i < s.cases; ++i) {
        const Case c = generate_case(*find_property("FORK"), s, i, &fork_only);
        for (const Op& op : c.ops) EXPECT_NE(op.kind, OpKind::Release) << "FORK case " << i << " releases";
    }
}

TEST(SharingDoubles, CorrectCachesPass) {
    // share_correct shares full blocks and declares it; share_copies_honest copies every block and does not
    for (const char* name : {"double-share_correct", "double-share_copies_honest"}) {
        const auto t = load_implementation(name);
        for (const char* id : {"FORK", "RELEASE", "MEMORY", "APPEND-ONLY", "EQUIV", "CACHE-CONTENT", "NO-Q"}) {
            const std::string p = id;
            const int cases = p == "FORK" || p == "RELEASE" || p == "MEMORY" ? kDefaultCases : 12;
            int passed = 0;
            const auto r = first_failure(t, id, cases, &passed);
            EXPECT_FALSE(r.has_value()) << name << " " << id << ": " << (r ? r->reason : "");
            EXPECT_GT(passed, 0) << name << " " << id;
            std::cout << name << " " << id << ": " << passed << " of " << cases << " cases PASS\n";
        }
    }
}

// A fixed page longer than a sequence a case lets grow is honest (TensorRT-LLM's 128-token pages): the paged double
// with 128-token pages passes MEMORY and the properties that fork and release, held to whole pages.
TEST(SharingDoubles, FixedPagesLongerThanASequencePass) {
    const auto t = load_implementation("double-share_pages_128");
    for (const char* id : {"MEMORY", "FORK", "RELEASE", "NO-Q"}) {
        int passed = 0;
        const auto r = first_failure(t, id, kDefaultCases, &passed);
        EXPECT_FALSE(r.has_value()) << id << ": " << (r ? r->reason : "");
        EXPECT_GT(passed, 0) << id;
        std::cout << "share_pages_128 " << id << ": " << passed << " of " << kDefaultCases << " cases PASS\n";
    }
}

// Pages of 1024 tokens, past max_tokens and past the 256 a fixed page may hold, would let capacity run far past the
// rows held: MEMORY fails naming the block size.
TEST(SharingDoubles, HugePagesFailMemory) {
    const auto t = load_implementation("double-share_pages_huge");
    const auto r = first_failure(t, "MEMORY", kDefaultCases);
    ASSERT_TRUE(r.has_value()) << "1024-token pages passed MEMORY";
    EXPECT_EQ(r->verdict, Verdict::Fail);
    contains(r->reason, "reported block size 1024 is outside 1 ..");
}

// A release that frees blocks a fork sibling still holds: the restart reuses them and the survivor's rows change.
TEST(SharingDoubles, FreeingSharedBlocksFailsForkAndReleaseNamingTheBlock) {
    const auto t = load_implementation("double-share_frees_shared");
    for (const char* id : {"FORK", "RELEASE"}) {
        const auto r = first_failure(t, id, kDefaultCases);
        ASSERT_TRUE(r.has_value()) << "frees_shared was not caught by " << id;
        EXPECT_EQ(r->verdict, Verdict::Fail) << id;
        EXPECT_EQ(r->failed_property, id);
        contains(r->reason, "a row read back earlier changed");
        contains(r->reason, "(block ");
        contains(r->reason, "until its release) changed (first: row ");
        contains(r->reason, "after that release");
        contains(r->reason, "freed a block the surviving sequence still shares");
    }
}

// Declared sharing that is not there: a shared block counted per sequence, or every block copied.
TEST(SharingDoubles, SharingClaimedButNotDoneFailsForkAndMemory) {
    for (const char* name : {"double-share_counts_twice", "double-share_copies"}) {
        const auto t = load_implementation(name);
        const auto fork = first_failure(t, "FORK", kDefaultCases);
        ASSERT_TRUE(fork.has_value()) << name << " was not caught by FORK";
        EXPECT_EQ(fork->verdict, Verdict::Fail) << name;
        EXPECT_EQ(fork->failed_property, "FORK");
        contains(fork->reason, "grew the reported capacity by");
        contains(fork->reason, "KVC_FEATURE_FORK_SHARES");
        const auto memory = first_failure(t, "MEMORY", kDefaultCases);
        ASSERT_TRUE(memory.has_value()) << name << " was not caught by MEMORY";
        EXPECT_EQ(memory->verdict, Verdict::Fail) << name;
        EXPECT_EQ(memory->failed_property, "MEMORY");
        contains(memory->reason, "each full block a fork shares is counted once");
        // the rows are right: the properties that do not judge the sharing claim pass
        for (const char* id : {"RELEASE", "APPEND-ONLY", "EQUIV"}) {
            int passed = 0;
            const auto r = first_failure(t, id, 12, &passed);
            EXPECT_FALSE(r.has_value()) << name << " " << id << ": " << (r ? r->reason : "");
            EXPECT_GT(passed, 0) << name << " " << id;
        }
    }
}

// The CPU engine shares every block on fork (the partly filled last one too, copied on write) and declares it.
TEST(SharingCases, TheCpuEngineDeclaresForkSharesAndKeepsIt) {
    const auto t = load_implementation("cpu");
    ASSERT_TRUE(t.caps.features & KVC_FEATURE_FORK_SHARES);
    for (const char* id : {"FORK", "RELEASE", "MEMORY"}) {
        int passed = 0;
        const auto r = first_failure(t, id, kDefaultCases, &passed);
        EXPECT_FALSE(r.has_value()) << id << ": " << (r ? r->reason : "");
        EXPECT_GT(passed, 0) << id;
    }
}

} // namespace
