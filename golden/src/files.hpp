// Private: whole-file reads and atomic writes for the golden directory.
#pragma once

#include <filesystem>
#include <string>

namespace kvc::golden {

bool read_file(const std::filesystem::path& path, std::string& text);
// Writes to a sibling temporary file, then renames it over path: a crash never leaves a truncated golden file.
bool write_file(const std::filesystem::path& path, const std::string& text);

} // namespace kvc::golden
