// Proof that the properties can fail, and fail for the right reason: each deliberately broken implementation is
// caught by the property it was built to break, and passes the properties that have nothing to do with its bug.
#include "doubles.hpp"
#include "kvcheck/properties/heap.hpp"

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
    if (const char* blind = kvc::prop::heap_watch_blind_reason()) GTEST_SKIP() << blind; // ASan (tools/sanitize.sh)
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

// NO-Q with workspaces: a correct cache may hold a constant workspace of any size up to 256 MiB, declared
// (ABI 1.1 workspace_bytes) or, for an ABI 1.0 plugin, allocated in create() and never grown.
TEST(Doubles, ConstantWorkspacesPassNoQ) {
    for (const char* name : {"ws_64mib", "ws_256mib", "ws_undeclared"}) {
        const auto t = kvc::testing::load_implementation(std::string("double-") + name);
        int passed = 0;
        EXPECT_FALSE(kvc::testing::first_failure(t, "NO-Q", 20, &passed).has_value()) << name;
        EXPECT_GT(passed, 0) << name;
    }
    int passed = 0;
    EXPECT_FALSE(kvc::testing::first_failure(kvc::testing::load_implementation("double-ws_64mib"), "EQUIV", 20, &passed)
                     .has_value());
    EXPECT_GT(passed, 0);
}

// A declared workspace made on the first append, not in create (a correct plugin with a 256 KiB lazy scratch must not
// read as "hidden storage"): passes. The credit is what it declared, not more: 256 KiB beyond the declaration is
// still hidden storage.
TEST(Doubles, AWorkspaceAllocatedWhenFirstNeededPassesNoQUpToItsDeclaration) {
    if (const char* blind = kvc::prop::heap_watch_blind_reason()) GTEST_SKIP() << blind; // ASan (tools/sanitize.sh)
    int passed = 0;
    const auto lazy = kvc::testing::first_failure(kvc::testing::load_implementation("double-ws_lazy"), "NO-Q", 20,
                                                  &passed);
    EXPECT_FALSE(lazy.has_value()) << (lazy ? lazy->reason : "");
    EXPECT_GT(passed, 0);
    const auto over = kvc::testing::first_failure(kvc::testing::load_implementation("double-ws_lazy_over"), "NO-Q", 20);
    ASSERT_TRUE(over.has_value());
    EXPECT_EQ(over->failed_property, "NO-Q");
    EXPECT_NE(over->reason.find("hidden storage"), std::string::npos) << over->reason;
}

// A Q store reported as a workspace that grows with the tokens is still hidden storage.
TEST(Doubles, AGrowingWorkspaceIsCaughtByNoQ) {
    const auto t = kvc::testing::load_implementation("double-ws_grows");
    const auto r = kvc::testing::first_failure(t, "NO-Q", 20);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->failed_property, "NO-Q");
    EXPECT_NE(r->reason.find("workspace changed"), std::string::npos) << r->reason;
}

// A Q store made in create and declared as a constant workspace: constant, so only the Q-store probe sees it (the
// workspace grows with the layers and the sequences by a query row per (layer, sequence, token)).
TEST(Doubles, AQueryStoreDeclaredAsAConstantWorkspaceIsCaughtByNoQ) {
    expect_caught_only_by("ws_q_store", "NO-Q", {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "MEMORY"});
    const auto r = kvc::testing::first_failure(kvc::testing::load_implementation("double-ws_q_store"), "NO-Q", 20);
    ASSERT_TRUE(r.has_value());
    EXPECT_NE(r->reason.find("a store of every query"), std::string::npos) << r->reason;
}

// Scratch that scales with what one call can be given (a batch of every sequence's tokens) is no store: passes, as
// do the fixed workspaces above.
TEST(Doubles, AScratchThatScalesWithOneCallPassesNoQ) {
    int passed = 0;
    const auto r = kvc::testing::first_failure(kvc::testing::load_implementation("double-ws_batch_scratch"), "NO-Q",
                                               40, &passed);
    EXPECT_FALSE(r.has_value()) << r->reason;
    EXPECT_GT(passed, 0);
}

