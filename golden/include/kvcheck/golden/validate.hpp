// Reading a golden file as golden/schema/golden.schema.json describes it. There is no JSON Schema validator in
// Debian's archive, so the rules are written out here once; tests/golden checks that the schema file agrees.
// Every failure is a FormatError whose path is a JSON pointer into the file.
#pragma once

#include "kvcheck/golden/printed.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace kvc::golden {

// One entry, flattened row-major.
struct Entry {
    size_t index = 0;                   // position in /entries
    std::string id, kind, quantity;     // kind: printed | derived | assumed
    std::vector<std::string> printed;   // kind printed: the texts as printed
    std::vector<size_t> shape;          // of printed (or of computed when nothing is printed); {} is a scalar
    int decimals = 0;
    bool exact = false;
    long double tolerance = 0;          // printed_tolerance(decimals, exact)
    long double unit_divisor = 1;       // the reference's value (bytes, tokens, parameters) / this = printed unit
    std::optional<std::vector<long double>> computed;
    std::optional<long double> greater_than; // claim: the reference's value must exceed this
};

struct GoldenFile {
    std::string document;               // e.g. 000_7a0753d5dc4e224c.txt
    std::vector<Entry> entries;
};

// file_name: e.g. 000_7a0753d5dc4e224c.json; its stem must be the document's. need_computed: verify needs every
// `computed` present; regen fills missing ones.
GoldenFile parse_golden(const nlohmann::json& doc, const std::string& file_name, bool need_computed);

} // namespace kvc::golden
