// Every property against every implementation in the build, through the ABI, with RapidCheck. The properties are
// written once (properties/); this file only pairs them with implementations.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "implementations.hpp"
#include "kvcheck/abi.hpp"
#include "kvcheck/properties/properties.hpp"
#include "kvcheck/properties/runner.hpp"

#include <cmath>
#include <set>
#include <tuple>

namespace {

using namespace kvc::prop;

// The runner draws a case's dtype and RoPE variant among those declared (runner.cpp), so a narrow declaration is not
// mostly NOT_SUPPORTED; an implementation that declares f32, f16, bf16 and both RoPE variants draws, seed for seed,
// what a run with no declaration at all draws (the cases it always drew).
TEST(Generators, DrawDtypeAndRopeInsideTheDeclaration) {
    RunSettings s;
    s.cases = 30;
    kvc_caps narrow = full_caps();
    narrow.dtypes = 1u << KVC_DTYPE_F16;
    narrow.rope_variants = 0;
    kvc_caps gptj = full_caps();
    gptj.dtypes = (1u << KVC_DTYPE_F32) | (1u << KVC_DTYPE_BF16);
    gptj.rope_variants = 1u << KVC_ROPE_GPTJ;
    const kvc_caps everything = full_caps();
    for (const Property& p : properties())
        for (int i = 0; i < s.cases; ++i) {
            const Case a = generate_case(p, s, i, &narrow);
            EXPECT_EQ(a.cfg.cache_dtype, uint32_t{KVC_DTYPE_F16}) << p.id << "/" << i;
            EXPECT_EQ(a.cfg.rope, uint32_t{KVC_ROPE_NONE}) << p.id << "/" << i;
            const Case b = generate_case(p, s, i, &gptj);
            EXPECT_NE(b.cfg.cache_dtype, uint32_t{KVC_DTYPE_F16}) << p.id << "/" << i;
            EXPECT_NE(b.cfg.rope, uint32_t{KVC_ROPE_NEOX}) << p.id << "/" << i;
            EXPECT_EQ(to_json(generate_case(p, s, i, &everything)), to_json(generate_case(p, s, i, nullptr)))
                << p.id << "/" << i;
        }
}

class Conformance : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Conformance, PropertyHolds) {
    const auto& [impl, id] = GetParam();
    const Target t = kvc::testing::load_implementation(impl);
    const Property& p = *find_property(id);
    if (p.feature && !(t.caps.features & p.feature))
        GTEST_SKIP() << impl << " does not declare the capability " << id << " is about (reported NOT_SUPPORTED)";
    if (id == "LONG") { // thousands of tokens per case: 20 cases from CI's seed, not RapidCheck's 200
        RunSettings s;
        s.cases = 20;
        for (int i = 0; i < s.cases; ++i) { // drawn only from what the implementation declares, sizes ramping up
            const Case c = p.gen(t.caps)(rc::Random(case_seed(s.seed, id, i)), i * 100 / (s.cases - 1)).value();
            const CaseResult r = evaluate_case(t, p, c);
            EXPECT_TRUE(r.verdict == Verdict::Pass || r.verdict == Verdict::QualityWarning)
                << "LONG/" << i << " (run seed " << s.seed << ") " << verdict_name(r.verdict) << ": " << r.reason
                << "\n" << describe(c);
        }
        return;
    }
    const bool ok = rc::check(id + " on " + impl, [&] {
        const Case c = *p.gen(t.caps); // drawn only from what the implementation declares
        const CaseResult r = evaluate_case(t, p, c);
        if (r.verdict == Verdict::Pass || r.verdict == Verdict::QualityWarning) return;
        std::string where = r.mismatch ? "\n  first mismatch: " + r.mismatch->describe() : "";
        RC_FAIL(std::string(verdict_name(r.verdict)) + " [" + (r.failed_property.empty() ? id : r.failed_property) +
                "] " + r.reason + where + "\n" + describe(c));
    });
    EXPECT_TRUE(ok) << id << " failed on " << impl << " (RapidCheck printed the seed and the shrunk case above)";
}

// ---- what the generated cases exercise (issue 8): counted over the cases `kvcheck validate` draws ----

std::vector<Case> drawn(const std::string& id, int n) {
    RunSettings s;
    s.cases = n;
    std::vector<Case> cs;
    for (int i = 0; i < n; ++i) cs.push_back(generate_case(*find_property(id), s, i));
    return cs;
}

// Every FORK case forks at least twice, each fork followed by appends to the child and to the parent; every
// RELEASE case releases at least twice, each release followed by an append to the sequence it released, after
// extreme rows filled its tail.
TEST(Generators, ForkAndReleaseCasesExerciseTheirOperation) {
    for (const Case& c : drawn("FORK", 100)) {
        int forks = 0;
        for (size_t i = 0; i < c.ops.size(); ++i) {
            if (c.ops[i].kind != OpKind::Fork) continue;
            ++forks;
            bool child = false, parent = false;
            for (size_t j = i + 1; j < c.ops.size(); ++j)
                for (const SeqAppend& a : c.ops[j].appends) {
                    child = child || (a.seq == c.ops[i].child && a.n_new > 0);
                    parent = parent || (a.seq == c.ops[i].seq && a.n_new > 0);
                }
            EXPECT_TRUE(child && parent) << "fork at op " << i << " not followed by appends to both sides\n"
                                         << describe(c);
        }
        EXPECT_GE(forks, 2) << describe(c);
    }
    for (const Case& c : drawn("RELEASE", 100)) {
        int releases = 0;
        for (size_t i = 0; i < c.ops.size(); ++i) {
            if (c.ops[i].kind != OpKind::Release) continue;
            bool reused = false;
            for (size_t j = i + 1; j < c.ops.size(); ++j)
                for (const SeqAppend& a : c.ops[j].appends) reused = reused || (a.seq == c.ops[i].seq && a.n_new > 0);
            releases += reused;
            ASSERT_GT(i, 0u);
            const auto& before = c.ops[i - 1].appends;
            EXPECT_TRUE(before.size() == 1 && before[0].seq == c.ops[i].seq && before[0].extreme)
                << "release at op " << i << " without an extreme fill before it\n" << describe(c);
        }
        EXPECT_GE(releases, 2) << describe(c);
    }
}

