// The work a child process does, and starting it. A request (JSON) says what to load and what to run:
// {"kind": "probe" | "case" | "replay" | "model_case", "plugin": PATH | "builtin": NAME, "memory_limit": BYTES, ...}.
// The child answers on its result descriptor with lines: "L <json>" (probe), "P <json>" (a provisional FAIL, before
// shrinking), "F <json>" (the final result), and "M" when an allocation was refused under the memory limit. The
// same function serves fork isolation (called in the fork()ed child) and exec isolation (called by the re-executed
// kvcheck, exec_child_main).
#pragma once

#include "kvcheck/harness/isolate.hpp"
#include "kvcheck/harness/subjects.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace kvc::harness {

// {"kind": kind, "memory_limit": ..., "plugin" | "builtin": ...} for this subject.
nlohmann::json request_for(const Subject& s, const std::string& kind);

// Does the request in this process and writes the answer to fd. Runs plugin code: only ever called in a child.
void run_request(const nlohmann::json& req, int fd);

// The request in a child of the subject's isolation, memory limit and the given timeout.
ChildRun run_isolated(const Subject& s, const nlohmann::json& req, double timeout_s);

// How a child ended, in words, when it did not end by itself with status 0.
std::string ending_text(const ChildRun& run, double timeout_s);

// kvc_caps / kvcm_caps as hex bytes between the probe child and the parent (the same binary wrote both sides).
std::string bytes_hex(const void* p, std::size_t n);
bool bytes_from_hex(const std::string& s, void* p, std::size_t n);

} // namespace kvc::harness
