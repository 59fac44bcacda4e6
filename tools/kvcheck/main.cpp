// kvcheck: conformance of KV-cache implementations against the reference. See docs/cli.md.
#include "commands.hpp"
#include "kvcheck/builtins.hpp"
#include "kvcheck/harness/child.hpp"

#include "kvcheck/properties/heap.hpp"

#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <regex>
#include <string>

namespace {

// NO-Q watches the allocator, which is exact only with glibc's per-thread cache off (heap.hpp). The tunable must be
// in the environment when the process starts, so kvcheck sets it and executes itself again, once.
void restart_with_exact_heap_accounting(char** argv) {
    if (kvc::prop::heap_accounting_exact() || std::getenv("KVCHECK_REEXECUTED")) return;
    const char* old = std::getenv("GLIBC_TUNABLES");
    const std::string value = (old && *old ? std::string(old) + ":" : std::string()) + kvc::prop::kExactHeapTunable;
    setenv("GLIBC_TUNABLES", value.c_str(), 1);
    setenv("KVCHECK_REEXECUTED", "1", 1);
    execv("/proc/self/exe", argv); // returns only on failure: then NO-Q cases end as ERROR, saying why
}

// CLI11 2.1 converts integers with strtoll's automatic base: "--cases 010" ran 8 cases and "--seed 0x10" was 16,
// while the seeds validate parses itself are decimal. Every number on kvcheck's command line is decimal: leading
// zeros are dropped before the conversion and a 0x, 0b or 0o prefix is refused.
std::string decimal(std::string s) {
    static const std::regex prefixed("[+-]?0[xXbBoO].*");
    static const std::regex leading_zeros("([+-]?)0+([0-9].*)");
    if (std::regex_match(s, prefixed)) throw CLI::ValidationError(s + ": not a decimal number");
    std::smatch m;
    if (std::regex_match(s, m, leading_zeros)) return m[1].str() + m[2].str();
    return s;
}

// Puts decimal() first on every numeric option of every subcommand (a transform runs before the option's checks).
void decimal_numbers(CLI::App& app) {
    for (CLI::App* sub : app.get_subcommands({})) {
        for (CLI::Option* opt : sub->get_options()) {
            const std::string full = opt->get_type_name(); // "INT", or "INT:" and its checks' descriptions
            const std::string type = full.substr(0, full.find(':'));
            if (type == "INT" || type == "UINT" || type == "FLOAT") opt->transform(decimal, "DECIMAL");
        }
        decimal_numbers(*sub);
    }
}

// CLI11 answers `kvcheck bogus` with "A subcommand is required": the word the user typed is named instead, with the
// subcommands there are. Empty when the first argument is an option or a subcommand.
std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
    if (argc < 2 || argv[1][0] == '-') return "";
    const std::string word = argv[1];
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) {
        if (sub->get_name() == word) return "";
        names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    return "kvcheck: unknown subcommand \"" + kvc::harness::printable(word) + "\" (the subcommands: " + names +
           "; kvcheck --help describes them)";
}

} // namespace

int main(int argc, char** argv) {
    restart_with_exact_heap_accounting(argv);
    kvc::use_compiled_builtins(); // before an exec-isolation child looks one up
    // A case process of exec isolation (isolate.hpp): kvcheck's own, started by validate or replay.
    if (argc == 2 && std::string(argv[1]) == kvc::harness::kExecChildCommand) kvc::harness::exec_child_main();
    CLI::App app{"kvcheck " KVCHECK_VERSION " - verified reference and conformance suite for transformer KV caches"};
    app.set_version_flag("--version", "kvcheck " KVCHECK_VERSION);
    app.require_subcommand(1);
    int exit_code = kvc::cli::kExitOk;
    kvc::cli::add_golden_commands(app, exit_code);
    kvc::cli::add_memory_command(app, exit_code);
    kvc::cli::add_list_command(app, exit_code);
    kvc::cli::add_validate_commands(app, exit_code);
    kvc::cli::add_vectors_commands(app, exit_code);
    kvc::cli::add_serve_command(app, exit_code);
    decimal_numbers(app);
    if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
        std::cerr << unknown << "\n";
        return kvc::cli::kExitBadInput;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e); // prints help or the usage error
        return rc == 0 ? kvc::cli::kExitOk : kvc::cli::kExitBadInput;
    } catch (const std::exception& e) {
        std::cerr << "kvcheck: internal error: " << kvc::harness::printable(e.what(), true) << "\n";
        return kvc::cli::kExitInternal;
    }
    return exit_code;
}
