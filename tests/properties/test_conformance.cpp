// Every property against every implementation in the build, through the ABI, with RapidCheck. The properties are
// written once (properties/); this file only pairs them with implementations.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "implementations.hpp"
#include "kvcheck/abi.hpp"
#include "kvcheck/properties/runner.hpp"

#include <tuple>

namespace {

using namespace kvc::prop;

class Conformance : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Conformance, PropertyHolds) {
    const auto& [impl, id] = GetParam();
    const Target t = kvc::testing::load_implementation(impl);
    const Property& p = *find_property(id);
    if (p.feature && !(t.caps.features & p.feature))
        GTEST_SKIP() << impl << " does not declare the capability " << id << " is about (reported NOT_SUPPORTED)";
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