// Scales other than 1/sqrt(d) are drawn: a kernel that ignores config.scale fails EQUIV and nothing unrelated.
TEST(Doubles, AHardCodedSoftmaxScaleIsCaughtByEquiv) {
    expect_caught_only_by("fixed_scale", "EQUIV", {"CACHE-CONTENT", "APPEND-ONLY", "NO-Q", "MEMORY"});
}

// head_dim granularity (ABI 1.1): cases are drawn inside it, so nothing ERRORs; a case outside is NOT_SUPPORTED.
TEST(Doubles, HeadDimMultiplesAreRespected) {
    using namespace kvc::prop;
    const auto t = kvc::testing::load_implementation("double-hd_multiple");
    ASSERT_EQ(t.caps.head_dim_multiple, 8u);
    for (const char* id : {"EQUIV", "CACHE-CONTENT", "NO-Q", "RELEASE"}) {
        int passed = 0;
        EXPECT_FALSE(kvc::testing::first_failure(t, id, 30, &passed).has_value()) << id;
        EXPECT_GT(passed, 0) << id;
    }
    // with RoPE the multiple is 16 (RoPE is drawn where declared: both variants here)
    kvc_caps limits{};
    limits.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    limits.head_dim_multiple = 8;
    limits.head_dim_multiple_rope = 16;
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    s.cases = 100;
    int with_rope = 0;
    for (const char* id : {"EQUIV", "GQA", "LAYERS"})
        for (int i = 0; i < s.cases; ++i) {
            const Case c = generate_case(*find_property(id), s, i, &limits);
            const uint32_t m = c.cfg.rope != KVC_ROPE_NONE ? 16 : 8;
            with_rope += c.cfg.rope != KVC_ROPE_NONE;
            EXPECT_EQ(c.cfg.head_dim % m, 0u) << describe(c);
        }
    EXPECT_GT(with_rope, 0);
    // a replayed case outside the granularity
    Case c = generate_case(*find_property("EQUIV"), s, 3, &t.caps);
    c.cfg.head_dim = 12;
    c.cfg.rope = KVC_ROPE_NONE; // (with RoPE the multiple is 16)
    const CaseResult r = evaluate_case(t, *find_property("EQUIV"), c);
    EXPECT_EQ(r.verdict, Verdict::NotSupported) << r.reason;
    EXPECT_NE(r.reason.find("head_dim 12 not a multiple of 8"), std::string::npos) << r.reason;
}

// Stale tail slots: RELEASE fills a sequence with extreme rows before releasing it, so a cache whose softmax max
// runs over the stale slots of a reused sequence fails; the same case without the extreme rows passes.
TEST(Doubles, StaleTailSlotsAreCaughtByReleaseThroughTheExtremeFill) {
    using namespace kvc::prop;
    const auto t = kvc::testing::load_implementation("double-stale_reader");
    const auto r = kvc::testing::first_failure(t, "RELEASE", 60);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->verdict, Verdict::Fail);
    EXPECT_EQ(r->failed_property, "RELEASE");
    Case plain = r->counterexample;
    int extreme = 0;
    for (Op& op : plain.ops)
        for (SeqAppend& a : op.appends) {
            extreme += a.extreme;
            a.extreme = false;
        }
    EXPECT_GT(extreme, 0) << describe(plain);
    const CaseResult without = evaluate_case(t, *find_property("RELEASE"), plain);
    EXPECT_EQ(without.verdict, Verdict::Pass) << without.reason << "\n" << describe(plain);
    // the correct base of the same source passes RELEASE (the extreme rows themselves are no false alarm)
    int passed = 0;
    EXPECT_FALSE(kvc::testing::first_failure(kvc::testing::load_implementation("double-ws_64mib"), "RELEASE", 30,
                                             &passed)
                     .has_value());
    EXPECT_GT(passed, 0);
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
