// kvcheck validate | replay: the options, and nothing else. The run itself (loading in a probe child, each case in a
// child of its own at the operation or the model level, the verdict table, reports and replay files) is the
// harness's (properties/harness, docs/harness.md); docs/cli.md describes the behaviour.
#include "commands.hpp"

#include "kvcheck/harness/run.hpp"

#include "kvcheck/abi.h"
#include "kvcheck/model_abi.h"

#include <functional>
#include <iostream>

namespace kvc::cli {
namespace {

using harness::ReplayOptions;
using harness::ValidateOptions;

void add_isolation_options(CLI::App* cmd, std::string& isolation, std::string& memory_limit) {
    cmd->add_option("--isolation", isolation,
                    "how each case's process starts: server (a --plugin runs in kvcheck serve-plugin, a process of its "
                    "own that sends back raw outputs, so that the process that grades never runs its code; operation "
                    "level, host memory), fork, exec (kvcheck executes itself again; needed by device contexts), or "
                    "auto (server for a host plugin with the operation-level table only, exec for memory_space "
                    "DEVICE, fork otherwise)")
        ->check(CLI::IsMember({"auto", "fork", "exec", "server"}))
        ->capture_default_str();
    cmd->add_option("--memory-limit", memory_limit,
                    "address space per case process (RLIMIT_AS), e.g. 4G or 512M; none; auto: 8G, none for "
                    "memory_space DEVICE")
        ->capture_default_str();
}

} // namespace

void add_validate_commands(CLI::App& app, int& exit_code) {
    static ValidateOptions v; // CLI11 keeps references: the options must outlive parse()
    auto* validate_cmd = app.add_subcommand(
        "validate", "Run the conformance properties against an implementation, each case in its own process. Exit 0 "
                    "conformant, 1 not conformant (FAIL/ERROR/CRASH/TIMEOUT), 2 bad input, 3 harness error");
    validate_cmd
        ->add_option("--plugin", v.plugin,
                     "a plugin shared library (exports " KVC_ENTRY_SYMBOL ", " KVCM_ENTRY_SYMBOL " or both)")
        ->check(path_given());
    validate_cmd->add_option("--builtin", v.builtin, "a built-in implementation (kvcheck list), or 'all'");
    validate_cmd->add_option("--connect", v.connect,
                             "a command that starts a client process speaking the pipe protocol on its stdin and "
                             "stdout (docs/protocol.md), e.g. 'python3 my_cache.py'; run by /bin/sh in each case "
                             "process");
    validate_cmd->add_option("--level", v.level,
                             "which tables of the plugin run: auto (every one it exports), operation or model")
        ->check(CLI::IsMember({"auto", "operation", "model"}))
        ->capture_default_str();
    validate_cmd->add_option("--profile", v.profile, "core (the mandatory properties) or full")
        ->check(CLI::IsMember({"core", "full"}))
        ->capture_default_str();
    validate_cmd->add_option("--cases", v.cases, "cases per property")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    validate_cmd->add_option("--seed", v.seed_text, "run seed: the same seed draws the same cases")
        ->capture_default_str();
    validate_cmd->add_option("--filter", v.filter,
                             "regular expression searched in the property id and the case id PROPERTY/INDEX");
    validate_cmd->add_option("--shard", v.shard, "I/N: run only position k of the case list with k % N == I");
    validate_cmd->add_option("--timeout", v.timeout, "seconds per case (shrinking included) before TIMEOUT")
        ->check(CLI::Range(0.001, 1e6))
        ->capture_default_str();
    validate_cmd->add_option("--shrink-first", v.shrink_first_text,
                             "shrink only the first N failures of each property (0: none, all: every one); later "
                             "failures are reported as generated, with a note")
        ->capture_default_str();
    validate_cmd->add_option("--report", v.report, "write the JSON report to this file")->check(path_given());
    validate_cmd->add_option("--junit", v.junit, "write a JUnit XML report to this file")->check(path_given());
    validate_cmd->add_option("--counterexamples", v.counterexamples,
                             "directory for the replay files of cases that did not pass")
        ->check(path_given())
        ->capture_default_str();
    add_isolation_options(validate_cmd, v.isolation, v.memory_limit);
    validate_cmd
        ->add_option("--cases-per-process", v.cases_per_process,
                     "run operation-level cases in batches of N per process, to spare each case the start of a process "
                     "and of the implementation (a device context). Only PASS, QUALITY_WARNING and NOT_SUPPORTED are "
                     "taken from a batch; every other case runs again alone, and its verdict, shrinking and output "
                     "come from that process. Cases in a batch share a process: a defect that shows only in a fresh "
                     "one can pass there. 1: every case alone")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    validate_cmd->callback([&exit_code] { exit_code = guarded("validate", [] { return harness::validate(v); }); });

    static ReplayOptions r;
    auto* replay_cmd = app.add_subcommand(
        "replay", "Run one recorded case (a file written by validate) again, in its own process. Exit 0 it passes, "
                  "1 it does not, 2 bad input");
    replay_cmd->add_option("file", r.file, "replay file, e.g. kvcheck-counterexamples/EQUIV-3.json")
        ->check(path_given())
        ->required();
    replay_cmd
        ->add_option("--plugin", r.plugin,
                     "a plugin shared library (exports " KVC_ENTRY_SYMBOL ", " KVCM_ENTRY_SYMBOL " or both)")
        ->check(path_given());
    replay_cmd->add_option("--builtin", r.builtin, "a built-in implementation (kvcheck list)");
    replay_cmd->add_option("--connect", r.connect, "a client process's command (docs/protocol.md)");
    replay_cmd->add_option("--timeout", r.timeout, "seconds before TIMEOUT")
        ->check(CLI::Range(0.001, 1e6))
        ->capture_default_str();
    add_isolation_options(replay_cmd, r.isolation, r.memory_limit);
    replay_cmd->callback([&exit_code] { exit_code = guarded("replay", [] { return harness::replay(r); }); });
}

} // namespace kvc::cli
