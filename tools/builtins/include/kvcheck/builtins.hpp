// The implementations linked into this build (the example plugin, the CPU engine, the CUDA engine when built), for
// the harness's registry of built-ins (kvcheck/harness/builtins.hpp). The CLI and the property tests both take
// their list from here, so a new engine is certified by adding one line to builtins.cpp.
#pragma once

#include "kvcheck/harness/builtins.hpp"

#include <vector>

namespace kvc {

// Every built-in compiled in, whether or not it can run here: callers ask unavailable_reason() and skip with it.
const std::vector<Builtin>& compiled_builtins();

// Registers compiled_builtins() with the harness; call before loading any subject.
inline void use_compiled_builtins() { register_builtins(compiled_builtins()); }

} // namespace kvc
