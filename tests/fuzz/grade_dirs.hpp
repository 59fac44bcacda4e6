// Shared by the vectors-manifest and results-manifest fuzz targets: `kvcheck grade` reads both from directories,
// so each input is written to a scratch directory (made once per process, removed at exit) and graded.
#pragma once

#include "kvcheck/vectors/vectors.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

namespace fuzz {

// A well-formed manifest of each kind: the fixed half of a run whose other half is the fuzzed input.
inline const char* kEmptyVectors = R"({"kvcheck_vectors": 2, "seed": 1, "cases": []})";
inline const char* kResults = R"({"kvcheck_results": 1, "implementation": "fuzz", "pipeline": "f32",
                                  "capabilities": ["dtype f32", "rope neox", "gqa", "fork", "release", "batch"]})";

class GradeDirs {
public:
    GradeDirs() {
        namespace fs = std::filesystem;
        root_ = fs::temp_directory_path() / ("kvcheck-fuzz-grade-" + std::to_string(::getpid()));
        fs::create_directories(root_ / "vectors");
        fs::create_directories(root_ / "results");
    }
    ~GradeDirs() {
        std::error_code ec;
        std::filesystem::remove_all(root_, ec);
    }
    // Grades vectors/manifest.json = vectors, results/manifest.json = results; aborts on an exit code outside 0..3.
    int grade(const std::string& vectors, const std::string& results) const {
        std::ofstream(root_ / "vectors" / "manifest.json", std::ios::binary | std::ios::trunc) << vectors;
        std::ofstream(root_ / "results" / "manifest.json", std::ios::binary | std::ios::trunc) << results;
        kvc::vec::GradeOptions o;
        o.vectors = (root_ / "vectors").string();
        o.results = (root_ / "results").string();
        std::ostringstream out, err;
        const int rc = kvc::vec::run_grade(o, out, err);
        if (rc < 0 || rc > 3) std::abort();
        return rc;
    }

private:
    std::filesystem::path root_;
};

} // namespace fuzz
