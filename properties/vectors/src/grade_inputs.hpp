// What `kvcheck grade` reads before it grades: the exported vectors (their manifest, and their inputs checked
// against each case's data seed) and the results manifest (the implementation's declaration). Every file is read
// with the harness's bounded, strict readers; a missing or malformed one is a BadInput naming the file.
#pragma once

#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/case.hpp"
#include "kvcheck/vectors/caps.hpp"
#include "kvcheck/vectors/model.hpp"

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvc::vec {

// A missing or malformed file: grading stops with exit 2. The message names the file and the problem.
class BadInput : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// ---- the exported vectors ----

struct VCase {
    std::string id, property, stem;
    int index = 0;
    uint64_t seed = 0;
    std::vector<std::string> requires_;
    prop::Case c;
    OfflineChecks checks;
    std::vector<Step> steps;
};

// A case `kvcheck export` did not write because it lies outside the declared capabilities.
struct Refused {
    std::string id, property;
    uint64_t seed = 0;
    std::vector<std::string> needs;
};

struct Vectors {
    uint64_t seed = 0;
    bool has_declared = false; // exported with --caps: the manifest's "declared"
    Declared declared;
    std::vector<VCase> cases;
    std::vector<Refused> refused;
};

// Reads dir/manifest.json and every case's inputs; throws BadInput.
Vectors load_vectors(const std::filesystem::path& dir);

// ---- the results ----

struct Results {
    std::string name, version;
    Declared declared; // capabilities, limits and the pipeline it is graded for
};

// Reads dir/manifest.json of the results; throws BadInput.
Results load_results(const std::filesystem::path& dir);

// A case's error record (docs/vectors.md: RESULTS/<file>.json alone, {"case", "error": {"step", "call", "message"}})
// as a reason: what the library said, where. Empty when the file is not such a record (then the missing
// .safetensors is the reason). Never throws: a malformed record is no record.
std::string driver_error_reason(const std::filesystem::path& results_dir, const std::string& json_name);

} // namespace kvc::vec
