// Private: the only JSON parser golden files go through. nlohmann/json keeps the last of two equal keys in an
// object; a golden file with a duplicated key would verify against one value and regen would silently drop the
// other, so a duplicate is an error here.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvc::golden {

// Parses text as JSON. Throws nlohmann::json::exception on bad syntax and FormatError (with the JSON pointer of the
// second occurrence) on a key that appears twice in one object.
nlohmann::json parse_strict(const std::string& text);

} // namespace kvc::golden
