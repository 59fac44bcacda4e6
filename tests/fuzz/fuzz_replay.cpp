// Fuzz target: a replay document (`kvcheck replay FILE`), read with the CLI's strict reader: its "case" through
// prop::case_from_json (model::case_from_json for a "level": "model" document) and its "expected_mismatch" through
// prop::mismatch_from_json. Contract: bad input throws std::invalid_argument, nothing else escapes, and a case that
// is accepted describes and serializes back to a case that is accepted again.
#include "kvcheck/model/model_case.hpp"
#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/runner.hpp"
#include "kvcheck/strict_json.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using nlohmann::json;
    json doc;
    try {
        doc = kvc::json_strict::parse(std::string(reinterpret_cast<const char*>(data), size));
    } catch (const json::exception&) { // parse_error, and out_of_range for numbers like 1e400: the JSON layer's
        return 0;                      // own errors (the readers must catch both: docs/bad-input.md)
    } catch (const kvc::json_strict::Violation&) { // a duplicate key, too deep, too many values
        return 0;
    }
    const json* c = doc.is_object() && doc.contains("case") ? &doc["case"] : &doc;
    if (doc.is_object() && doc.contains("level") && doc["level"] == "model") {
        try {
            const kvc::model::ModelCase parsed = kvc::model::case_from_json(*c);
            (void)parsed.describe();
            const kvc::model::ModelCase again = kvc::model::case_from_json(kvc::model::to_json(parsed));
            if (kvc::model::to_json(again) != kvc::model::to_json(parsed)) std::abort(); // not a fixed point
        } catch (const std::invalid_argument&) {
        }
        return 0;
    }
    try {
        const kvc::prop::Case parsed = kvc::prop::case_from_json(*c);
        (void)kvc::prop::describe(parsed);
        const kvc::prop::Case again = kvc::prop::case_from_json(kvc::prop::to_json(parsed));
        if (kvc::prop::to_json(again) != kvc::prop::to_json(parsed)) std::abort(); // not a fixed point
    } catch (const std::invalid_argument&) {
    }
    if (doc.is_object() && doc.contains("expected_mismatch")) {
        try {
            (void)kvc::prop::mismatch_from_json(doc["expected_mismatch"]);
        } catch (const std::invalid_argument&) {
        }
    }
    return 0;
}
