// Fuzz target: the child -> parent result protocol. The case process writes one JSON document per line after "P "
// or "F "; the parent reads it with prop::case_result_from_json. A plugin that scribbles on the pipe controls these
// bytes. Contract: bad input throws std::invalid_argument, nothing else escapes, and an accepted result writes back
// (prop::to_json) to a document that is accepted again.
#include "kvcheck/properties/runner.hpp"

#include "kvcheck/strict_json.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using nlohmann::json;
    std::string text(reinterpret_cast<const char*>(data), size);
    if (text.size() >= 2 && (text[0] == 'P' || text[0] == 'F') && text[1] == ' ') text.erase(0, 2);
    json doc;
    try {
        doc = kvc::json_strict::parse(text); // the reader the parent uses for these lines
    } catch (const json::exception&) {
        return 0;
    } catch (const kvc::json_strict::Violation&) {
        return 0;
    }
    try {
        const kvc::prop::CaseResult r = kvc::prop::case_result_from_json(doc);
        (void)kvc::prop::case_result_from_json(kvc::prop::to_json(r));
    } catch (const std::invalid_argument&) {
    }
    return 0;
}
