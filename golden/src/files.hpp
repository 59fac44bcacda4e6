// Private: whole-file reads and the all-or-nothing write of a regenerated set, for the golden directory.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kvc::golden {

// Golden files are small hand-edited documents; anything larger is not one (and /dev/zero must not fill memory).
inline constexpr size_t kMaxGoldenBytes = 16u << 20;

// Reads a whole regular file (a symlink to one is followed) of at most kMaxGoldenBytes. Returns "" on success,
// else why not ("not a regular file", "larger than 16 MiB", the system's error). Never blocks on a FIFO.
std::string read_file(const std::filesystem::path& path, std::string& text);

// Why regen must not replace `path` ("" when it may): a symbolic link (the rename would replace the link, not its
// target), not a regular file, or read-only (a person protected it; as root the write would otherwise succeed).
std::string replace_refusal(const std::filesystem::path& path);

struct Rewrite {
    std::filesystem::path target;
    std::string text;
};
// Replaces every target with its text as one set: all temporaries (".<name>.regen.tmp" beside the target) are
// written and fsynced first, the directory is fsynced, then all are renamed and the directory fsynced again. A
// failure before the renames removes the temporaries and changes nothing. Returns "" or what failed.
// A process killed midway leaves every target either old or new, never torn; its temporaries are removed by the
// next regen (remove_leftover_temporaries).
std::string write_set(const std::filesystem::path& dir, const std::vector<Rewrite>& rewrites);

// Removes temporaries of an interrupted regen from dir; returns their names.
std::vector<std::string> remove_leftover_temporaries(const std::filesystem::path& dir);

} // namespace kvc::golden
