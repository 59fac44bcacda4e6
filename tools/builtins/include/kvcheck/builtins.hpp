// The implementations linked into this build, by name. Each is reached only through its ABI entry function, exactly
// as a plugin loaded from a shared library would be.
#pragma once

#include "kvcheck/abi.h"

#include <string>
#include <vector>

namespace kvc {

struct Builtin {
    std::string name;        // what `kvcheck validate --builtin NAME` takes
    std::string description; // one line for `kvcheck list`
    kvc_entry_fn entry;
    // NULL when the implementation can always run. Otherwise a probe: NULL when it can run on this machine, else why
    // not, in words (the CUDA engine without a usable device: the CUDA error). Callers skip it with that reason:
    // never a failure, never a pass.
    const char* (*unavailable)() = nullptr;
};

// Why b cannot run here, or "" when it can.
std::string unavailable_reason(const Builtin& b);

const std::vector<Builtin>& builtins();
const Builtin* find_builtin(const std::string& name); // nullptr when unknown

} // namespace kvc
