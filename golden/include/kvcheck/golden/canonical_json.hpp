// The one layout golden files are written in, so that regen is byte-for-byte reproducible and diffs stay small:
// keys sorted (nlohmann::json's std::map), two-space indent, arrays of scalars on one line, objects of scalars
// on one line when that line is at most 100 characters, numbers as
// nlohmann/json prints them (integers as integers, doubles as the shortest text that reads back to the same
// double, at most 17 significant digits), UTF-8 left as is, and a final newline.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvc::golden {

std::string canonical_json(const nlohmann::json& j);

} // namespace kvc::golden
