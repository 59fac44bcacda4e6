// Report files of `kvcheck validate`: the canonical JSON report (built by cmd_validate.cpp, described in
// docs/cli.md), the JUnit XML derived from it, and writing either whole or not at all.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace kvc::cli {

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

// Writes content to path through path + ".tmp" and rename(), so that path is either the complete new content or
// untouched. On failure returns false with a message in `error` and leaves no temporary file behind.
bool write_file_atomically(const std::string& path, const std::string& content, std::string& error);

// Several files (a report and its JUnit form): all temporaries are written first, then renamed, so a failure while
// writing leaves every destination untouched.
bool write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files, std::string& error);

// True when a file can be created at path (its directory exists and is writable); otherwise `error` says why.
// Checked before a run starts, so a typo in --report does not cost a whole run.
bool can_create_file(const std::string& path, std::string& error);

} // namespace kvc::cli
