// Windowed caches (ABI 1.2, docs/windowed-caches.md): the case's JSON and capabilities, which rows are dead, the
// oracle's visibility against numbers worked by hand, and the doubles of tests/doubles/window_cache.cpp end to end:
// the ring buffer, the block-freeing cache and the plain masking cache pass, each bug fails its property with its
// mechanism named.
#include "doubles.hpp"
#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/runner.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

namespace {

using namespace kvc::prop;
using kvc::testing::first_failure;
using kvc::testing::load_implementation;

using kvc::testing::contains;

Case windowed_case() {
    Case c;
    c.cfg.n_layers = 2;
    c.cfg.windows = {4, 0};
    c.cfg.n_sinks = 2;
    c.cfg.evict = true;
    c.ops.push_back({});
    c.ops.back().appends.push_back({0, 9, false});
    return c;
}

TEST(WindowCase, JsonRoundTripsAndOldFilesLoad) {
    const Case c = windowed_case();
    const Case back = case_from_json(to_json(c));
    EXPECT_EQ(back.cfg.windows, c.cfg.windows);
    EXPECT_EQ(back.cfg.n_sinks, 2u);
    EXPECT_TRUE(back.cfg.evict);
    Case plain = c;
    plain.cfg.windows.clear();
    plain.cfg.n_sinks = 0;
    plain.cfg.evict = false;
    EXPECT_FALSE(to_json(plain)["config"].contains("windows")); // a case without windows is written as before
    EXPECT_TRUE(case_from_json(to_json(plain)).cfg.windows.empty());
}

TEST(WindowCase, BadWindowFieldsAreRefused) {
    const auto refused = [](const std::function<void(nlohmann::json&)>& edit, const char* words) {
        nlohmann::json j = to_json(windowed_case());
        edit(j["config"]);
        try {
            case_from_json(j);
            ADD_FAILURE() << "accepted: " << j["config"].dump();
        } catch (const std::invalid_argument& e) {
            contains(e.what(), words);
        }
    };
    refused([](nlohmann::json& g) { g["windows"] = {4u}; }, "one window per layer");
    refused([](nlohmann::json& g) { g["windows"] = {4u, -1}; }, "non-negative integer");
    refused([](nlohmann::json& g) { g.erase("windows"); }, "need \"windows\"");
    refused([](nlohmann::json& g) { g["evict"] = 1; }, "true or false");
    refused([](nlohmann::json& g) { g["windows"] = {0u, 0u}; }, "evict needs a window");
}

TEST(WindowCase, DeadRowsAreThoseNoLaterQuerySees) {
    CaseConfig c = windowed_case().cfg; // layer 0: W = 4, S = 2; layer 1: no window
    // after 9 rows the next query sits at 9 and sees 0, 1 (sinks) and 6, 7, 8, 9: rows 2..5 are dead
    EXPECT_EQ(c.dead_end(0, 9), 6u);
    EXPECT_EQ(c.dead_end(0, 7), 4u); // the next query at 7 sees 0, 1 and 4..7: rows 2, 3 are dead
    EXPECT_EQ(c.dead_end(0, 5), 0u); // the next query at 5 sees 0, 1 and 2..5: nothing is dead yet
    EXPECT_EQ(c.dead_end(0, 3), 0u);
    EXPECT_EQ(c.dead_end(1, 100), 0u);
}

TEST(WindowCase, RequiredCapsNameWindowsSinksAndEviction) {
    const Case c = windowed_case();
    const kvc_caps need = required_caps(c);
    EXPECT_TRUE(need.features & KVC_FEATURE_WINDOW);
    EXPECT_TRUE(need.features & KVC_FEATURE_SINKS);
    EXPECT_TRUE(need.features & KVC_FEATURE_EVICT);
    EXPECT_EQ(need.max_window, 4u);
    kvc_caps have{};
    have.struct_size = sizeof have;
    have.dtypes = 1;
    const auto missing = missing_caps(need, have);
    const std::string all = [&] {
        std::string s;
        for (const auto& m : missing) s += m + ";";
        return s;
    }();
    contains(all, "window;");
    contains(all, "sinks;");
    contains(all, "evict;");
    have.features = KVC_FEATURE_WINDOW | KVC_FEATURE_SINKS | KVC_FEATURE_EVICT;
    have.max_window = 3;
    have.max_sinks = 1;
    const auto limits = missing_caps(need, have);
    ASSERT_EQ(limits.size(), 2u);
    EXPECT_EQ(limits[0], "window 4 > 3");
    EXPECT_EQ(limits[1], "sinks 2 > 1");
}

// The oracle over one-dim rows whose keys are all 0 (every visible key weighs the same) and values v_j = j: each
// output is the mean of the positions its query sees, worked out by hand below.
TEST(WindowOracle, EachQuerySeesItsWindowAndTheSinks) {
    CaseConfig c;
    c.head_dim = 1;
    c.windows = {3};
    c.n_sinks = 1;
    std::vector<float> k(8, 0.0f), v(8), q(3, 1.0f);
    for (int j = 0; j < 8; ++j) v[j] = static_cast<float>(j);
    // queries at positions 5, 6, 7 over 8 rows: {0, 3, 4, 5} -> 3, {0, 4, 5, 6} -> 3.75, {0, 5, 6, 7} -> 4.5
    const Expected e = expect_outputs(c, q.data(), 3, k, v, 8);
    EXPECT_NEAR(static_cast<double>(e.oracle[0]), 3.0, 1e-15);
    EXPECT_NEAR(static_cast<double>(e.oracle[1]), 3.75, 1e-15);
    EXPECT_NEAR(static_cast<double>(e.oracle[2]), 4.5, 1e-15);
    EXPECT_EQ(e.visible, (std::vector<uint32_t>{4, 4, 4}));
    // the same rows in a layer without a window: the means of 0..5, 0..6, 0..7
    c.windows = {0};
    const Expected full = expect_outputs(c, q.data(), 3, k, v, 8);
    EXPECT_NEAR(static_cast<double>(full.oracle[2]), 3.5, 1e-15);
    EXPECT_EQ(full.visible, (std::vector<uint32_t>{6, 7, 8}));
}

// The CPU engine declares windows, sinks and eviction, so the cases drawn for it include them: what its CONFORMANT
// verdict covers.
TEST(WindowCases, TheCpuEngineIsGivenWindowedSinkAndEvictingCases) {
    const auto t = load_implementation("cpu");
    ASSERT_TRUE(t.caps.features & KVC_FEATURE_WINDOW);
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    s.cases = 200;
    int windowed = 0, sinks = 0, evicting = 0;
    for (int i = 0; i < s.cases; ++i) {
        const Case c = generate_case(*find_property("EQUIV"), s, i, &t.caps);
        windowed += c.cfg.windowed();
        sinks += c.cfg.windowed() && c.cfg.n_sinks > 0;
        evicting += c.cfg.evict;
    }
    std::cout << "EQUIV, 200 cases for the CPU engine: " << windowed << " windowed, " << sinks << " with sinks, "
              << evicting << " evicting\n";
    EXPECT_GT(windowed, 40);
    EXPECT_GT(sinks, 10);
    EXPECT_GT(evicting, 10);
}

TEST(WindowDoubles, CorrectWindowedCachesPass) {
    for (const char* name : {"double-win_ring", "double-win_blocks", "double-win_full"}) {
        const auto t = load_implementation(name);
        for (const char* id : {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "NO-Q", "MEMORY", "FORK", "RELEASE"}) {
            int passed = 0;
            const auto r = first_failure(t, id, 24, &passed);
            EXPECT_FALSE(r.has_value()) << name << " " << id << ": " << (r ? r->reason : "");
            EXPECT_GT(passed, 0) << name << " " << id;
        }
    }
}

TEST(WindowDoubles, EachBugFailsItsPropertyByName) {
    kvc::testing::expect_each_bug_fails("double-win_",
                                        {{"plus_one", "EQUIV", "outside its window of"},
                                         {"minus_one", "EQUIV", "inside its window of"},
                                         {"first_row", "EQUIV", "the window of the call's first row used for every row"},
                                         {"sinks_dropped", "EQUIV", "stay visible in a windowed layer"},
                                         {"ring_rope", "CACHE-CONTENT", "rotated"},
                                         {"stale_read", "APPEND-ONLY", "a row read back earlier changed"},
                                         {"no_free", "MEMORY", "rows that left the window are not freed"}},
                                        60);
}

} // namespace
