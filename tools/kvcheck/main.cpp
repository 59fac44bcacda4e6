// kvcheck: conformance of KV-cache implementations against the reference. See docs/cli.md.
#include "commands.hpp"

#include <exception>
#include <iostream>

int main(int argc, char** argv) {
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
