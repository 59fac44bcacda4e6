// ABI 1.3 pipeline rules: a pipeline per cache dtype and call shape, graded call by call (docs/tolerance.md, "A
// pipeline per cache dtype and call shape"). A ggml-like kernel (tests/doubles/pipeline_cache.cpp, PIPE_GGML_*)
// passes when it declares its paths, fails when it declares less than one of them does, and a failure names the
// rule that graded it.
#include "doubles.hpp"

#include "kvcheck/properties/properties.hpp"
#include "kvcheck/properties/tolerance.hpp"

#include <algorithm>
#include <iostream>

namespace {

using namespace kvc::prop;

constexpr uint32_t C = KVC_ROUND_CACHE;
constexpr kvc_pipeline kF32 = {0, 0, 0, 0, 0, 0, KVC_PIPELINE_DECLARED};
constexpr kvc_pipeline kQAccum = {C, 0, 0, 0, C, 0, KVC_PIPELINE_DECLARED};
constexpr kvc_pipeline kQ = {C, 0, 0, 0, 0, 0, KVC_PIPELINE_DECLARED};

// The rules the ggml-like double declares: f16 from 64 rows f32, f16 otherwise q and accumulator, bf16 q.
kvc_caps ggml_caps() {
    kvc_caps c{};
    c.struct_size = sizeof c;
    c.dtypes = 0x7;
    c.pipeline = kF32;
    c.n_pipeline_rules = 3;
    c.pipeline_rules[0] = {1u << KVC_DTYPE_F16, 64, kF32};
    c.pipeline_rules[1] = {1u << KVC_DTYPE_F16, 0, kQAccum};
    c.pipeline_rules[2] = {1u << KVC_DTYPE_BF16, 0, kQ};
    return c;
}

TEST(PipelineRules, TheFirstRuleCoveringTheDtypeAndLengthGrades) {
    const kvc_caps c = ggml_caps();
    Pipeline q_accum;
    q_accum.q = q_accum.accum = C;
    Pipeline q_only;
    q_only.q = C;
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_F16, 63).rule, 1);
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_F16, 63).pipeline, q_accum);
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_F16, 64).rule, 0);
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_F16, 64).pipeline, Pipeline{});
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_F16, 1).rule, 1);
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_BF16, 500).rule, 2);
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_BF16, 500).pipeline, q_only);
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_F32, 1).rule, -1); // no rule: the default pipeline
    EXPECT_EQ(graded_by_name(c, 0), "pipeline rule 1 (f16, n >= 64)");
    EXPECT_EQ(graded_by_name(c, 2), "pipeline rule 3 (bf16)");
    EXPECT_EQ(graded_by_name(c, -1), "the default pipeline");
    kvc_caps every = c; // dtype bits 0: every dtype
    every.pipeline_rules[0].cache_dtypes = 0;
    EXPECT_EQ(pipeline_for(every, KVC_DTYPE_F32, 64).rule, 0);
    EXPECT_EQ(pipeline_for(every, KVC_DTYPE_F32, 63).rule, -1);
    EXPECT_EQ(graded_by_name(every, 0), "pipeline rule 1 (every dtype, n >= 64)");
}

TEST(PipelineRules, ATableOfAnOlderKvcCapsHasNoRules) {
    kvc_caps c = ggml_caps();
    c.struct_size = offsetof(kvc_caps, n_pipeline_rules); // a 1.2 plugin's kvc_caps
    EXPECT_TRUE(pipeline_rules(c).empty());
    EXPECT_EQ(pipeline_for(c, KVC_DTYPE_F16, 1).rule, -1);
    EXPECT_EQ(pipeline_rules_problem(c), "");
}

void refused(const kvc_caps& c, const std::string& words) {
    const std::string why = pipeline_rules_problem(c);
    EXPECT_NE(why.find(words), std::string::npos) << "\"" << why << "\" does not say \"" << words << "\"";
}

TEST(PipelineRules, InconsistentTablesAreRefusedAtLoad) {
    EXPECT_EQ(pipeline_rules_problem(ggml_caps()), "");
    kvc_caps c = ggml_caps();
    c.n_pipeline_rules = 9;
    refused(c, "n_pipeline_rules 9 is above KVC_MAX_PIPELINE_RULES (8)");
    c = ggml_caps();
    c.pipeline_rules[1].pipeline.flags = 0;
    refused(c, "pipeline rule 2: its pipeline lacks KVC_PIPELINE_DECLARED");
    c = ggml_caps();
    c.pipeline_rules[2].pipeline.accum = 7;
    refused(c, "pipeline rule 3: a stage other than q is 7");
    c = ggml_caps();
    c.pipeline_rules[0].pipeline.q = 9;
    refused(c, "pipeline rule 1: stage q is 9");
    c = ggml_caps();
    c.pipeline_rules[2].cache_dtypes = 1u << KVC_DTYPE_Q8_0;
    refused(c, "pipeline rule 3 covers q8_0, a cache dtype the plugin does not declare");
    c = ggml_caps(); // q8_0 codes are stored one way whatever the call
    c.dtypes |= 1u << KVC_DTYPE_Q8_0;
    c.pipeline.flags |= KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN;
    c.pipeline_rules[2].cache_dtypes = 1u << KVC_DTYPE_Q8_0;
    refused(c, "pipeline rule 3 declares the q8_0 rounding ref but the pipeline declares x86");
    c.pipeline_rules[2].pipeline.flags |= KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN;
    EXPECT_EQ(pipeline_rules_problem(c), "");
    c.pipeline_rules[1].cache_dtypes = 0; // every dtype, q8_0 included
    refused(c, "pipeline rule 2 declares the q8_0 rounding ref");
}

