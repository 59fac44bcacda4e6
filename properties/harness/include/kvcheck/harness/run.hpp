// The two runs a front end starts: validate (the selected cases of every property of each level the implementation
// exports, each case in a child process; the verdict table; the JSON and JUnit reports; a replay file for each case
// that did not pass) and replay (one recorded case again). Both print to stdout (progress to stderr) and return the
// exit code (errors.hpp); bad input, a plugin that misbehaves while loading and a built-in that cannot run here are
// thrown (BadInput, PluginFailed, NotRunnable) before any report is written. docs/cli.md describes the behaviour.
#pragma once

#include "kvcheck/harness/subjects.hpp"

#include <cstdint>
#include <string>

namespace kvc::harness {

struct ValidateOptions {
    std::string plugin, builtin;
    std::string connect; // a client process's command (docs/protocol.md), instead of plugin or builtin
    std::string level = "auto"; // auto (every table the plugin exports), operation, model
    std::string profile = "full";
    int cases = 100;
    std::string seed_text = "20261129";
    std::string filter;
    std::string shard;
    double timeout = 30;
    std::string shrink_first_text = "3";
    std::string report, junit;
    std::string counterexamples = "kvcheck-counterexamples";
    std::string isolation = "auto", memory_limit = "auto";
    int cases_per_process = 1; // > 1: conformant results may come from batches of that many cases (case_run.hpp)
    IsolationOptions iso() const { return {isolation, memory_limit, timeout}; }
};

int validate(const ValidateOptions& o);

struct ReplayOptions {
    std::string file, plugin, builtin;
    std::string connect;
    double timeout = 30;
    std::string isolation = "auto", memory_limit = "auto";
    IsolationOptions iso() const { return {isolation, memory_limit, timeout}; }
};

int replay(const ReplayOptions& o);

} // namespace kvc::harness
