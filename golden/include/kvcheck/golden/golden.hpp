// kvcheck golden data: every number the four source documents print, checked against the reference.
//
// Contract.
// - A golden file (golden/NNN_<hash>.json, one per document in shared/seeds/NNN_<hash>.txt) lists entries. Each
//   entry names a `quantity` that the Oracle computes by running the reference (or the cache-size formula), never
//   by reading a golden file. Its format is golden/schema/golden.schema.json; validate.hpp enforces it.
// - kind "printed": the document prints it. `printed` holds the text as printed, `decimals` its precision. It must
//   match the reference to within 0.5 * 10^-decimals, or exactly when `exact` is true.
// - kind "derived": the document leaves it out but it follows from what it prints (how, and whether uniquely, is in
//   `derivation`). kind "assumed": taken from outside the document (e.g. a model's published config).
// - Every entry holds `computed`: the reference's value (long double, stored as the shortest text that reads back
//   to the same double, at most 17 significant digits), written by regen and compared at 1e-12 relative. A file
//   whose `computed` disagrees with the reference is stale.
// - verify never throws on bad input and never writes; regen rewrites only `computed` and is deterministic
//   (sorted keys, canonical_json.hpp's layout): running it twice gives the same bytes.
//
// Exit codes (tools/kvcheck/commands.hpp): 0 all match; 1 a number mismatches the reference (or a claim fails);
// 2 a file is missing, malformed or stale (the message names the file and kRegenCommand); 3 internal error.
#pragma once

#include "kvcheck/golden/printed.hpp" // FormatError

#include <filesystem>
#include <string>
#include <vector>

namespace kvc::golden {

inline constexpr int kSchemaVersion = 1;
inline constexpr const char* kRegenCommand = "build/bin/kvcheck golden regen";

class Oracle;

// One number that disagrees: with the document (mismatch) or with the file's own `computed` (stale).
struct Problem {
    std::string path;     // JSON pointer into the file, e.g. /entries/12/printed/2
    std::string entry;    // the entry's id, e.g. turn1.weights
    std::string expected; // what the file says (with its tolerance)
    std::string actual;   // what the reference gives
};

struct FileReport {
    std::string file;                 // file name, e.g. 000_7a0753d5dc4e224c.json
    int printed = 0;                  // printed numbers checked
    int derived = 0;                  // derived or assumed numbers checked
    std::vector<Problem> mismatches;  // printed value (or claim) vs reference: exit 1
    std::vector<Problem> stale;       // computed field vs reference: exit 2
    std::string malformed;            // why the file cannot be read (empty when it can): exit 2
    int numbers() const { return printed + derived; }
};

struct Report {
    std::vector<FileReport> files;
    std::string error;        // the directory itself is unusable (missing, no golden files): exit 2
    std::vector<std::string> unchecked; // oracle quantities no file names (a file or entry is missing): exit 2
    std::string internal;     // the oracle failed (a bug in kvcheck, not in the data): exit 3
    int exit_code() const;    // 0 ok, 1 mismatch, 2 malformed/stale/missing, 3 internal
};

// The JSON files of a golden directory (schema/ excluded), sorted by name. Throws std::runtime_error when the
// directory is missing or holds none.
std::vector<std::filesystem::path> golden_files(const std::filesystem::path& dir);

// Checks one file's text. `name` is the file name (it must match the document the file describes).
FileReport verify_text(const std::string& name, const std::string& text, const Oracle& oracle);
// Checks every golden file in dir against a freshly built Oracle.
Report verify_dir(const std::filesystem::path& dir);

// The file's text with every `computed` field set from the oracle, in canonical layout. Throws FormatError
// when the file is malformed; a missing `computed` is filled in, not an error.
std::string regen_text(const std::string& name, const std::string& text, const Oracle& oracle);

struct RegenResult {
    std::string file;
    bool changed = false; // the fresh text differs from the file's
    bool written = false; // and it replaced the file
    std::string error;    // malformed, unreadable, or not replaceable (symlink, not a regular file, read-only)
};
// Rewrites every golden file in dir as one set: all are computed and checked first, and when any has an error
// nothing is written. Then all temporaries, fsync, a journal (the commit point), all renames, the journal removed
// (files.hpp write_set): a kill before the commit point leaves the old set, after it a journal that the next regen
// rolls forward first (finish_interrupted_regen), so the set is all old or all new. A failed write is an error of
// each file that was to be rewritten. Throws std::runtime_error (bad input) for a missing directory or a journal
// that cannot be finished.
std::vector<RegenResult> regen_dir(const std::filesystem::path& dir, std::string& internal_error);

// Completes a regen killed midway: after its commit point, renames the staged files its journal names into place
// (returns their names; the set is then all new); before it, removes its temporaries (the set stays all old).
// Throws std::runtime_error saying what to do by hand when the journal cannot be trusted (edited, truncated, naming
// a file that is neither there nor staged). verify refuses a set with such a journal (exit 2) until this has run.
std::vector<std::string> finish_interrupted_regen(const std::filesystem::path& dir);

// Human-readable verify report: one line per file, problems, and a total line:
//   golden: 412 numbers checked in 4 files, 0 mismatches
std::string format_report(const Report& report);

} // namespace kvc::golden
