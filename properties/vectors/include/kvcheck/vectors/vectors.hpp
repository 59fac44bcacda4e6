// kvcheck export | grade: conformance cases as files, for implementations that cannot load a C plugin (any
// language), and the grading of what they write back. docs/vectors.md specifies every file.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace kvc::vec {

// The most cases per property `export` writes (each case is three files; up to 200 indices are drawn per case).
constexpr int kMaxExportCases = 100000;

struct ExportOptions {
    std::string out;                 // directory to write
    int cases = 10;                  // per property
    uint64_t seed = 20261129;        // the run seed (the same as `kvcheck validate --seed`)
    std::vector<std::string> properties{"EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "MEMORY"};
    std::vector<std::string> dtypes{"f32", "f16", "bf16"};
    std::string caps; // the implementation's declaration (vectors_caps.hpp); "" = export every case
};

// Returns a process exit code (commands.hpp): 0 written, 2 bad options or unwritable directory, 3 internal.
int run_export(const ExportOptions& o, std::ostream& out, std::ostream& err);

struct GradeOptions {
    std::string vectors; // what `kvcheck export` wrote
    std::string results; // what the implementation wrote
    std::string report;  // JSON report ("" = none)
    std::string junit;   // JUnit XML ("" = none)
};

// Returns 0 every graded case PASS / QUALITY_WARNING (cases outside the declaration get no verdict), 1 any FAIL or
// ERROR, 2 a missing or malformed file (a results manifest declaring less than the export's --caps included),
// 3 internal.
int run_grade(const GradeOptions& o, std::ostream& out, std::ostream& err);

} // namespace kvc::vec
