// Fuzz target: an implementation's results manifest (`kvcheck grade --results DIR`, DIR/manifest.json): format,
// name, capabilities, limits and the declared pipeline (vectors_caps.hpp declared_from_json). Contract
// (vectors_commands.hpp): run_grade returns 0..3 and throws nothing.
#include "grade_dirs.hpp"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const fuzz::GradeDirs dirs;
    dirs.grade(fuzz::kEmptyVectors, std::string(reinterpret_cast<const char*>(data), size));
    return 0;
}
