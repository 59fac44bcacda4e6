// Private: the only JSON parser golden files go through. nlohmann/json keeps the last of two equal keys in an
// object; a golden file with a duplicated key would verify against one value and regen would silently drop the
// other, so a duplicate is an error here.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvc::golden {

// Parses text as JSON with the project's strict, linear reader (kvcheck/strict_json.hpp). Throws
// nlohmann::json::exception on bad syntax and FormatError (with the JSON pointer) on a key that appears twice in one
// object, nesting deeper than 128 levels or more than about 4 million values.
nlohmann::json parse_strict(const std::string& text);

} // namespace kvc::golden
