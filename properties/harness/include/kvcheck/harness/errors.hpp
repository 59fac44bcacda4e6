// Exit codes of a run (docs/cli.md) and the three ways a run ends before any case is judged. Every front end maps
// these the same way: BadInput -> kExitBadInput, PluginFailed -> kExitPluginFailed, NotRunnable -> kExitNotRunnable.
#pragma once

#include <stdexcept>

namespace kvc::harness {

enum ExitCode : int {
    kExitOk = 0,            // conformant / verified / done
    kExitNotConformant = 1, // a property failed, a golden number mismatched
    kExitBadInput = 2,      // usage error, unreadable or malformed input, unloadable plugin, malformed model table
    kExitInternal = 3,      // the harness itself failed
    kExitPluginFailed = 4,  // the plugin misbehaved while being loaded (crashed, exited, hung, wrote past its caps)
    kExitNotRunnable = 5,   // the named built-in cannot run on this machine (no CUDA device): nothing was judged
};

// Bad input found after parsing (unloadable plugin, malformed file or model table, impossible option).
class BadInput : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A plugin that misbehaved while being loaded: crashed, exited (even with 0), hung, flooded the harness's pipes or
// wrote past its caps struct.
class PluginFailed : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A built-in named on its own that cannot run on this machine (the CUDA engine without a usable device): nothing was
// judged, so neither conformant nor not. `--builtin all` skips such a built-in with the reason instead.
class NotRunnable : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

} // namespace kvc::harness
