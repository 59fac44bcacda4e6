// kvcheck: conformance of KV-cache implementations against the reference. See docs/cli.md.
#include "commands.hpp"
#include "kvcheck/harness/child.hpp"

#include "kvcheck/properties/heap.hpp"

#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
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

} // namespace

int main(int argc, char** argv) {
    restart_with_exact_heap_accounting(argv);
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
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e); // prints help or the usage error
        return rc == 0 ? kvc::cli::kExitOk : kvc::cli::kExitBadInput;
    } catch (const std::exception& e) {
        std::cerr << "kvcheck: internal error: " << e.what() << "\n";
        return kvc::cli::kExitInternal;
    }
    return exit_code;
}
