// Report files of `kvcheck validate`: the canonical JSON report (built by validate.cpp, described in
// docs/cli.md), the JUnit XML derived from it, and writing either whole or not at all.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace kvc::harness {

// Schema version of the JSON report ("kvcheck_report" field).
constexpr int kReportSchema = 1;

// JSON text that never throws on bytes that are not UTF-8 (an implementation's error message may hold any bytes):
// such bytes become U+FFFD.
std::string dump_json(const nlohmann::json& j, int indent = -1);

// Text safe inside XML 1.0 elements and attribute values: markup characters escaped, characters XML cannot carry
// (control characters, invalid UTF-8) replaced by U+FFFD. In attributes, line breaks and tabs become references.
std::string xml_escape(const std::string& s, bool attribute);

// The JUnit XML of a JSON report: one <testsuite> per property (per implementation and property when the report
// holds several), one <testcase> per case. FAIL -> <failure>, ERROR/CRASH/TIMEOUT -> <error>, NOT_SUPPORTED ->
// <skipped message="..."/>, QUALITY_WARNING -> a passing case with <system-out>.
std::string junit_from_report(const nlohmann::json& report);

// Writes content to path through a temporary beside it (".NAME.kvcheck-tmp", created O_EXCL|O_NOFOLLOW,
// fsynced) and rename(), so that path is either the complete new content or untouched. A destination that exists
// and is not a regular file (symbolic link, FIFO, device, directory) is refused. On failure returns false with a
// message in `error` and leaves no temporary behind; a temporary left by a killed run is removed by the next write
// of the same destination.
//
// Flush::Later skips the two fsyncs (the temporary's and the directory's): for a set of many files behind one commit
// mark, whose writer calls flush_filesystem() once before it writes the mark (kvcheck export: hundreds of vector
// files, then the manifest). A kill still leaves each file whole or untouched; only durability across a power loss
// waits for that one flush.
enum class Flush { Now, Later };
bool write_file_atomically(const std::string& path, const std::string& content, std::string& error,
                           Flush flush = Flush::Now);

// Flushes the filesystem that holds `dir` to disk (syncfs): what Flush::Later left in memory. False with `error`
// when it fails.
bool flush_filesystem(const std::string& dir, std::string& error);

// Several files (a report and its JUnit form): all temporaries are written and flushed first, so a failure while
// writing leaves every destination untouched. Then the first file is the commit mark: it is removed, the others are
// renamed into place, and it is renamed last. Whenever the first file exists, the others are of the same write; a
// kill inside that window of a few system calls leaves the first file absent (docs/cli.md).
bool write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files, std::string& error);

// True when a file can be written at path: its directory exists and is writable, the path is absent or a writable
// regular file (never a symbolic link, FIFO, device, directory or read-only file), and no directory stands where
// its temporary goes. Otherwise `error` says why. Checked before a run starts, so a typo in --report does not cost
// a whole run.
bool can_create_file(const std::string& path, std::string& error);

// Whether two paths name one file: same device and inode when both exist, else the same real parent directory
// and name (so "a.json" and "./a.json" are one file).
bool same_file(const std::string& a, const std::string& b);

// Every (option, path) with a non-empty path passes can_create_file, and no two name the same file. `error` names
// the options.
bool check_output_files(const std::vector<std::pair<std::string, std::string>>& outputs, std::string& error);

// True when a directory can be written at path: it exists and is a writable directory, or it does not exist and
// its nearest existing ancestor is one (for --counterexamples, checked before a run starts).
bool can_create_directory(const std::string& path, std::string& error);

} // namespace kvc::harness
