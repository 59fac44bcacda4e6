// kvcheck validate | replay: the conformance properties against one implementation (or every built-in), each case in
// a child process of its own, with a verdict table, a JSON and a JUnit report, and replay files for what failed.
// The properties, the case generator, shrinking and the verdicts live in kvcheck_properties; this file chooses the
// cases, isolates them (isolate.hpp), prints and reports (report.hpp). docs/cli.md describes the behaviour.
#include "commands.hpp"

#include "input_file.hpp"
#include "isolate.hpp"
#include "report.hpp"
#include "vocabulary.hpp"

#include "kvcheck/builtins.hpp"
#include "kvcheck/properties/runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <new>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvc::cli {
namespace {

using prop::Verdict;

constexpr Verdict kVerdicts[] = {Verdict::Pass,  Verdict::Fail,  Verdict::NotSupported, Verdict::QualityWarning,
                                 Verdict::Error, Verdict::Crash, Verdict::Timeout};
constexpr int kVerdictCount = 7;
constexpr int kFullReportsPerProperty = 3; // failures printed in full per property; the rest get one line each

int verdict_index(Verdict v) {
    for (int i = 0; i < kVerdictCount; ++i)
        if (kVerdicts[i] == v) return i;
    return 0;
}

// PASS, NOT_SUPPORTED and QUALITY_WARNING keep an implementation conformant; anything else does not.
bool conformant(Verdict v) {
    return v == Verdict::Pass || v == Verdict::NotSupported || v == Verdict::QualityWarning;
}

// Bad input found after parsing (unloadable plugin, malformed file, impossible option): message, exit 2.
class BadInput : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

std::string shell_quote(const std::string& s) {
    const bool plain = !s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                         "0123456789_./:=+-,@%") == std::string::npos;
    if (plain) return s;
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// ---------------------------------------------------------------------------------------------------------------
// Implementations under test. The parent never loads a plugin nor calls into one (a constructor, the entry
// function or get_caps could exit, crash or hang it): a probe child loads it and reports what the parent needs, and
// every case child loads it again for itself.

// A plugin that misbehaved while being loaded: crashed, exited (even with 0), hung, flooded the harness's pipes or
// wrote past kvc_caps. Exit kExitPluginFailed.
class PluginFailed : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A built-in named on its own that cannot run on this machine (the CUDA engine without a usable device): nothing was
// judged, so neither conformant nor not. Exit kExitNotRunnable; `--builtin all` skips it with the reason instead.
class NotRunnable : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum class Isolation { Fork, Exec };

const char* isolation_name(Isolation i) { return i == Isolation::Exec ? "exec" : "fork"; }

// What the parent knows of an implementation: what its probe reported. `target.api` stays null in the parent.
struct Subject {
    prop::Target target;     // name, origin and capabilities
    std::string version;     // printable()
    uint32_t abi_major = 0, abi_minor = 0;
    std::string label;       // short name for tables: the built-in's name, or the plugin's own name
    std::string target_args; // how to name it on a command line: "--builtin NAME" or "--plugin PATH"
    std::string plugin_file; // what a child dlopen()s, or
    std::string builtin;     // the built-in a child takes
    Isolation isolation = Isolation::Fork;
    uint64_t memory_limit = 0; // RLIMIT_AS of each case's child; 0: none
    bool memory_limit_asked = false; // given with --memory-limit, not the default
};

// --isolation and --memory-limit as given, and the per-case timeout (validate and replay share them).
struct IsolationOptions {
    std::string isolation = "auto";
    std::string memory_limit = "auto";
    double timeout = 30;
};

constexpr uint64_t kDefaultMemoryLimit = uint64_t{8} << 30; // host plugins, per case (docs/cli.md, Isolation)
constexpr uint64_t kSmallestMemoryLimit = uint64_t{64} << 20; // kvcheck itself needs some to run a case at all

// "auto" (nullopt), "none" or 0 (no limit), or a size: bytes, or a number with K, M, G or T (powers of 1024).
std::optional<uint64_t> parse_memory_limit(const std::string& text) {
    if (text == "auto") return std::nullopt;
    if (text == "none" || text == "0") return uint64_t{0};
    static const std::regex form("([0-9]{1,12})(\\.[0-9]{1,6})?([KMGTkmgt]i?B?|B)?");
    std::smatch m;
    long double bytes = 0;
    if (std::regex_match(text, m, form)) {
        bytes = std::stold(m[1].str() + m[2].str());
        const std::string unit = m[3].str();
        const char u = unit.empty() ? 'B' : static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
        for (const char step : {'K', 'M', 'G', 'T'}) {
            bytes *= 1024;
            if (u == step) break;
            if (step == 'T' || u == 'B') bytes /= 1024; // (undone for bytes, at the first step)
            if (u == 'B') break;
        }
    }
    if (bytes < static_cast<long double>(kSmallestMemoryLimit) || bytes > 1e18L)
        throw BadInput("--memory-limit " + text + ": expected auto, none, or a size of at least 64M such as 4G, "
                                                  "512M or 8589934592 (bytes)");
    return static_cast<uint64_t>(bytes);
}

std::string bytes_text(uint64_t b) {
    std::ostringstream s;
    if (b >= (uint64_t{1} << 30) && b % (uint64_t{1} << 30) == 0) s << (b >> 30) << " GiB";
    else if (b >= (uint64_t{1} << 20) && b % (uint64_t{1} << 20) == 0) s << (b >> 20) << " MiB";
    else s << b << " bytes";
    return s.str();
}

void check_timeout(double timeout) {
    // CLI11's range check lets NaN through (every comparison with it is false): NaN would switch timeouts off.
    if (!(timeout >= 0.001 && timeout <= 1e6)) {
        std::ostringstream m;
        m << "--timeout " << timeout << ": expected seconds from 0.001 to 1000000";
        throw BadInput(m.str());
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The child's work. A request (JSON) says what to load and what to run: {"kind": "probe" | "case" | "replay",
// "plugin": PATH | "builtin": NAME, "memory_limit": BYTES, ...}. The child answers on its result descriptor with
// lines: "L <json>" (probe), "P <json>" (a provisional FAIL, before shrinking), "F <json>" (the final result), and
// "M" when an allocation was refused under the memory limit. prop::to_json spells NaN and infinities as strings, so
// a NaN output travels like any other number. The same function serves fork isolation (called in the fork()ed
// child) and exec isolation (called by the re-executed kvcheck).

void send(int fd, char tag, const prop::CaseResult& r) {
    write_all(fd, std::string(1, tag) + " " + dump_json(prop::to_json(r)) + "\n");
}

int g_marker_fd = -1;

// operator new's last resort under the memory limit: say so once, then let it throw std::bad_alloc.
void report_refused_allocation() {
    static const char marker[] = "M\n";
    if (g_marker_fd >= 0 && ::write(g_marker_fd, marker, sizeof marker - 1) < 0) {
    }
    std::set_new_handler(nullptr);
}

std::string caps_hex(const kvc_caps& caps) {
    static const char digits[] = "0123456789abcdef";
    const auto* p = reinterpret_cast<const unsigned char*>(&caps);
    std::string s;
    for (std::size_t i = 0; i < sizeof caps; ++i) {
        s += digits[p[i] >> 4];
        s += digits[p[i] & 15];
    }
    return s;
}

// The same binary wrote it (probe child or re-executed kvcheck), so the layout is ours; the size is checked anyway.
bool caps_from_hex(const std::string& s, kvc_caps& caps) {
    if (s.size() != 2 * sizeof caps) return false;
    auto* p = reinterpret_cast<unsigned char*>(&caps);
    for (std::size_t i = 0; i < sizeof caps; ++i) {
        const auto nibble = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
        p[i] = static_cast<unsigned char>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
    }
    return true;
}

prop::Target load_in_child(const nlohmann::json& req) {
    if (req.contains("plugin")) return prop::load_plugin(req.at("plugin").get<std::string>());
    const std::string name = req.at("builtin").get<std::string>();
    const Builtin* b = find_builtin(name);
    if (!b) throw prop::LoadError("unknown built-in \"" + name + "\"");
    try {
        return prop::target_from_entry(b->entry, "builtin:" + b->name);
    } catch (const prop::LoadError& e) {
        throw prop::LoadError(std::string("built-in ") + b->name + " cannot be used: " + e.what());
    }
}

void run_request(const nlohmann::json& req, int fd) {
    g_marker_fd = fd;
    if (req.value("memory_limit", uint64_t{0})) std::set_new_handler(report_refused_allocation);
    const std::string kind = req.at("kind").get<std::string>();
    prop::Target t;
    try {
        t = load_in_child(req);
    } catch (const prop::LoadError& e) {
        if (kind == "probe") {
            const bool misbehaved = dynamic_cast<const prop::PluginMisbehaved*>(&e) != nullptr;
            write_all(fd, "L " + dump_json({{"error", e.what()}, {"misbehaved", misbehaved}}) + "\n");
            return;
        }
        prop::CaseResult r;
        r.id = req.at("id").get<std::string>();
        r.property = req.at("property").get<std::string>();
        r.seed = req.at("seed").get<uint64_t>();
        r.verdict = Verdict::Error;
        r.reason = std::string("the implementation could not be loaded again in the case process: ") + e.what();
        send(fd, 'F', r);
        return;
    }
    if (kind == "probe") {
        const kvc_plugin_api* api = t.api;
        write_all(fd, "L " + dump_json({{"name", t.name},
                                        {"version", api->version ? api->version : "(no version)"},
                                        {"abi_major", api->abi_major},
                                        {"abi_minor", api->abi_minor},
                                        {"caps", caps_hex(t.caps)}}) +
                          "\n");
        return;
    }
    const prop::Property* p = prop::find_property(req.at("property").get<std::string>());
    if (!p) throw std::invalid_argument("unknown property in the request");
    if (kind == "replay") {
        prop::CaseResult r = prop::evaluate_case(t, *p, prop::case_from_json(req.at("case")));
        r.id = req.at("id").get<std::string>();
        r.seed = req.at("seed").get<uint64_t>();
        send(fd, 'F', r);
        return;
    }
    prop::RunSettings s;
    s.seed = req.at("run_seed").get<uint64_t>();
    s.cases = req.at("cases").get<int>();
    s.max_shrink_runs = req.at("max_shrink_runs").get<int>();
    const int index = req.at("index").get<int>();
    const std::string unshrunk_note = req.at("unshrunk_note").get<std::string>();
    prop::CaseResult first = prop::evaluate_case(t, *p, prop::generate_case(*p, s, index, &t.caps));
    first.id = prop::case_id(p->id, index);
    first.seed = prop::case_seed(s.seed, p->id, index);
    if (first.verdict != Verdict::Fail) {
        send(fd, 'F', first);
        return;
    }
    if (!unshrunk_note.empty()) {
        first.notes.push_back(unshrunk_note);
        send(fd, 'F', first);
        return;
    }
    send(fd, 'P', first); // survives if shrinking crashes or hangs
    send(fd, 'F', prop::shrink_case(t, *p, s, index, std::move(first)));
}

nlohmann::json request_for(const Subject& s, const std::string& kind) {
    nlohmann::json req = {{"kind", kind}, {"memory_limit", s.memory_limit}};
    if (!s.plugin_file.empty()) req["plugin"] = s.plugin_file;
    else req["builtin"] = s.builtin;
    return req;
}

ChildRun run_isolated(const Subject& s, const nlohmann::json& req, double timeout_s) {
    ChildLimits limits;
    limits.timeout_s = timeout_s;
    limits.address_space_bytes = s.memory_limit;
    const std::string text = s.isolation == Isolation::Exec ? dump_json(req) : std::string();
    return run_in_child(
        [&](int fd) {
            if (s.isolation == Isolation::Exec) exec_self(text, fd);
            run_request(req, fd);
        },
        limits);
}

// How a child ended, in words, when it did not end by itself with status 0.
std::string ending_text(const ChildRun& run, double timeout_s) {
    std::ostringstream m;
    switch (run.end) {
    case ChildRun::End::Signaled: m << "died of " << signal_description(run.code); break;
    case ChildRun::End::TimedOut: m << "gave no result within the " << timeout_s << " s timeout and was killed"; break;
    case ChildRun::End::Flooded:
        m << "wrote more than kvcheck reads from a case process to " << run.flooded << " and was killed";
        break;
    case ChildRun::End::Exited:
        if (run.code == kExecFailed) m << "could not execute kvcheck again (exec isolation)";
        else if (run.code == kBodyThrew) m << "ended on an exception that escaped into the harness";
        else m << "ended the process (exit status " << run.code << ")";
        break;
    }
    return m.str();
}

// Runs the probe: loads the implementation in a child and returns what the parent needs. Throws BadInput (it cannot
// be loaded: exit 2) or PluginFailed (it misbehaved while being loaded: exit 4).
Subject probe(Subject s, const IsolationOptions& o) {
    const std::optional<uint64_t> limit = parse_memory_limit(o.memory_limit);
    // Before the probe the memory space is unknown: the probe uses only what was asked for explicitly.
    s.isolation = o.isolation == "exec" ? Isolation::Exec : Isolation::Fork;
    s.memory_limit = limit.value_or(0);
    const ChildRun run = run_isolated(s, request_for(s, "probe"), o.timeout);
    const std::string& origin = s.target.origin;
    std::optional<nlohmann::json> answer;
    bool stray = false;
    std::istringstream lines(run.result);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("L ", 0) == 0 && !answer) answer = nlohmann::json::parse(line.substr(2), nullptr, false);
        else if (line != "M") stray = true;
    }
    if (run.end == ChildRun::End::Exited && run.code == kExecFailed)
        throw std::runtime_error("could not execute kvcheck again for exec isolation (/proc/self/exe)");
    std::string problem;
    if (run.end != ChildRun::End::Exited || run.code != 0)
        problem = "the loading process " + ending_text(run, o.timeout);
    else if (stray || (answer && (answer->is_discarded() || !answer->is_object())))
        problem = "something other than kvcheck wrote to the loading process's result descriptor";
    else if (!answer) problem = "the implementation ended the loading process (exit status 0) before it had loaded";
    if (problem.empty() && answer->contains("error")) {
        std::string error = printable(answer->at("error").get<std::string>());
        if (!answer->value("misbehaved", false)) throw BadInput(error);
        if (error.rfind(origin + ": ", 0) == 0) error.erase(0, origin.size() + 2);
        problem = error;
    }
    kvc_caps caps{};
    if (problem.empty()) {
        try {
            if (!caps_from_hex(answer->at("caps").get<std::string>(), caps))
                problem = "malformed answer from the probe";
            s.target.name = printable(answer->at("name").get<std::string>());
            s.version = printable(answer->at("version").get<std::string>());
            s.abi_major = answer->at("abi_major").get<uint32_t>();
            s.abi_minor = answer->at("abi_minor").get<uint32_t>();
        } catch (const nlohmann::json::exception& e) {
            problem = std::string("malformed answer from the probe (") + e.what() + ")";
        }
    }
    if (!problem.empty()) {
        std::string text = origin + ": the implementation failed while being loaded (in its constructors, the entry "
                                    "function or get_caps): " + problem;
        if (!run.output.empty()) {
            std::string tail = run.output.size() > 400 ? run.output.substr(run.output.size() - 400) : run.output;
            text += "; it wrote: " + printable(tail);
        }
        throw PluginFailed(text);
    }
    s.target.caps = caps;
    const bool device = caps.memory_space == KVC_MEMORY_DEVICE;
    s.isolation = o.isolation == "fork" ? Isolation::Fork
                  : o.isolation == "exec" || device ? Isolation::Exec
                                                    : Isolation::Fork;
    // RLIMIT_AS counts address space, not memory: a device runtime reserves terabytes of it. No default limit there.
    s.memory_limit = limit ? *limit : device ? 0 : kDefaultMemoryLimit;
    s.memory_limit_asked = limit.has_value();
    return s;
}

Subject load_builtin(const Builtin& b, const IsolationOptions& o) {
    Subject s;
    s.target.origin = "builtin:" + b.name;
    s.builtin = b.name;
    s.label = b.name;
    s.target_args = "--builtin " + b.name;
    return probe(std::move(s), o);
}

// A built-in left out because it cannot run here, and why (the CUDA error).
struct Skipped {
    std::string name, reason;
};

// Exactly one of plugin / builtin; builtin "all" (when allowed) is every built-in that can run here, the others go to
// *skipped with their reason. Throws BadInput, PluginFailed, NotRunnable (a single built-in that cannot run here).
std::vector<Subject> load_subjects(const std::string& plugin, const std::string& builtin, bool allow_all,
                                   const IsolationOptions& o, std::vector<Skipped>* skipped = nullptr) {
    if (plugin.empty() == builtin.empty())
        throw BadInput("give exactly one of --plugin PATH or --builtin NAME (see kvcheck list for the built-ins)");
    std::vector<Subject> out;
    if (!plugin.empty()) {
        Subject s;
        // dlopen() searches the library path for a name without a slash; a file name given here means that file.
        s.plugin_file = plugin.find('/') == std::string::npos ? "./" + plugin : plugin;
        if (!std::ifstream(s.plugin_file).good()) throw BadInput(plugin + ": cannot open the file");
        s.target.origin = s.plugin_file;
        s.target_args = "--plugin " + shell_quote(plugin);
        s = probe(std::move(s), o);
        s.label = s.target.name;
        out.push_back(std::move(s));
        return out;
    }
    if (builtin == "all" && allow_all) {
        for (const Builtin& b : builtins()) {
            const std::string why = unavailable_reason(b);
            if (why.empty()) out.push_back(load_builtin(b, o));
            else if (skipped) skipped->push_back({b.name, why});
        }
        if (out.empty()) throw NotRunnable("no built-in implementation can run on this machine");
        return out;
    }
    const Builtin* b = find_builtin(builtin);
    if (!b) {
        std::string known;
        for (const Builtin& x : builtins()) known += " " + x.name;
        throw BadInput("unknown built-in \"" + builtin + "\"; this build has:" + known +
                       (allow_all ? " (or all)" : ""));
    }
    const std::string why = unavailable_reason(*b);
    if (!why.empty()) throw NotRunnable("built-in " + b->name + " cannot run on this machine: " + why);
    out.push_back(load_builtin(*b, o));
    return out;
}

std::string subject_header(const Subject& s) {
    std::ostringstream o;
    o << "implementation: " << s.target.name << " " << s.version << " (" << printable(s.target.origin) << "), ABI "
      << s.abi_major << "." << s.abi_minor << "\n";
    o << caps_to_text(s.target.caps, "  ");
    o << "  isolation: " << isolation_name(s.isolation) << ", memory limit per case: "
      << (s.memory_limit ? bytes_text(s.memory_limit) : std::string("none")) << "\n";
    return o.str();
}

nlohmann::json subject_json(const Subject& s) {
    return {{"name", s.target.name},
            {"version", s.version},
            {"origin", s.target.origin},
            {"label", s.label},
            {"abi", {{"major", s.abi_major}, {"minor", s.abi_minor}}},
            {"capabilities", caps_to_json(s.target.caps)},
            {"isolation", isolation_name(s.isolation)},
            {"memory_limit_bytes", s.memory_limit ? nlohmann::json(s.memory_limit) : nlohmann::json(nullptr)}};
}

// ---------------------------------------------------------------------------------------------------------------
// One case in a child process

struct CaseRun {
    prop::CaseResult result;
    std::string output; // what the implementation printed, if anything (printable, lines kept)
};

// Turns what came back from the child into a result. `fresh` describes the case itself (id, property, seed), for
// verdicts the child could not report; `the_case` makes the case as generated, needed only when the verdict is not
// conformant (the report and the replay file carry it), so passing cases do not pay for generating it twice.
prop::CaseResult interpret(const ChildRun& run, const prop::CaseResult& fresh,
                           const std::function<prop::Case()>& the_case, double timeout_s, uint64_t memory_limit,
                           bool memory_limit_asked) {
    std::optional<prop::CaseResult> provisional, final_result;
    std::string unreadable;
    bool allocation_refused = false;
    std::istringstream lines(run.result);
    for (std::string line; std::getline(lines, line);) {
        if (line == "M") {
            allocation_refused = true;
            continue;
        }
        if (line.size() < 2 || (line[0] != 'P' && line[0] != 'F') || line[1] != ' ') {
            unreadable = "unexpected line from the case process";
            continue;
        }
        try {
            prop::CaseResult r = prop::case_result_from_json(nlohmann::json::parse(line.substr(2)));
            (line[0] == 'F' ? final_result : provisional) = std::move(r);
        } catch (const std::exception& e) {
            unreadable = e.what();
        }
    }

    std::string ending; // how the child ended, in words, when it did not end normally
    if (run.end != ChildRun::End::Exited || run.code != 0) ending = "the case process " + ending_text(run, timeout_s);
    if (run.end == ChildRun::End::Exited && run.code != 0 && run.code != kBodyThrew && run.code != kExecFailed)
        ending = "the implementation ended the process (exit status " + std::to_string(run.code) +
                 ") before the case finished";

    prop::CaseResult r = fresh;
    if (final_result && run.end != ChildRun::End::Flooded) {
        r = *final_result;
        // The JSON carries the case only for FAIL (the shrunk one); any other verdict is about the case as generated.
        if (!conformant(r.verdict) && r.verdict != Verdict::Fail) r.counterexample = the_case();
    } else if (provisional && run.end != ChildRun::End::Flooded) {
        // it failed, then shrinking crashed or hung (or ended the process): keep the unshrunk failure
        r = *provisional;
        r.notes.push_back("not shrunk: while shrinking, " +
                          (ending.empty() ? std::string("the case process ended without a final result") : ending));
    } else {
        r.counterexample = the_case();
        if (run.end == ChildRun::End::Signaled) {
            r.verdict = Verdict::Crash;
            r.reason = ending;
        } else if (run.end == ChildRun::End::TimedOut) {
            r.verdict = Verdict::Timeout;
            r.reason = ending;
        } else if (run.end == ChildRun::End::Exited && run.code != kBodyThrew && run.code != kExecFailed &&
                   unreadable.empty()) {
            // exit() inside a case, whatever its status (0 too): the implementation ended the process
            r.verdict = Verdict::Crash;
            r.reason = "the implementation ended the process (exit status " + std::to_string(run.code) +
                       ") before the case finished";
        } else {
            r.verdict = Verdict::Error;
            r.reason = !ending.empty() ? ending
                                       : "the case process ended without a readable result" +
                                             (unreadable.empty() ? std::string() : " (" + unreadable + ")");
        }
    }
    // The memory limit: a refused allocation seen by the harness, or a refusal the implementation reported, is an
    // ERROR naming the limit, not the implementation's fault as such.
    if (memory_limit && !conformant(r.verdict)) {
        const bool oom = allocation_refused || r.reason.find("OUT_OF_MEMORY") != std::string::npos ||
                         r.reason.find("bad_alloc") != std::string::npos;
        if (oom) {
            r.reason = "the case exceeded its memory limit of " + bytes_text(memory_limit) +
                       " (address space; --memory-limit): " + r.reason;
            r.verdict = Verdict::Error;
        } else if (r.verdict == Verdict::Crash && memory_limit_asked) {
            r.notes.push_back("a memory limit of " + bytes_text(memory_limit) +
                              " was in force (--memory-limit); an allocation it refused may be the cause");
        }
    }
    r.reason = printable(r.reason, true);
    return r;
}

// `unshrunk_note` empty: a FAIL is shrunk; otherwise it is reported as generated, with that note (why not).
CaseRun run_case_isolated(const Subject& subj, const prop::Property& p, const prop::RunSettings& s, int index,
                          double timeout_s, const std::string& unshrunk_note) {
    nlohmann::json req = request_for(subj, "case");
    req["property"] = p.id;
    req["index"] = index;
    req["run_seed"] = s.seed;
    req["cases"] = s.cases;
    req["max_shrink_runs"] = s.max_shrink_runs;
    req["unshrunk_note"] = unshrunk_note;
    req["id"] = prop::case_id(p.id, index);
    req["seed"] = prop::case_seed(s.seed, p.id, index);
    const ChildRun run = run_isolated(subj, req, timeout_s);
    prop::CaseResult fresh;
    fresh.id = prop::case_id(p.id, index);
    fresh.property = p.id;
    fresh.seed = prop::case_seed(s.seed, p.id, index);
    const auto generate = [&] { return prop::generate_case(p, s, index, &subj.target.caps); };
    return {interpret(run, fresh, generate, timeout_s, subj.memory_limit, subj.memory_limit_asked),
            printable(run.output, true)};
}

CaseRun replay_isolated(const Subject& subj, const prop::Property& p, const prop::Case& c, const std::string& id,
                        uint64_t seed, double timeout_s) {
    nlohmann::json req = request_for(subj, "replay");
    req["property"] = p.id;
    req["case"] = prop::to_json(c);
    req["id"] = id;
    req["seed"] = seed;
    const ChildRun run = run_isolated(subj, req, timeout_s);
    prop::CaseResult fresh;
    fresh.id = id;
    fresh.property = p.id;
    fresh.seed = seed;
    return {interpret(run, fresh, [&] { return c; }, timeout_s, subj.memory_limit, subj.memory_limit_asked),
            printable(run.output, true)};
}

std::string indent(const std::string& text, const std::string& pad) {
    std::string out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out += pad + line + "\n";
    return out;
}

// ---------------------------------------------------------------------------------------------------------------
// validate

struct ValidateOptions {
    std::string plugin, builtin;
    std::string profile = "full";
    int cases = 100;
    std::string seed_text = "20261129";
    uint64_t seed = 20261129; // parsed from seed_text
    std::string filter;
    std::string shard;
    double timeout = 30;
    std::string shrink_first_text = "3";
    int shrink_first = 3; // parsed from shrink_first_text: FAILs shrunk per property and implementation
    std::string report, junit;
    std::string counterexamples = "kvcheck-counterexamples";
    std::string isolation = "auto", memory_limit = "auto";
    IsolationOptions iso() const { return {isolation, memory_limit, timeout}; }
};

constexpr int kShrinkAll = 1000000000;

// "all", or a count from 0 (counts of kShrinkAll and more mean all).
int parse_shrink_first(const std::string& text) {
    if (text == "all") return kShrinkAll;
    static const std::regex digits("[0-9]{1,18}");
    if (!std::regex_match(text, digits))
        throw BadInput("--shrink-first " + text + ": expected a number of failures (0 = none) or all");
    return static_cast<int>(std::min<long long>(std::stoll(text), kShrinkAll));
}

struct Shard {
    uint64_t index = 0, count = 1;
};

Shard parse_shard(const std::string& text) {
    static const std::regex form("([0-9]{1,9})/([0-9]{1,9})");
    std::smatch m;
    if (!std::regex_match(text, m, form))
        throw BadInput("--shard " + text + ": expected I/N with 0 <= I < N, e.g. 0/4");
    Shard s{std::stoull(m[1].str()), std::stoull(m[2].str())};
    if (s.count == 0 || s.index >= s.count)
        throw BadInput("--shard " + text + ": expected I/N with 0 <= I < N, e.g. 0/4");
    return s;
}

struct CaseRef {
    const prop::Property* property;
    int index;
};

// The global ordered list: properties in suite order (profile applied), indices 0..cases-1, filtered; then the
// shard's share of it (position k belongs to shard k % N).
std::vector<CaseRef> select_cases(const ValidateOptions& o, const Shard& shard, std::size_t& before_shard) {
    std::optional<std::regex> filter;
    if (!o.filter.empty()) {
        try {
            filter.emplace(o.filter, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
            throw BadInput("--filter " + o.filter + ": not a valid regular expression (" + e.what() + ")");
        }
    }
    std::vector<CaseRef> all;
    for (const prop::Property& p : prop::properties()) {
        if (o.profile == "core" && !p.core) continue;
        const bool whole_property = filter && std::regex_search(p.id, *filter);
        for (int i = 0; i < o.cases; ++i)
            if (!filter || whole_property || std::regex_search(prop::case_id(p.id, i), *filter))
                all.push_back({&p, i});
    }
    before_shard = all.size();
    std::vector<CaseRef> mine;
    for (std::size_t k = 0; k < all.size(); ++k)
        if (k % shard.count == shard.index) mine.push_back(all[k]);
    return mine;
}

// Progress on stderr: a bar redrawn in place on a terminal, one line per finished property otherwise.
class Progress {
public:
    explicit Progress(std::size_t total) : total_(total), tty_(isatty(STDERR_FILENO) == 1) {}

    void step(const std::string& label, const std::string& case_id) {
        ++done_;
        if (!tty_) return;
        const auto now = std::chrono::steady_clock::now();
        if (done_ != total_ && now - last_ < std::chrono::milliseconds(50)) return;
        last_ = now;
        constexpr std::size_t width = 30;
        const std::size_t filled = total_ ? done_ * width / total_ : width;
        std::cerr << "\r\033[K[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << done_
                  << "/" << total_ << " " << label << " " << case_id << std::flush;
        shown_ = true;
    }
    // A property of one implementation is done: a plain line for logs.
    void property_done(const std::string& label, const std::string& property, const int counts[kVerdictCount]) {
        if (tty_) return;
        std::cerr << "kvcheck: [" << label << "] " << property << " done:";
        for (int i = 0; i < kVerdictCount; ++i)
            if (counts[i]) std::cerr << " " << counts[i] << " " << prop::verdict_name(kVerdicts[i]);
        std::cerr << " (" << done_ << "/" << total_ << ")\n";
    }
    // Clears the bar before something else is printed on the terminal.
    void clear() {
        if (tty_ && shown_) std::cerr << "\r\033[K" << std::flush;
        shown_ = false;
    }

private:
    std::size_t total_, done_ = 0;
    bool tty_, shown_ = false;
    std::chrono::steady_clock::time_point last_{};
};

// ---------------------------------------------------------------------------------------------------------------
// The verdict table

struct Row {
    std::string label, property;
    int counts[kVerdictCount] = {};
};

int sum(const int counts[kVerdictCount]) {
    int n = 0;
    for (int i = 0; i < kVerdictCount; ++i) n += counts[i];
    return n;
}

int nonconformant(const int counts[kVerdictCount]) {
    int n = 0;
    for (int i = 0; i < kVerdictCount; ++i)
        if (!conformant(kVerdicts[i])) n += counts[i];
    return n;
}

// A core property whose every case was NOT_SUPPORTED tested nothing: that is no conformance claim.
bool core_never_ran(const Row& r) {
    const int total = sum(r.counts);
    return prop::find_property(r.property)->core && total > 0 &&
           r.counts[verdict_index(Verdict::NotSupported)] == total;
}

// judge_core: false for a shard, which may legitimately hold no runnable case of a property.
std::string row_result(const Row& r, bool judge_core) {
    const int* counts = r.counts;
    const int total = sum(counts);
    if (nonconformant(counts)) return "NOT CONFORMANT";
    if (judge_core && core_never_ran(r)) return "NOT CONFORMANT (core property, no case ran)";
    if (total == 0) return "-";
    if (counts[verdict_index(Verdict::NotSupported)] == total) return "not supported";
    if (counts[verdict_index(Verdict::QualityWarning)]) return "ok (quality warnings)";
    return "ok";
}

std::string counts_text(const int counts[kVerdictCount]) {
    std::ostringstream s;
    s << sum(counts) << " cases:";
    bool any = false;
    for (int i = 0; i < kVerdictCount; ++i)
        if (counts[i]) {
            s << (any ? ", " : " ") << counts[i] << " " << prop::verdict_name(kVerdicts[i]);
            any = true;
        }
    return s.str();
}

std::string verdict_table(const std::vector<Row>& rows, bool with_label, bool judge_core) {
    std::vector<std::vector<std::string>> cells;
    std::vector<std::string> head;
    if (with_label) head.push_back("implementation");
    head.push_back("property");
    for (Verdict v : kVerdicts) head.push_back(prop::verdict_name(v));
    head.push_back("result");
    cells.push_back(head);
    for (const Row& r : rows) {
        std::vector<std::string> line;
        if (with_label) line.push_back(r.label);
        line.push_back(r.property);
        for (int i = 0; i < kVerdictCount; ++i) line.push_back(std::to_string(r.counts[i]));
        line.push_back(row_result(r, judge_core));
        cells.push_back(line);
    }
    // Count columns share one fixed width, that of the longest verdict name (QUALITY_WARNING, 15 characters), so
    // tables of different runs line up whatever the counts.
    const std::size_t first_count = with_label ? 2 : 1, last_count = first_count + kVerdictCount;
    std::size_t count_width = 0;
    for (Verdict v : kVerdicts) count_width = std::max(count_width, std::string(prop::verdict_name(v)).size());
    std::vector<std::size_t> width(head.size(), 0);
    for (std::size_t c = first_count; c < last_count; ++c) width[c] = count_width;
    for (const auto& line : cells)
        for (std::size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
    std::ostringstream s;
    for (const auto& line : cells) {
        for (std::size_t c = 0; c < line.size(); ++c) {
            const bool number = c >= first_count && c < last_count;
            if (c) s << "  ";
            if (number) s << std::setw(static_cast<int>(width[c])) << std::right << line[c];
            else if (c + 1 == line.size()) s << line[c];
            else s << std::setw(static_cast<int>(width[c])) << std::left << line[c];
        }
        s << "\n";
    }
    return s.str();
}

// ---------------------------------------------------------------------------------------------------------------
// Printing one case that did not pass

std::string case_details(const prop::CaseResult& r, const std::string& label, const std::string& output,
                         const std::string& replay_command, uint64_t run_seed, bool full) {
    std::ostringstream s;
    s << prop::verdict_name(r.verdict) << " " << r.id << " (" << label << ")";
    if (!full) {
        s << ": " << r.reason;
        if (!replay_command.empty()) s << "\n  replay: " << replay_command;
        s << "\n";
        return s.str();
    }
    s << "\n  property: " << r.property;
    if (!r.failed_property.empty() && r.failed_property != r.property) s << " (violated: " << r.failed_property << ")";
    s << "\n  reason: " << r.reason << "\n";
    if (r.mismatch) s << "  first mismatch: " << prop::mismatch_text(*r.mismatch) << "\n";
    const bool unshrunk = std::any_of(r.notes.begin(), r.notes.end(),
                                      [](const std::string& n) { return n.rfind("not shrunk", 0) == 0; });
    if (r.verdict == Verdict::Fail && unshrunk)
        s << "  counterexample (not shrunk; case seed " << r.seed << ", run seed " << run_seed << "):\n";
    else if (r.verdict == Verdict::Fail)
        s << "  counterexample (shrunk in " << r.shrink_steps << " steps; case seed " << r.seed << ", run seed "
          << run_seed << "):\n";
    else
        s << "  case (case seed " << r.seed << ", run seed " << run_seed << "):\n";
    s << indent(prop::describe(r.counterexample), "    ");
    for (const std::string& n : r.notes) s << "  note: " << n << "\n";
    if (!output.empty()) s << "  the implementation wrote:\n" << indent(output, "    | ");
    if (!replay_command.empty()) s << "  replay: " << replay_command << "\n";
    return s.str();
}

// Writes the replay document of a case that did not pass; returns its path, or "" (with a warning) on failure.
std::string write_counterexample(const ValidateOptions& o, const Subject& subj, bool several,
                                 const prop::CaseResult& r, int index, Progress& progress) {
    namespace fs = std::filesystem;
    fs::path dir = o.counterexamples;
    if (several) dir /= subj.label;
    std::string name = r.property;
    for (char& c : name)
        if (c == '/' || c == '\\') c = '_';
    const fs::path file = dir / (name + "-" + std::to_string(index) + ".json");
    nlohmann::json doc = prop::replay_document(r);
    doc["verdict"] = prop::verdict_name(r.verdict);
    doc["run_seed"] = o.seed;
    doc["kvcheck_version"] = KVCHECK_VERSION;
    doc["implementation"] = {{"name", subj.target.name}, {"origin", subj.target.origin}};
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::string error;
    if (ec) error = "cannot create " + dir.string() + ": " + ec.message();
    else if (write_file_atomically(file.string(), dump_json(doc, 2) + "\n", error)) return file.string();
    progress.clear();
    std::cerr << "kvcheck: warning: counterexample of " << r.id << " not written: " << error << "\n";
    return "";
}

uint64_t parse_seed(const std::string& text) {
    static const std::regex digits("[0-9]{1,20}");
    try {
        if (std::regex_match(text, digits)) return std::stoull(text);
    } catch (const std::out_of_range&) {
    }
    throw BadInput("--seed " + text + ": expected an integer from 0 to 18446744073709551615");
}

// The isolation options as a rerun or replay command line needs them (only those not left at auto).
std::string isolation_args(const IsolationOptions& o) {
    std::string a;
    if (o.isolation != "auto") a += " --isolation " + o.isolation;
    if (o.memory_limit != "auto") a += " --memory-limit " + shell_quote(o.memory_limit);
    return a;
}

int validate(ValidateOptions& o) {
    check_timeout(o.timeout);
    o.seed = parse_seed(o.seed_text);
    o.shrink_first = parse_shrink_first(o.shrink_first_text);
    const Shard shard = o.shard.empty() ? Shard{} : parse_shard(o.shard);
    std::size_t unsharded = 0;
    const std::vector<CaseRef> cases = select_cases(o, shard, unsharded);
    if (unsharded == 0) {
        std::string ids;
        for (const prop::Property& p : prop::properties()) ids += " " + p.id;
        throw BadInput("--filter " + o.filter + " selects no case of profile " + o.profile + " (properties:" + ids +
                       "; case ids are PROPERTY/INDEX)");
    }
    std::string error;
    for (const std::string* path : {&o.report, &o.junit})
        if (!path->empty() && !can_create_file(*path, error)) throw BadInput("cannot write the report " + error);
    if (!o.report.empty() && !o.junit.empty() && same_file(o.report, o.junit))
        throw BadInput("--report and --junit name the same file");
    if (!can_create_directory(o.counterexamples, error)) throw BadInput("cannot write counterexamples: " + error);
    std::vector<Skipped> skipped;
    const std::vector<Subject> subjects = load_subjects(o.plugin, o.builtin, true, o.iso(), &skipped);
    const bool several = subjects.size() > 1;

    prop::RunSettings settings;
    settings.seed = o.seed;
    settings.cases = o.cases;

    std::cout << "kvcheck " KVCHECK_VERSION " validate: seed " << o.seed << ", profile " << o.profile << ", "
              << o.cases << " cases per property, timeout " << o.timeout << " s per case\n";
    std::cout << "selected " << cases.size() << " of " << unsharded << " cases";
    if (!o.filter.empty()) std::cout << " (filter " << o.filter << ")";
    if (!o.shard.empty()) std::cout << " in shard " << shard.index << "/" << shard.count;
    std::cout << "\n";
    std::cout << "rerun: kvcheck validate " << (o.plugin.empty() ? "--builtin " + o.builtin : subjects[0].target_args)
              << " --seed " << o.seed << " --profile " << o.profile << " --cases " << o.cases;
    if (!o.filter.empty()) std::cout << " --filter " << shell_quote(o.filter);
    if (!o.shard.empty()) std::cout << " --shard " << o.shard;
    if (o.shrink_first_text != "3") std::cout << " --shrink-first " << shell_quote(o.shrink_first_text);
    std::cout << isolation_args(o.iso()) << "\n";

    nlohmann::json report = {
        {"kvcheck_report", kReportSchema},
        {"tool", {{"name", "kvcheck"}, {"version", KVCHECK_VERSION}}},
        {"suite_version", KVCHECK_VERSION},
        {"abi", {{"major", KVC_ABI_VERSION_MAJOR}, {"minor", KVC_ABI_VERSION_MINOR}}},
        {"run",
         {{"seed", o.seed},
          {"profile", o.profile},
          {"cases_per_property", o.cases},
          {"filter", o.filter.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.filter)},
          {"shard", {{"index", shard.index}, {"count", shard.count}}},
          {"selected_cases", cases.size()},
          {"timeout_s", o.timeout},
          {"isolation", o.isolation},
          {"memory_limit", o.memory_limit},
          {"shrink_first", o.shrink_first >= kShrinkAll ? nlohmann::json("all") : nlohmann::json(o.shrink_first)}}},
        {"implementations", nlohmann::json::array()},
        {"skipped_implementations", nlohmann::json::array()}};
    // Never judged, so neither PASS nor FAIL: said on the screen and in the report, and nowhere counted.
    for (const Skipped& sk : skipped) {
        std::cout << "skipped built-in " << sk.name << ": " << sk.reason << " (not run, not counted)\n";
        report["skipped_implementations"].push_back({{"name", sk.name}, {"reason", sk.reason}});
    }

    Progress progress(cases.size() * subjects.size());
    std::vector<Row> rows;
    int totals[kVerdictCount] = {};
    int unshrunk_failures = 0;
    for (const Subject& subj : subjects) {
        progress.clear();
        std::cout << "\n" << subject_header(subj) << std::flush;
        nlohmann::json case_list = nlohmann::json::array();
        std::map<std::string, int> printed_in_full; // per property
        std::map<std::string, int> failures;        // per property: the first o.shrink_first are shrunk
        int counts[kVerdictCount] = {};
        const std::size_t first_row = rows.size();
        for (std::size_t k = 0; k < cases.size(); ++k) {
            const CaseRef& ref = cases[k];
            if (rows.size() == first_row || rows.back().property != ref.property->id)
                rows.push_back({subj.label, ref.property->id, {}});
            Row& row = rows.back();
            // The parent decides before the child starts: cases run one at a time, so it knows the FAILs so far.
            const bool shrink = failures[ref.property->id] < o.shrink_first;
            const std::string unshrunk_note =
                shrink ? std::string()
                       : "not shrunk: only the first " + std::to_string(o.shrink_first) + " failures of " +
                             ref.property->id + " are shrunk (--shrink-first)";
            CaseRun run = run_case_isolated(subj, *ref.property, settings, ref.index, o.timeout, unshrunk_note);
            const prop::CaseResult& r = run.result;
            if (r.verdict == Verdict::Fail) ++failures[ref.property->id];
            if (r.verdict == Verdict::Fail && !shrink) ++unshrunk_failures;
            const int vi = verdict_index(r.verdict);
            ++row.counts[vi];
            ++counts[vi];
            ++totals[vi];
            nlohmann::json cj = prop::to_json(r);
            if (!run.output.empty()) cj["implementation_output"] = run.output;
            if (!conformant(r.verdict)) {
                if (!cj.contains("counterexample")) {
                    cj["counterexample"] = prop::to_json(r.counterexample);
                    cj["counterexample_text"] = prop::describe(r.counterexample);
                }
                const std::string file = write_counterexample(o, subj, several, r, ref.index, progress);
                std::string command;
                if (!file.empty()) {
                    command = "kvcheck replay " + shell_quote(file) + " " + subj.target_args + isolation_args(o.iso());
                    cj["replay_file"] = file;
                    cj["replay_command"] = command;
                }
                const bool full = printed_in_full[r.property]++ < kFullReportsPerProperty;
                progress.clear();
                std::cout << "\n" << case_details(r, subj.label, run.output, command, o.seed, full) << std::flush;
            }
            case_list.push_back(std::move(cj));
            progress.step(subj.label, r.id);
            if (k + 1 == cases.size() || cases[k + 1].property != ref.property)
                progress.property_done(subj.label, ref.property->id, row.counts);
        }
        nlohmann::json impl = subject_json(subj);
        nlohmann::json per_property = nlohmann::json::array();
        for (std::size_t i = first_row; i < rows.size(); ++i) {
            nlohmann::json c;
            for (int v = 0; v < kVerdictCount; ++v) c[prop::verdict_name(kVerdicts[v])] = rows[i].counts[v];
            per_property.push_back({{"id", rows[i].property},
                                    {"core", prop::find_property(rows[i].property)->core},
                                    {"counts", c},
                                    {"result", row_result(rows[i], o.shard.empty())}});
        }
        nlohmann::json c;
        for (int v = 0; v < kVerdictCount; ++v) c[prop::verdict_name(kVerdicts[v])] = counts[v];
        impl["counts"] = c;
        bool untested_core = false;
        for (std::size_t i = first_row; i < rows.size(); ++i)
            untested_core = untested_core || (o.shard.empty() && core_never_ran(rows[i]));
        impl["conformant"] = nonconformant(counts) == 0 && !untested_core;
        impl["properties"] = per_property;
        impl["cases"] = std::move(case_list);
        report["implementations"].push_back(std::move(impl));
    }
    progress.clear();

    bool ok = nonconformant(totals) == 0;
    for (const auto& impl : report["implementations"]) ok = ok && impl["conformant"].get<bool>();
    const int code = ok ? kExitOk : kExitNotConformant;
    nlohmann::json c;
    for (int v = 0; v < kVerdictCount; ++v) c[prop::verdict_name(kVerdicts[v])] = totals[v];
    report["counts"] = c;
    report["conformant"] = ok;
    report["exit_code"] = code;

    std::cout << "\nverdict table (seed " << o.seed << ", profile " << o.profile << ", " << o.cases
              << " cases per property" << (o.shard.empty() ? "" : ", shard " + o.shard) << ")\n";
    std::cout << verdict_table(rows, several, o.shard.empty());
    if (unshrunk_failures)
        std::cout << unshrunk_failures << " failures were reported unshrunk (only the first " << o.shrink_first
                  << " of each property are shrunk; --shrink-first N or all changes that)\n";
    if (several)
        for (const auto& impl : report["implementations"])
            std::cout << impl["label"].get<std::string>() << ": "
                      << (impl["conformant"].get<bool>() ? "CONFORMANT" : "NOT CONFORMANT") << "\n";
    std::cout << "overall: " << (ok ? "CONFORMANT" : "NOT CONFORMANT") << " (" << counts_text(totals) << "; seed "
              << o.seed << ")\n";

    // both reports or neither: a half-written pair is as misleading as a half-written file
    std::vector<std::pair<std::string, std::string>> files;
    if (!o.report.empty()) files.emplace_back(o.report, dump_json(report, 2) + "\n");
    if (!o.junit.empty()) files.emplace_back(o.junit, junit_from_report(report));
    if (!files.empty() && !write_files_atomically(files, error)) {
        std::cerr << "kvcheck: " << error << "\n";
        return kExitInternal;
    }
    for (const auto& f : files) std::cout << "wrote " << f.first << "\n";
    return code;
}

// ---------------------------------------------------------------------------------------------------------------
// replay

struct ReplayOptions {
    std::string file, plugin, builtin;
    double timeout = 30;
    std::string isolation = "auto", memory_limit = "auto";
    IsolationOptions iso() const { return {isolation, memory_limit, timeout}; }
};

struct ReplayDocument {
    const prop::Property* property = nullptr;
    prop::Case c;
    std::string id, recorded_verdict, recorded_reason;
    std::optional<prop::Mismatch> recorded_mismatch;
    uint64_t seed = 0;
};

ReplayDocument read_replay(const std::string& path) {
    nlohmann::json j; // bounded, regular files only, strict (input_file.hpp): /dev/zero, 1e400, duplicate keys
    try {
        j = read_json_file(path);
    } catch (const InputError& e) {
        throw BadInput(e.what());
    }
    if (!j.is_object() || !j.contains("kvcheck_replay"))
        throw BadInput(path + ": not a kvcheck replay document (no \"kvcheck_replay\" field)");
    if (j["kvcheck_replay"] != 1)
        throw BadInput(path + ": replay document version " + j["kvcheck_replay"].dump() + ", this kvcheck reads 1");
    ReplayDocument d;
    if (!j.contains("property") || !j["property"].is_string())
        throw BadInput(path + ": missing string field \"property\"");
    const std::string id = j["property"].get<std::string>();
    d.property = prop::find_property(id);
    if (!d.property) throw BadInput(path + ": unknown property \"" + id + "\" (kvcheck list shows the properties)");
    if (!j.contains("case")) throw BadInput(path + ": missing object \"case\"");
    try {
        d.c = prop::case_from_json(j["case"]);
        d.id = j.value("id", id + "/?");
        d.seed = j.value("seed", uint64_t{0});
        d.recorded_verdict = j.value("verdict", std::string("FAIL"));
        d.recorded_reason = j.value("expected_failure", std::string());
        if (j.contains("expected_mismatch")) d.recorded_mismatch = prop::mismatch_from_json(j["expected_mismatch"]);
    } catch (const std::invalid_argument& e) {
        throw BadInput(path + ": malformed " + e.what());
    } catch (const nlohmann::json::exception& e) {
        throw BadInput(path + ": malformed field (" + std::string(e.what()) + ")");
    }
    return d;
}

int replay(const ReplayOptions& o) {
    check_timeout(o.timeout);
    const ReplayDocument d = read_replay(o.file);
    const std::vector<Subject> subjects = load_subjects(o.plugin, o.builtin, false, o.iso());
    const Subject& subj = subjects[0];
    std::cout << "kvcheck " KVCHECK_VERSION " replay " << o.file << "\n" << subject_header(subj);
    std::cout << "case " << d.id << " of property " << d.property->id << " (case seed " << d.seed << ")\n";
    if (!d.recorded_reason.empty()) std::cout << "recorded: " << d.recorded_verdict << ": " << d.recorded_reason << "\n";
    if (d.recorded_mismatch)
        std::cout << "recorded first mismatch: " << prop::mismatch_text(*d.recorded_mismatch) << "\n";
    std::cout << indent(prop::describe(d.c), "  ");
    const CaseRun run = replay_isolated(subj, *d.property, d.c, d.id, d.seed, o.timeout);
    const prop::CaseResult& r = run.result;
    std::cout << "verdict: " << prop::verdict_name(r.verdict) << "\n";
    if (!r.reason.empty()) std::cout << "reason: " << r.reason << "\n";
    if (r.mismatch) std::cout << "first mismatch: " << prop::mismatch_text(*r.mismatch) << "\n";
    for (const std::string& n : r.notes) std::cout << "note: " << n << "\n";
    if (!run.output.empty()) std::cout << "the implementation wrote:\n" << indent(run.output, "  | ");
    return conformant(r.verdict) ? kExitOk : kExitNotConformant;
}

// Runs a subcommand, turning bad input into its message and exit status 2. Anything else propagates to main()
// (exit 3) before any report file is written.
int guarded(const char* name, const std::function<int()>& body) {
    try {
        return body();
    } catch (const BadInput& e) {
        std::cout.flush();
        std::cerr << "kvcheck " << name << ": " << e.what() << "\n";
        return kExitBadInput;
    } catch (const PluginFailed& e) {
        std::cout.flush();
        std::cerr << "kvcheck " << name << ": " << e.what() << "\n";
        return kExitPluginFailed;
    } catch (const NotRunnable& e) {
        std::cout.flush();
        std::cerr << "kvcheck " << name << ": " << e.what() << " (skipped: nothing was judged)\n";
        return kExitNotRunnable;
    }
}

void add_isolation_options(CLI::App* cmd, std::string& isolation, std::string& memory_limit) {
    cmd->add_option("--isolation", isolation,
                    "how each case's process starts: fork, exec (kvcheck executes itself again; needed by device "
                    "contexts), or auto (exec for memory_space DEVICE, fork otherwise)")
        ->check(CLI::IsMember({"auto", "fork", "exec"}))
        ->capture_default_str();
    cmd->add_option("--memory-limit", memory_limit,
                    "address space per case process (RLIMIT_AS), e.g. 4G or 512M; none; auto: 8G, none for "
                    "memory_space DEVICE")
        ->capture_default_str();
}

} // namespace

// The re-executed kvcheck of exec isolation: the request on kRequestFd, the answer on kResultFd, as in a fork()ed
// child. Not a subcommand: main() calls it before parsing any option.
void exec_child_main() {
    std::string text;
    char chunk[65536];
    for (;;) {
        const ssize_t n = ::read(kRequestFd, chunk, sizeof chunk);
        if (n > 0) text.append(chunk, static_cast<std::size_t>(n));
        else if (n == 0) break;
        else if (errno != EINTR) break;
    }
    ::close(kRequestFd);
    const nlohmann::json req = nlohmann::json::parse(text, nullptr, false);
    if (req.is_discarded() || !req.is_object()) {
        std::cerr << "kvcheck: " << kExecChildCommand << " is kvcheck's own: it runs what kvcheck validate sends it\n";
        _exit(kExitBadInput);
    }
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    int status = 0;
    try {
        run_request(req, kResultFd);
    } catch (...) {
        status = kBodyThrew;
    }
    _exit(status); // as a fork()ed child ends: no atexit handlers, no destructors of the implementation's statics
}

void add_validate_commands(CLI::App& app, int& exit_code) {
    static ValidateOptions v; // CLI11 keeps references: the options must outlive parse()
    auto* validate_cmd = app.add_subcommand(
        "validate", "Run the conformance properties against an implementation, each case in its own process. Exit 0 "
                    "conformant, 1 not conformant (FAIL/ERROR/CRASH/TIMEOUT), 2 bad input, 3 harness error");
    validate_cmd->add_option("--plugin", v.plugin, "a plugin shared library (exports " KVC_ENTRY_SYMBOL ")");
    validate_cmd->add_option("--builtin", v.builtin, "a built-in implementation (kvcheck list), or 'all'");
    validate_cmd->add_option("--profile", v.profile, "core (the mandatory properties) or full")
        ->check(CLI::IsMember({"core", "full"}))
        ->capture_default_str();
    validate_cmd->add_option("--cases", v.cases, "cases per property")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    validate_cmd->add_option("--seed", v.seed_text, "run seed: the same seed draws the same cases")
        ->capture_default_str();
    validate_cmd->add_option("--filter", v.filter,
                             "regular expression searched in the property id and the case id PROPERTY/INDEX");
    validate_cmd->add_option("--shard", v.shard, "I/N: run only position k of the case list with k % N == I");
    validate_cmd->add_option("--timeout", v.timeout, "seconds per case (shrinking included) before TIMEOUT")
        ->check(CLI::Range(0.001, 1e6))
        ->capture_default_str();
    validate_cmd->add_option("--shrink-first", v.shrink_first_text,
                             "shrink only the first N failures of each property (0: none, all: every one); later "
                             "failures are reported as generated, with a note")
        ->capture_default_str();
    validate_cmd->add_option("--report", v.report, "write the JSON report to this file");
    validate_cmd->add_option("--junit", v.junit, "write a JUnit XML report to this file");
    validate_cmd->add_option("--counterexamples", v.counterexamples,
                             "directory for the replay files of cases that did not pass")
        ->capture_default_str();
    add_isolation_options(validate_cmd, v.isolation, v.memory_limit);
    validate_cmd->callback([&exit_code] { exit_code = guarded("validate", [] { return validate(v); }); });

    static ReplayOptions r;
    auto* replay_cmd = app.add_subcommand(
        "replay", "Run one recorded case (a file written by validate) again, in its own process. Exit 0 it passes, "
                  "1 it does not, 2 bad input");
    replay_cmd->add_option("file", r.file, "replay file, e.g. kvcheck-counterexamples/EQUIV-3.json")->required();
    replay_cmd->add_option("--plugin", r.plugin, "a plugin shared library (exports " KVC_ENTRY_SYMBOL ")");
    replay_cmd->add_option("--builtin", r.builtin, "a built-in implementation (kvcheck list)");
    replay_cmd->add_option("--timeout", r.timeout, "seconds before TIMEOUT")
        ->check(CLI::Range(0.001, 1e6))
        ->capture_default_str();
    add_isolation_options(replay_cmd, r.isolation, r.memory_limit);
    replay_cmd->callback([&exit_code] { exit_code = guarded("replay", [] { return replay(r); }); });
}

} // namespace kvc::cli
