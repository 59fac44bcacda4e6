// The implementations the property tests run against: every built-in of this build, and the correct test double
// loaded as a plugin from its shared library (so the dlopen path is certified by the same suite).
#pragma once

#include "kvcheck/builtins.hpp"
#include "kvcheck/properties/target.hpp"

#include <gtest/gtest.h>

#include <cerrno> // program_invocation_short_name (glibc)
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace kvc::testing {

// CI's fixed seed and 200 cases per property, unless RC_PARAMS is set (RapidCheck reads it at its first check, and
// prints the seed of every failure so it can be given back).
inline const bool kDefaultRapidCheckParams = [] {
    setenv("RC_PARAMS", "seed=20261129 max_success=200", 0);
    return true;
}();

inline std::string double_path(const std::string& name) {
    return std::string(KVC_DOUBLES_DIR) + "/libkvcheck_double_" + name + ".so";
}

// A built-in this machine cannot run (the CUDA engine without a usable device) is not handed to the property
// tests: its create() would fail for every case. Instead one test per such built-in and test program,
// Unavailable_<program>.<name>, is registered and skipped with the reason (the CUDA error), so the run says what it
// did not check: never a failure, never a pass.
class UnavailableImplementation : public ::testing::Test {
public:
    explicit UnavailableImplementation(std::string why) : why_(std::move(why)) {}
    void TestBody() override { GTEST_SKIP() << why_; }

private:
    std::string why_;
};

inline void register_unavailable(const Builtin& b, const std::string& why) {
    // tests are registered before they run (the parameter lists are drawn then); never while one runs
    if (::testing::UnitTest::GetInstance()->current_test_info() != nullptr) return;
    static std::vector<std::string> done; // once per built-in, however often the names are asked for
    for (const std::string& n : done)
        if (n == b.name) return;
    done.push_back(b.name);
    static const std::string suite = std::string("Unavailable_") + program_invocation_short_name;
    ::testing::RegisterTest(suite.c_str(), b.name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [why]() -> UnavailableImplementation* { return new UnavailableImplementation(why); });
}

inline std::vector<std::string> implementation_names() {
    std::vector<std::string> names;
    use_compiled_builtins();
    for (const Builtin& b : builtins()) {
        const std::string why = unavailable_reason(b);
        if (why.empty()) names.push_back(b.name);
        else register_unavailable(b, why);
    }
    names.push_back("double-correct");
    return names;
}

inline prop::Target load_implementation(const std::string& name) {
    use_compiled_builtins();
    if (const Builtin* b = find_builtin(name)) return prop::target_from_entry(b->entry, "builtin:" + name);
    return prop::load_plugin(double_path(name.substr(std::string("double-").size())));
}

} // namespace kvc::testing
