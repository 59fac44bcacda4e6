// kvcheck export | grade: conformance cases as files for implementations in any language, and the grading of the
// results they write back. The work lives in vectors_export.cpp and vectors_grade.cpp; this file only declares the
// options. docs/vectors.md specifies the files.
#include "commands.hpp"

#include "kvcheck/vectors/vectors.hpp"

#include "kvcheck/harness/selection.hpp"

#include <iostream>

namespace kvc::cli {

namespace {

void add_export(CLI::App& app, int& exit_code) {
    static vec::ExportOptions o; // CLI11 keeps references: must outlive parse()
    auto* cmd = app.add_subcommand(
        "export", "Write conformance cases as files: inputs (safetensors), expected outputs, tolerance bounds, stored "
                  "rows and live bytes, and a manifest (docs/vectors.md). Exit 0 written, 2 bad options or "
                  "unwritable directory");
    cmd->add_option("--out", o.out, "directory to write (created if missing)")->check(path_given())->required();
    cmd->add_option("--cases", o.cases, "cases per property")->capture_default_str()->check(CLI::Range(1, 1000000));
    static std::string seed_text = std::to_string(o.seed); // parsed as validate parses its --seed
    cmd->add_option("--seed", seed_text,
                    "run seed: case PROPERTY/i is case i of `kvcheck validate` with the same --seed and --cases")
        ->capture_default_str();
    cmd->add_option("--properties", o.properties, "comma-separated property IDs that can be graded offline")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--dtypes", o.dtypes, "comma-separated cache dtypes to keep (f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8_token, q8_0)")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--caps", o.caps,
                    "JSON file declaring the implementation's capabilities, limits and pipeline (docs/vectors.md): "
                    "cases outside them are listed as not supported instead of exported")->check(path_given());
    cmd->callback([&exit_code] {
        exit_code = guarded("export", [] {
            o.seed = harness::parse_seed(seed_text);
            return vec::run_export(o, std::cout, std::cerr);
        });
    });
}

void add_grade(CLI::App& app, int& exit_code) {
    static vec::GradeOptions o;
    auto* cmd = app.add_subcommand(
        "grade", "Grade an implementation's results for exported vectors (EQUIV, CACHE-CONTENT, APPEND-ONLY, "
                 "MEMORY). Exit 0 all pass, 1 a FAIL or ERROR, 2 a missing or malformed file");
    cmd->add_option("--vectors", o.vectors, "directory written by `kvcheck export`")->check(path_given())->required();
    cmd->add_option("--results", o.results, "directory written by the implementation")->check(path_given())->required();
    cmd->add_option("--report", o.report, "write the verdicts as JSON to this file")->check(path_given());
    cmd->add_option("--junit", o.junit, "write the verdicts as JUnit XML to this file")->check(path_given());
    cmd->callback([&exit_code] { exit_code = vec::run_grade(o, std::cout, std::cerr); });
}

} // namespace

void add_vectors_commands(CLI::App& app, int& exit_code) {
    add_export(app, exit_code);
    add_grade(app, exit_code);
}

} // namespace kvc::cli
