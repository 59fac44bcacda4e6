// Fuzz target: a golden file (golden/*.json) through verify_text and regen_text. Contract (golden.hpp): verify never
// throws; regen throws only FormatError, and what it writes verifies as well-formed and regenerates to itself.
#include "kvcheck/golden/golden.hpp"
#include "kvcheck/golden/oracle.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace kvc::golden;
    static const Oracle oracle; // the reference's numbers: built once, read only
    const std::string name = "000_7a0753d5dc4e224c.json";
    const std::string text(reinterpret_cast<const char*>(data), size);
    (void)verify_text(name, text, oracle);
    std::string fresh;
    try {
        fresh = regen_text(name, text, oracle);
    } catch (const FormatError&) {
        return 0;
    }
    if (!verify_text(name, fresh, oracle).malformed.empty()) std::abort(); // regen wrote a file verify refuses
    if (regen_text(name, fresh, oracle) != fresh) std::abort();           // regen is not deterministic
    return 0;
}
