// kvcheck golden verify | regen: the golden data (golden/*.json) against the reference. The checking itself lives
// in kvcheck_golden; this file only parses arguments, prints, and maps the result to an exit code.
#include "commands.hpp"

#include "kvcheck/golden/golden.hpp"

#include <iostream>

namespace kvc::cli {
namespace {

void add_verify(CLI::App& golden, std::string& dir, int& exit_code) {
    auto* verify = golden.add_subcommand(
        "verify", "Check every printed number against the reference at its printed precision, and every computed "
                  "field against the reference at 1e-12. Exit 0 all match, 1 mismatch, 2 malformed/stale/missing");
    verify->add_option("--dir", dir, "golden directory")->check(path_given())->capture_default_str();
    verify->callback([&dir, &exit_code] {
        const golden::Report report = golden::verify_dir(dir);
        std::cout << printable(golden::format_report(report), true); // it quotes the files: no escape sequences
        exit_code = report.exit_code();
    });
}

void add_regen(CLI::App& golden, std::string& dir, int& exit_code) {
    auto* regen = golden.add_subcommand(
        "regen", "Recompute every computed field from the reference and rewrite the files as one set, all or nothing "
                 "(deterministic: a rerun changes nothing). Printed values and provenance are never touched. Refuses "
                 "a file that is malformed, a symbolic link, not a regular file or read-only. Exit 0 written, 2 refused");
    regen->add_option("--dir", dir, "golden directory")->check(path_given())->capture_default_str();
    regen->callback([&dir, &exit_code] {
        std::string internal;
        std::vector<golden::RegenResult> results;
        try {
            // A regen killed after its commit point left a journal: finish that set first, and say so.
            const auto finished = golden::finish_interrupted_regen(dir);
            if (!finished.empty())
                std::cout << "golden: finished an interrupted regen: " << finished.size()
                          << " staged file(s) renamed into place\n";
            results = golden::regen_dir(dir, internal);
        } catch (const std::exception& e) { // missing directory, no golden files, an untrustworthy journal
            std::cout << "golden: " << printable(e.what(), true) << "\n";
            exit_code = kExitBadInput;
            return;
        }
        if (!internal.empty()) {
            std::cout << "golden: internal error: " << printable(internal, true) << "\n";
            exit_code = kExitInternal;
            return;
        }
        exit_code = kExitOk;
        for (const auto& r : results)
            if (!r.error.empty()) exit_code = kExitBadInput;
        // The set is written all or nothing: one refused file keeps every other file as it was.
        for (const auto& r : results) {
            std::cout << "golden: " << r.file << ": ";
            if (!r.error.empty()) std::cout << "NOT REGENERATED: " << printable(r.error, true) << "\n";
            else if (r.written) std::cout << "rewritten\n";
            else if (!r.changed) std::cout << "unchanged\n";
            else std::cout << "not rewritten (another file of the set was refused)\n";
        }
        if (exit_code == kExitOk) std::cout << "golden: now run build/bin/kvcheck golden verify\n";
    });
}

} // namespace

void add_golden_commands(CLI::App& app, int& exit_code) {
    static std::string dir = KVCHECK_DEFAULT_GOLDEN_DIR; // CLI11 keeps references: must outlive parse()
    auto* golden = app.add_subcommand("golden", "The numbers the source documents print, checked against the reference");
    golden->require_subcommand(1);
    add_verify(*golden, dir, exit_code);
    add_regen(*golden, dir, exit_code);
}

} // namespace kvc::cli
