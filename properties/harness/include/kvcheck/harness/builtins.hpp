// The registry of built-in implementations: implementations linked into the program that runs the harness, each
// reached only through its ABI entry function, exactly as a plugin loaded from a shared library would be.
//
// The harness reads the registry; it never decides what is in it. The program that links the implementations
// fills it before any subject is loaded (the kvcheck CLI: tools/builtins/, use_compiled_builtins()), so that
// nothing under properties/ depends on the engines or the example plugin. A program that registers nothing has no
// built-ins: `--builtin NAME` is then an unknown name, never a crash.
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

// Makes `list` the registry (it must outlive every use; a static list does).
void register_builtins(const std::vector<Builtin>& list);

// Why b cannot run here, or "" when it can.
std::string unavailable_reason(const Builtin& b);

const std::vector<Builtin>& builtins(); // the registered list, empty when none was registered
const Builtin* find_builtin(const std::string& name); // nullptr when unknown

} // namespace kvc