TEST(PipelineRules, APluginWithARefusedTableDoesNotLoad) {
    const Target good = kvc::testing::load_implementation("double-pipe_ggml_rules"); // the valid table loads
    EXPECT_EQ(pipeline_rules(good.caps).size(), 3u);
    try {
        kvc::testing::load_implementation("double-pipe_ggml_bad_rules");
        FAIL() << "a rule covering an undeclared dtype was not refused";
    } catch (const LoadError& e) {
        EXPECT_NE(std::string(e.what()).find("pipeline rule 3 covers q8_0, a cache dtype the plugin does not declare"),
                  std::string::npos)
            << e.what();
    }
}

// The worst headroom of `cases` EQUIV cases and whether any was graded by `rule`; every case must pass.
struct Sweep {
    double worst = 0;
    int graded_by_rule = 0, passed = 0;
    int edge[3] = {0, 0, 0}; // cases appending a chunk of 63, 64, 65 rows
};
Sweep sweep(const std::string& name, int cases, const std::string& rule) {
    const auto t = kvc::testing::load_implementation("double-" + name);
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    s.cases = cases;
    Sweep w;
    for (int i = 0; i < cases; ++i) {
        const CaseResult r = run_case(t, *find_property("EQUIV"), s, i);
        EXPECT_TRUE(r.verdict == Verdict::Pass || r.verdict == Verdict::NotSupported)
            << name << " " << r.id << " (seed " << s.seed << "): " << verdict_name(r.verdict) << " " << r.reason;
        if (r.verdict == Verdict::Pass) ++w.passed;
        w.worst = std::max(w.worst, r.headroom);
        if (std::find(r.graded_by.begin(), r.graded_by.end(), rule) != r.graded_by.end()) ++w.graded_by_rule;
        for (uint32_t n : {63u, 64u, 65u})
            w.edge[n - 63] += std::any_of(r.counterexample.ops.begin(), r.counterexample.ops.end(), [n](const Op& op) {
                return std::any_of(op.appends.begin(), op.appends.end(), [n](const SeqAppend& a) { return a.n_new == n; });
            });
    }
    std::cout << name << ": " << w.passed << " PASS of " << cases << " EQUIV cases, worst headroom " << w.worst
              << ", " << w.graded_by_rule << " graded by " << rule << ", chunks of 63/64/65 rows in " << w.edge[0]
              << "/" << w.edge[1] << "/" << w.edge[2] << " cases (seed " << s.seed << ")\n";
    return w;
}

TEST(PipelineRules, AKernelDeclaringItsPathsPassesEveryProperty) {
    const auto t = kvc::testing::load_implementation("double-pipe_ggml_rules");
    for (const Property& p : properties()) {
        int passed = 0;
        const auto r = kvc::testing::first_failure(t, p.id, 40, &passed);
        EXPECT_FALSE(r.has_value()) << p.id << ": " << (r ? r->reason : std::string());
    }
    // the f16 tiled path's rule and the short-call rule both grade cases: the chunk lengths reach both sides of 64
    const Sweep w = sweep("pipe_ggml_rules", 100, "pipeline rule 1 (f16, n >= 64)");
    EXPECT_GT(w.graded_by_rule, 0);
    for (int k = 0; k < 3; ++k) EXPECT_GT(w.edge[k], 0) << "no chunk of " << 63 + k << " rows drawn";
    EXPECT_GT(sweep("pipe_ggml_rules", 100, "pipeline rule 2 (f16)").graded_by_rule, 0);
}

TEST(PipelineRules, TheSameKernelDeclaringF32ForEveryCallFails) {
    const auto t = kvc::testing::load_implementation("double-pipe_ggml_f32");
    const auto r = kvc::testing::first_failure(t, "EQUIV", 100);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->failed_property, "EQUIV");
    EXPECT_NE(r->reason.find("exceeds the bound"), std::string::npos) << r->reason;
}

TEST(PipelineRules, SixteenBitAccumulationOnALongChunkFailsAndNamesTheRuleThatGradedIt) {
    const auto t = kvc::testing::load_implementation("double-pipe_ggml_long16");
    const auto r = kvc::testing::first_failure(t, "EQUIV", 200);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->failed_property, "EQUIV");
    EXPECT_NE(r->reason.find("graded by pipeline rule 1 (f16, n >= 64)"), std::string::npos) << r->reason;
    const bool long_chunk = std::any_of(r->counterexample.ops.begin(), r->counterexample.ops.end(), [](const Op& op) {
        return std::any_of(op.appends.begin(), op.appends.end(), [](const SeqAppend& a) { return a.n_new >= 64; });
    });
    EXPECT_TRUE(long_chunk) << describe(r->counterexample);
    EXPECT_EQ(r->counterexample.cfg.cache_dtype, uint32_t{KVC_DTYPE_F16});
    // the report carries the name too, in the case's "graded_by"
    EXPECT_EQ(to_json(*r).at("graded_by"), nlohmann::json({"pipeline rule 1 (f16, n >= 64)"}));
}

TEST(PipelineRules, RulesGradeTighterThanTheLoosestSinglePipeline) {
    const Sweep rules = sweep("pipe_ggml_rules", 200, "pipeline rule 1 (f16, n >= 64)");
    const Sweep loosest = sweep("pipe_ggml_loosest", 200, "");
    EXPECT_GT(rules.passed, 100);
    EXPECT_GT(loosest.passed, 100);
    EXPECT_LT(loosest.worst, rules.worst);
}

} // namespace
