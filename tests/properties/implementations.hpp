// The implementations the property tests run against: every built-in of this build, and the correct test double
// loaded as a plugin from its shared library (so the dlopen path is certified by the same suite).
#pragma once

#include "kvcheck/builtins.hpp"
#include "kvcheck/properties/target.hpp"

#include <cstdlib>
#include <string>
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

inline std::vector<std::string> implementation_names() {
    std::vector<std::string> names;
    for (const Builtin& b : builtins()) names.push_back(b.name);
    names.push_back("double-correct");
    return names;
}

inline prop::Target load_implementation(const std::string& name) {
    if (const Builtin* b = find_builtin(name)) return prop::target_from_entry(b->entry, "builtin:" + name);
    return prop::load_plugin(double_path(name.substr(std::string("double-").size())));
}

} // namespace kvc::testing
