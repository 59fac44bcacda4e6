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
    std::filesystem::path target; // a golden file directly in dir
    std::string text;
};
// The commit record of a set being written (write_set): one target file name per line.
inline constexpr const char* kJournalName = ".regen-journal";

// Replaces every target with its text as one set, all or nothing, even when killed: all temporaries
// (".<name>.regen.tmp" beside the target) are written and fsynced, the directory is fsynced, then the journal
// (kJournalName, the list of targets) is written durably: the commit point. Then all renames, fsync, the journal
// removed, fsync. A failure before the commit point removes the temporaries and changes nothing. Returns "" or what
// failed. A process killed before the commit point leaves the old set and temporaries (removed by the next regen);
// killed after it, a journal that the next regen rolls forward (finish_interrupted) to the complete new set.
std::string write_set(const std::filesystem::path& dir, const std::vector<Rewrite>& rewrites);

// Completes what an interrupted write_set left: with a journal, renames every staged temporary it names into place
// and removes the journal (the set is then all new); without one, removes leftover temporaries (all old). Returns
// "" or why the journal cannot be finished (not a regular file, truncated, names something that is not a golden
// file, a target neither there nor staged): then nothing is guessed and the message says what to do by hand.
// `finished` receives the names renamed now.
std::string finish_interrupted(const std::filesystem::path& dir, std::vector<std::string>& finished);

// Whether dir holds a journal of a regen that was interrupted after its commit point (verify refuses such a set).
bool interrupted_regen(const std::filesystem::path& dir);

// Removes temporaries of an interrupted regen from dir; returns their names.
std::vector<std::string> remove_leftover_temporaries(const std::filesystem::path& dir);

} // namespace kvc::golden