// Forks happen at lengths around block boundaries: the hint's or the common sizes 16 .. 256.
TEST(Generators, ForksHappenAroundBlockBoundaries) {
    int at_boundary = 0, forks = 0;
    for (const Case& c : drawn("FORK", 100)) {
        const auto lens = lengths_after_ops(c);
        for (size_t i = 0; i < c.ops.size(); ++i) {
            if (c.ops[i].kind != OpKind::Fork) continue;
            ++forks;
            const uint32_t n = lens[i][c.ops[i].seq];
            bool near = false;
            for (uint32_t b : {c.cfg.block_size_hint, 16u, 32u, 64u, 128u, 256u})
                if (b > 1) near = near || n % b == 0 || n % b == 1 || n % b == b - 1;
            at_boundary += near;
        }
    }
    EXPECT_GT(at_boundary, forks * 3 / 4) << at_boundary << " of " << forks;
}

// Scale and RoPE base vary; head_dim reaches 256; sequence ids reach past 8, 16 and 64; lengths pass 256.
TEST(Generators, ConfigsCoverScalesBasesAndSizes) {
    std::set<float> thetas;
    int scale_default = 0, scale_one = 0, scale_inv_d = 0, scale_other = 0, hd256 = 0, seq_ge_64 = 0, long_len = 0;
    for (const char* id : {"EQUIV", "CACHE-CONTENT", "RELEASE", "GQA"})
        for (const Case& c : drawn(id, 200)) {
            const float sc = c.cfg.scale();
            const float inv_sqrt = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.cfg.head_dim)));
            if (c.cfg.softmax_scale == 0.0f || sc == inv_sqrt) ++scale_default;
            else if (sc == 1.0f) ++scale_one;
            else if (sc == 1.0f / static_cast<float>(c.cfg.head_dim)) ++scale_inv_d;
            else {
                ++scale_other;
                EXPECT_TRUE(sc >= 0.01f && sc <= 2.0f) << sc;
            }
            thetas.insert(c.cfg.rope_theta);
            EXPECT_TRUE(c.cfg.rope_theta >= 100.0f && c.cfg.rope_theta <= 1e6f) << c.cfg.rope_theta;
            hd256 += c.cfg.head_dim == 256;
            for (const Op& op : c.ops)
                for (const SeqAppend& a : op.appends) seq_ge_64 += a.seq >= 64;
            for (const auto& l : lengths_after_ops(c))
                for (uint32_t n : l) long_len += n > 256;
        }
    EXPECT_GT(scale_default, 0);
    EXPECT_GT(scale_one, 0);
    EXPECT_GT(scale_inv_d, 0);
    EXPECT_GT(scale_other, 0);
    EXPECT_TRUE(thetas.count(500000.0f) && thetas.count(1e6f) && thetas.count(100.0f) && thetas.count(10000.0f));
    EXPECT_GT(thetas.size(), 10u);
    EXPECT_GT(hd256, 0);
    EXPECT_GT(seq_ge_64, 0);
    EXPECT_GT(long_len, 0);
}

// LONG: 1k - 8k tokens, lengths at 2^k and 2^k +- 1, chunks of 63 / 64 / 65 over 511 / 512 / 513 cached.
TEST(Generators, LongCasesReachThousandsOfTokens) {
    uint32_t longest = 0;
    int pow2ish = 0, over_1k = 0;
    for (const Case& c : drawn("LONG", 100)) {
        uint32_t n = 0;
        for (const auto& l : lengths_after_ops(c))
            for (uint32_t x : l) n = std::max(n, x);
        longest = std::max(longest, n);
        over_1k += n >= 1000;
        const uint32_t first = c.ops.at(0).appends.at(0).n_new;
        for (uint32_t k = 8; k <= 13; ++k)
            pow2ish += first + 1 == (1u << k) || first == (1u << k) || first == (1u << k) + 1;
    }
    EXPECT_GE(longest, 4096u);
    EXPECT_GT(over_1k, 40);
    EXPECT_GT(pow2ish, 40);
}

std::vector<std::string> property_ids() {
    std::vector<std::string> ids;
    for (const Property& p : properties()) ids.push_back(p.id);
    return ids;
}

std::string test_name(const ::testing::TestParamInfo<Conformance::ParamType>& info) {
    std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
    for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return s;
}

INSTANTIATE_TEST_SUITE_P(AllImplementations, Conformance,
                         ::testing::Combine(::testing::ValuesIn(kvc::testing::implementation_names()),
                                            ::testing::ValuesIn(property_ids())),
                         test_name);

} // namespace
