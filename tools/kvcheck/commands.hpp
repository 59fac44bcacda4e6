// Subcommands of build/bin/kvcheck. Each lives in its own cmd_*.cpp and registers itself on the app; a subcommand's
// callback stores its exit status in `exit_code`.
#pragma once

#include "kvcheck/harness/errors.hpp"
#include "kvcheck/harness/input_file.hpp"

#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>

namespace kvc::cli {

// The exit codes (docs/cli.md) are the harness's: every front end returns the same ones.
using namespace kvc::harness;

// The check of every option that names a file or directory: an empty path is refused (exit 2), because an empty
// value would otherwise mean something else per option ("no report", a failure only after the run, "no caps").
inline CLI::Validator path_given() {
    return CLI::Validator([](std::string& s) { return s.empty() ? std::string("an empty path") : std::string(); },
                          "", "PATH");
}

// Runs a subcommand, turning bad input into its message and exit status 2, a plugin that misbehaved while loading
// into 4 and a built-in that cannot run here into 5. Anything else propagates to main() (exit 3) before any report
// file is written. A message may quote a file's or a plugin's text, so it is printed with control characters
// escaped (printable()): a manifest must not be able to recolour or retitle the user's terminal.
inline int guarded(const char* name, const std::function<int()>& body) {
    try {
        return body();
    } catch (const BadInput& e) {
        std::cout.flush();
        std::cerr << "kvcheck " << name << ": " << printable(e.what(), true) << "\n";
        return kExitBadInput;
    } catch (const PluginFailed& e) {
        std::cout.flush();
        std::cerr << "kvcheck " << name << ": " << printable(e.what(), true) << "\n";
        return kExitPluginFailed;
    } catch (const NotRunnable& e) {
        std::cout.flush();
        std::cerr << "kvcheck " << name << ": " << printable(e.what(), true) << " (skipped: nothing was judged)\n";
        return kExitNotRunnable;
    }
}

void add_golden_commands(CLI::App& app, int& exit_code);   // golden verify | golden regen
void add_memory_command(CLI::App& app, int& exit_code);    // memory calculator
void add_list_command(CLI::App& app, int& exit_code);      // properties, built-ins, capabilities
void add_validate_commands(CLI::App& app, int& exit_code); // validate | replay (the harness runs them)
void add_vectors_commands(CLI::App& app, int& exit_code);  // export | grade
void add_serve_command(CLI::App& app, int& exit_code);     // serve-plugin (the pipe protocol's server side)

} // namespace kvc::cli
