// Helpers for running the deliberately broken implementations (tests/doubles/) through the runner, the same way
// `kvcheck validate` does: case by case from a fixed seed, shrinking failures.
#pragma once

#include "implementations.hpp"
#include "kvcheck/properties/runner.hpp"

#include <gtest/gtest.h>

#include <initializer_list>
#include <iostream>
#include <optional>
#include <string>

namespace kvc::testing {

constexpr uint64_t kDoublesSeed = 20261129;

// The first failing case among `cases` cases of property `id`, shrunk; printed with its seed for replay.
// `passed` counts the cases that ran and passed (NOT_SUPPORTED ones prove nothing and are not counted).
inline std::optional<prop::CaseResult> first_failure(const prop::Target& t, const std::string& id, int cases,
                                                     int* passed = nullptr) {
    prop::RunSettings s;
    s.seed = kDoublesSeed;
    s.cases = cases;
    const prop::Property& p = *prop::find_property(id);
    if (passed) *passed = 0;
    for (int i = 0; i < cases; ++i) {
        prop::CaseResult r = prop::run_case(t, p, s, i);
        if (passed && (r.verdict == prop::Verdict::Pass || r.verdict == prop::Verdict::QualityWarning)) ++*passed;
        if (r.verdict == prop::Verdict::Fail || r.verdict == prop::Verdict::Error) {
            std::cout << "[" << t.origin << "] " << r.id << " " << prop::verdict_name(r.verdict) << " ["
                      << r.failed_property << "] seed " << s.seed << " case seed " << r.seed << " after "
                      << r.shrink_steps << " shrinks:\n  " << r.reason << "\n"
                      << (r.mismatch ? "  first mismatch: " + r.mismatch->describe() + "\n" : "")
                      << prop::describe(r.counterexample);
            return r;
        }
    }
    return std::nullopt;
}

// Asserts that `double_name` is caught by `intended` and passes every property in `unrelated`.
inline void expect_caught_only_by(const std::string& double_name, const std::string& intended,
                                  const std::vector<std::string>& unrelated, int cases = 60) {
    const prop::Target t = load_implementation("double-" + double_name);
    const auto caught = first_failure(t, intended, cases);
    ASSERT_TRUE(caught.has_value()) << double_name << " was not caught by " << intended << " in " << cases << " cases";
    EXPECT_EQ(caught->verdict, prop::Verdict::Fail);
    EXPECT_EQ(caught->failed_property, intended);
    for (const std::string& other : unrelated) {
        int passed = 0;
        const auto r = first_failure(t, other, cases / 2, &passed);
        EXPECT_FALSE(r.has_value()) << double_name << " should pass " << other << " but got: "
                                    << (r ? r->reason : std::string());
        EXPECT_GT(passed, 0) << double_name << ": no case of " << other << " ran (all NOT_SUPPORTED)";
    }
}

// The words name what they must (a mechanism, a buffer, a property).
inline void contains(const std::string& text, const std::string& what) {
    EXPECT_NE(text.find(what), std::string::npos) << "\"" << text << "\" does not name \"" << what << "\"";
}

// One deliberately broken double of a family and what must catch it.
struct BugExpectation {
    const char* name;      // the double is `prefix + name`
    const char* property;  // the property that must FAIL it
    const char* mechanism; // words its reason must hold
};

// Each double `prefix + name` FAILs its property within `cases` cases, with a reason that names its mechanism.
inline void expect_each_bug_fails(const std::string& prefix, std::initializer_list<BugExpectation> bugs, int cases) {
    for (const BugExpectation& x : bugs) {
        const auto t = load_implementation(prefix + x.name);
        const auto r = first_failure(t, x.property, cases);
        ASSERT_TRUE(r.has_value()) << x.name << " was not caught by " << x.property;
        EXPECT_EQ(r->verdict, prop::Verdict::Fail) << x.name;
        EXPECT_EQ(r->failed_property, x.property) << x.name;
        contains(r->reason, x.mechanism);
    }
}

} // namespace kvc::testing
