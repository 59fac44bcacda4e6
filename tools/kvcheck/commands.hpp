// Subcommands of build/bin/kvcheck. Each lives in its own cmd_*.cpp and registers itself on the app; a subcommand's
// callback stores its exit status in `exit_code`.
#pragma once

#include <CLI/CLI.hpp>

namespace kvc::cli {

// Exit codes, documented in docs/cli.md.
enum ExitCode : int {
    kExitOk = 0,           // conformant / verified / done
    kExitNotConformant = 1, // a property failed, a golden number mismatched
    kExitBadInput = 2,     // usage error, unreadable or malformed input, unloadable plugin
    kExitInternal = 3,     // the harness itself failed
    kExitPluginFailed = 4, // the plugin misbehaved while being loaded (crashed, exited, hung, wrote past kvc_caps)
    kExitNotRunnable = 5,  // the named built-in cannot run on this machine (no CUDA device): nothing was judged
};

void add_golden_commands(CLI::App& app, int& exit_code);   // golden verify | golden regen
void add_memory_command(CLI::App& app, int& exit_code);    // memory calculator
void add_list_command(CLI::App& app, int& exit_code);      // properties, built-ins, capabilities
void add_validate_commands(CLI::App& app, int& exit_code); // validate | replay
void add_vectors_commands(CLI::App& app, int& exit_code);  // export | grade

} // namespace kvc::cli
