// Latent-attention (MLA) and partial-rotary caches (ABI 1.2's head_dim_v and RoPE range, docs/windowed-caches.md):
// the case's JSON and capabilities, the oracle's V and RoPE dims against numbers worked by hand, the memory formula,
// what the generators draw for a cache that declares them and for one that does not, and the doubles of
// tests/doubles/mla_cache.cpp end to end: the correct cache passes, each bug fails its property with its mechanism
// named.
#include "doubles.hpp"
#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/runner.hpp"

#include <gtest/gtest.h>

#include <iostream>

namespace {

using namespace kvc::prop;
using kvc::testing::first_failure;
using kvc::testing::load_implementation;

using kvc::testing::contains;

// MLA's form at a small size: one KV head read by two query heads, K = 8 latent dims + 2 RoPE dims, V = 8 dims.
Case latent_case() {
    Case c;
    c.cfg.n_q_heads = 2;
    c.cfg.head_dim = 10;
    c.cfg.head_dim_v = 8;
    c.cfg.rope = KVC_ROPE_NEOX;
    c.cfg.rope_dim_begin = 8;
    c.cfg.rope_dims = 2;
    c.ops.push_back({});
    c.ops.back().appends.push_back({0, 5, false});
    return c;
}

TEST(LatentCase, JsonRoundTripsAndOtherCasesAreWrittenAsBefore) {
    const Case c = latent_case();
    const Case back = case_from_json(to_json(c));
    EXPECT_EQ(back.cfg.head_dim_v, 8u);
    EXPECT_EQ(back.cfg.rope_dim_begin, 8u);
    EXPECT_EQ(back.cfg.rope_dims, 2u);
    EXPECT_EQ(to_json(back), to_json(c));
    Case plain = c;
    plain.cfg.head_dim_v = plain.cfg.rope_dim_begin = plain.cfg.rope_dims = 0;
    for (const char* key : {"head_dim_v", "rope_dim_begin", "rope_dims"})
        EXPECT_FALSE(to_json(plain)["config"].contains(key)) << key;
    nlohmann::json bad = to_json(c);
    bad["config"]["rope_dims"] = 4; // 8 + 4 > head_dim 10
    EXPECT_THROW(case_from_json(bad), std::invalid_argument);
    bad = to_json(c);
    bad["config"]["dtype"] = "int8_token";
    EXPECT_THROW(case_from_json(bad), std::invalid_argument); // not modelled for a quantized dtype
}

// A case file may spell out what the ABI spells 0 (V rows as wide as K's, RoPE over the whole head): read back, such a
// case needs neither feature and sends the implementation zeros, as a case without the fields does.
TEST(LatentCase, WrittenOutDefaultsAreReadAsTheAbisZeros) {
    nlohmann::json j = to_json(latent_case());
    j["config"]["head_dim_v"] = 10u; // = head_dim
    j["config"]["rope_dim_begin"] = 0u;
    j["config"]["rope_dims"] = 10u; // the whole head
    const Case c = case_from_json(j);
    EXPECT_EQ(c.cfg.head_dim_v, 0u);
    EXPECT_EQ(c.cfg.rope_dims, 0u);
    const kvc_caps need = required_caps(c);
    EXPECT_FALSE(need.features & KVC_FEATURE_HEAD_DIM_V);
    EXPECT_FALSE(need.features & KVC_FEATURE_ROPE_RANGE);
    j["config"]["dtype"] = "int8_token"; // nothing latent left: a quantized dtype is fine
    EXPECT_NO_THROW(case_from_json(j));
}

TEST(LatentCase, OutsideTheDeclarationNamesHeadDimVAndTheRopeRange) {
    const Case c = latent_case();
    const kvc_caps need = required_caps(c);
    EXPECT_TRUE(need.features & KVC_FEATURE_HEAD_DIM_V);
    EXPECT_TRUE(need.features & KVC_FEATURE_ROPE_RANGE);
    kvc_caps have{};
    have.struct_size = sizeof have;
    have.dtypes = 1;
    have.rope_variants = 1u << KVC_ROPE_NEOX;
    have.features = KVC_FEATURE_GQA;
    const auto outside = outside_declaration(have, *find_property("EQUIV"), c);
    ASSERT_TRUE(outside.has_value());
    EXPECT_TRUE(outside->outside_declaration);
    contains(outside->reason, "head_dim_v");
    contains(outside->reason, "rope range");
    have.features |= KVC_FEATURE_HEAD_DIM_V | KVC_FEATURE_ROPE_RANGE;
    EXPECT_FALSE(outside_declaration(have, *find_property("EQUIV"), c).has_value());
    have.max_head_dim_v = 4;
    const auto limits = missing_caps(need, have);
    ASSERT_EQ(limits.size(), 1u);
    EXPECT_EQ(limits[0], "head_dim_v 8 > 4");
}

// One cached row: every query's output is that row's V, head_dim_v dims a query head. Its key is rotated on the
// range only: at position 1 the dims before the range are stored as given.
TEST(LatentOracle, OutputsHaveHeadDimVDimsAndRopeRotatesOnlyTheRange) {
    const CaseConfig c = latent_case().cfg;
    std::vector<float> q(2 * 10, 0.5f), k(10), v(8);
    for (int x = 0; x < 10; ++x) k[x] = static_cast<float>(x + 1);
    for (int x = 0; x < 8; ++x) v[x] = static_cast<float>(10 * x);
    const Expected e = expect_outputs(c, q.data(), 1, k, v, 1);
    ASSERT_EQ(e.oracle.size(), 16u);
    for (int h = 0; h < 2; ++h)
        for (int x = 0; x < 8; ++x) EXPECT_EQ(static_cast<double>(e.oracle[h * 8 + x]), 10.0 * x);
    std::vector<float> rotated(10);
    expected_rotated_key(c, k.data(), 1, rotated.data());
    for (int x = 0; x < 8; ++x) EXPECT_EQ(rotated[x], k[x]) << x;
    // the range is a head of 2 dims: one pair, angle 1 rad at position 1
    EXPECT_FLOAT_EQ(rotated[8], static_cast<float>(9 * std::cos(1.0) - 10 * std::sin(1.0)));
    EXPECT_FLOAT_EQ(rotated[9], static_cast<float>(9 * std::sin(1.0) + 10 * std::cos(1.0)));
}

// MEMORY: L * T * H_kv * (d_k + d_v) * sizeof(dtype): the 576/512 shape in f16, 3 rows of one layer.
TEST(LatentMemory, LiveBytesCountKAndVRowsEachAtTheirOwnSize) {
    CaseConfig c = latent_case().cfg;
    c.cache_dtype = KVC_DTYPE_F16;
    c.head_dim = 576;
    c.head_dim_v = 512;
    c.rope_dim_begin = 512;
    c.rope_dims = 64;
    EXPECT_EQ(live_bytes(c, {{3}}), 3u * 1 * (576 + 512) * 2);
    c.head_dim_v = 0; // V rows of K's size: the formula of every other case
    EXPECT_EQ(live_bytes(c, {{3}}), 2u * 3 * 576 * 2);
}

struct Drawn {
    int mla576 = 0, mla_small = 0, partial = 0;
};

Drawn draw(const kvc_caps& caps, int cases) {
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    s.cases = cases;
    Drawn d;
    for (int i = 0; i < cases; ++i) {
        const CaseConfig c = generate_case(*find_property("EQUIV"), s, i, &caps).cfg;
        const bool mla = c.head_dim_v != 0 && c.n_kv_heads == 1;
        d.mla576 += mla && c.head_dim == 576 && c.head_dim_v == 512 && c.rope_dim_begin == 512 && c.rope_dims == 64 &&
                    c.n_q_heads > 1;
        d.mla_small += mla && c.head_dim < 576 && c.rope_dims != 0 && c.rope_dim_begin == c.head_dim_v &&
                       c.rope_dim_begin + c.rope_dims == c.head_dim;
        d.partial += c.head_dim_v == 0 && c.rope_dims != 0 && c.rope_dim_begin == 0 &&
                     (c.rope_dims * 2 == c.head_dim || c.rope_dims * 4 == c.head_dim);
    }
    return d;
}

// The correct double declares HEAD_DIM_V and ROPE_RANGE: its cases include MLA's real shape, smaller ones of its
// form and partial rotary. The same caps without the two bits draw none of them.
TEST(LatentCases, DrawnWhereDeclaredAndNeverElsewhere) {
    const auto t = load_implementation("double-mla_correct");
    ASSERT_TRUE(t.caps.features & KVC_FEATURE_HEAD_DIM_V);
    const Drawn d = draw(t.caps, 200);
    std::cout << "EQUIV, 200 cases for double-mla_correct (seed " << kvc::testing::kDoublesSeed << "): " << d.mla576
              << " MLA 576/512/64, " << d.mla_small << " smaller MLA, " << d.partial << " partial rotary\n";
    EXPECT_GT(d.mla576, 2);
    EXPECT_GT(d.mla_small, 10);
    EXPECT_GT(d.partial, 5);
    kvc_caps plain = t.caps;
    plain.features &= ~(KVC_FEATURE_HEAD_DIM_V | KVC_FEATURE_ROPE_RANGE);
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    s.cases = 200;
    for (int i = 0; i < s.cases; ++i) {
        const CaseConfig c = generate_case(*find_property("EQUIV"), s, i, &plain).cfg;
        EXPECT_EQ(c.head_dim_v, 0u) << i;
        EXPECT_EQ(c.rope_dims, 0u) << i;
    }
}

TEST(LatentDoubles, TheCorrectCachePassesEveryProperty) {
    const auto t = load_implementation("double-mla_correct");
    for (const char* id : {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "NO-Q", "MEMORY", "LAYERS", "GQA", "FORK",
                           "RELEASE", "LONG"}) {
        int passed = 0;
        const auto r = first_failure(t, id, 40, &passed);
        EXPECT_FALSE(r.has_value()) << id << ": " << (r ? r->reason : "");
        EXPECT_GT(passed, 0) << id;
    }
}

// A query rounded to bf16 before RoPE, declared: the rounding of the dims outside the RoPE range (512 of an MLA
// head's 576) is in the bound as well as that of the rotated ones.
TEST(LatentDoubles, ADeclaredBf16QueryPassesOutsideTheRopeRangeToo) {
    const auto t = load_implementation("double-mla_q_bf16");
    for (const char* id : {"EQUIV", "LAYERS", "GQA"}) {
        int passed = 0;
        const auto r = first_failure(t, id, 60, &passed);
        EXPECT_FALSE(r.has_value()) << id << ": " << (r ? r->reason : "");
        EXPECT_GT(passed, 0) << id;
    }
}

TEST(LatentDoubles, EachBugFailsItsPropertyByName) {
    kvc::testing::expect_each_bug_fails("double-mla_",
                                        {{"v_from_k", "EQUIV", "the V head dim taken from K's"},
                                         {"v_from_k", "CACHE-CONTENT", "the V head dim taken from K's"},
                                         {"rope_all", "CACHE-CONTENT", "RoPE over all dims when a range is declared"},
                                         {"rope_all", "EQUIV", "RoPE over all dims when a range is declared"},
                                         {"memory_2dk", "MEMORY", "(head_dim + head_dim_v)"}},
                                        40);
}

} // namespace
