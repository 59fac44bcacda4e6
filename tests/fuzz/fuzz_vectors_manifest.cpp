// Fuzz target: the vectors manifest (`kvcheck grade --vectors DIR`, DIR/manifest.json) as `kvcheck export` writes
// it and a user may edit it: format, cases, their embedded case scripts, configs and steps. Contract
// (vectors_commands.hpp): run_grade returns 0..3 and throws nothing.
#include "grade_dirs.hpp"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const fuzz::GradeDirs dirs;
    dirs.grade(std::string(reinterpret_cast<const char*>(data), size), fuzz::kResults);
    return 0;
}
