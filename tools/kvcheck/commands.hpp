// Subcommands of build/bin/kvcheck. Each lives in its own cmd_*.cpp and registers itself on the app; a subcommand's
// callback stores its exit status in `exit_code`.
#pragma once

#include "kvcheck/harness/errors.hpp"

#include <CLI/CLI.hpp>

namespace kvc::cli {

// The exit codes (docs/cli.md) are the harness's: every front end returns the same ones.
using namespace kvc::harness;

void add_golden_commands(CLI::App& app, int& exit_code);   // golden verify | golden regen
void add_memory_command(CLI::App& app, int& exit_code);    // memory calculator
void add_list_command(CLI::App& app, int& exit_code);      // properties, built-ins, capabilities
void add_validate_commands(CLI::App& app, int& exit_code); // validate | replay (the harness runs them)
void add_vectors_commands(CLI::App& app, int& exit_code);  // export | grade

} // namespace kvc::cli
