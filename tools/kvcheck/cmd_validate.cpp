// kvcheck validate | replay: the conformance properties against one implementation (or every built-in), each case in
// a child process of its own, with a verdict table, a JSON and a JUnit report, and replay files for what failed.
// The properties, the case generator, shrinking and the verdicts live in kvcheck_properties; this file chooses the
// cases, isolates them (isolate.hpp), prints and reports (report.hpp). docs/cli.md describes the behaviour.
#include "commands.hpp"

#include "isolate.hpp"
#include "report.hpp"
#include "vocabulary.hpp"

#include "kvcheck/builtins.hpp"
#include "kvcheck/properties/runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
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
// Implementations under test

struct Subject {
    prop::Target target;
    std::string label;       // short name for tables: the built-in's name, or the plugin's own name
    std::string target_args; // how to name it on a command line: "--builtin NAME" or "--plugin PATH"
};

Subject load_builtin(const Builtin& b) {
    Subject s;
    try {
        s.target = prop::target_from_entry(b.entry, "builtin:" + b.name);
    } catch (const prop::LoadError& e) {
        throw BadInput(std::string("built-in ") + b.name + " cannot be used: " + e.what());
    }
    s.label = b.name;
    s.target_args = "--builtin " + b.name;
    return s;
}

// Exactly one of plugin / builtin; builtin "all" (when allowed) is every built-in. Throws BadInput.
std::vector<Subject> load_subjects(const std::string& plugin, const std::string& builtin, bool allow_all) {
    if (plugin.empty() == builtin.empty())
        throw BadInput("give exactly one of --plugin PATH or --builtin NAME (see kvcheck list for the built-ins)");
    std::vector<Subject> out;
    if (!plugin.empty()) {
        Subject s;
        // dlopen() searches the library path for a name without a slash; a file name given here means that file.
        const std::string file = plugin.find('/') == std::string::npos ? "./" + plugin : plugin;
        try {
            s.target = prop::load_plugin(file);
        } catch (const prop::LoadError& e) {
            throw BadInput(e.what());
        }
        s.label = s.target.name;
        s.target_args = "--plugin " + shell_quote(plugin);
        out.push_back(std::move(s));
        return out;
    }
    if (builtin == "all" && allow_all) {
        for (const Builtin& b : builtins()) out.push_back(load_builtin(b));
        if (out.empty()) throw BadInput("this build has no built-in implementations");
        return out;
    }
    const Builtin* b = find_builtin(builtin);
    if (!b) {
        std::string known;
        for (const Builtin& x : builtins()) known += " " + x.name;
        throw BadInput("unknown built-in \"" + builtin + "\"; this build has:" + known +
                       (allow_all ? " (or all)" : ""));
    }
    out.push_back(load_builtin(*b));
    return out;
}

std::string subject_header(const Subject& s) {
    std::ostringstream o;
    const kvc_plugin_api* api = s.target.api;
    o << "implementation: " << s.target.name << " " << (api->version ? api->version : "(no version)") << " ("
      << s.target.origin << "), ABI " << api->abi_major << "." << api->abi_minor << "\n";
    o << caps_to_text(s.target.caps, "  ");
    return o.str();
}

nlohmann::json subject_json(const Subject& s) {
    const kvc_plugin_api* api = s.target.api;
    return {{"name", s.target.name},
            {"version", api->version ? api->version : ""},
            {"origin", s.target.origin},
            {"label", s.label},
            {"abi", {{"major", api->abi_major}, {"minor", api->abi_minor}}},
            {"capabilities", caps_to_json(s.target.caps)}};
}

// ---------------------------------------------------------------------------------------------------------------
// One case in a child process

struct CaseRun {
    prop::CaseResult result;
    std::string output; // what the implementation printed, if anything
};

// The child's protocol: lines "P <json>" (a provisional FAIL, before shrinking) and "F <json>" (the final result).
// prop::to_json spells NaN and infinities as strings, so a NaN output travels like any other number.
void send(int fd, char tag, const prop::CaseResult& r) {
    write_all(fd, std::string(1, tag) + " " + dump_json(prop::to_json(r)) + "\n");
}

// Turns what came back from the child into a result. `fresh` describes the case itself (id, property, seed), for
// verdicts the child could not report; `the_case` makes the case as generated, needed only when the verdict is not
// conformant (the report and the replay file carry it), so passing cases do not pay for generating it twice.
prop::CaseResult interpret(const ChildRun& run, const prop::CaseResult& fresh,
                           const std::function<prop::Case()>& the_case, double timeout_s) {
    std::optional<prop::CaseResult> provisional, final_result;
    std::string unreadable;
    std::istringstream lines(run.result);
    for (std::string line; std::getline(lines, line);) {
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
    if (run.end == ChildRun::End::Signaled)
        ending = "the case process died of " + signal_description(run.code);
    else if (run.end == ChildRun::End::TimedOut) {
        std::ostringstream m;
        m << "no result within the " << timeout_s << " s timeout; the case process was killed";
        ending = m.str();
    } else if (run.code == kBodyThrew)
        ending = "an exception that is not a std::exception escaped into the harness";
    else if (run.code != 0)
        ending = "the implementation ended the process (exit status " + std::to_string(run.code) +
                 ") before the case finished";

    if (final_result) {
        // The JSON carries the case only for FAIL (the shrunk one); any other verdict is about the case as generated.
        if (!conformant(final_result->verdict) && final_result->verdict != Verdict::Fail)
            final_result->counterexample = the_case();
        return *final_result;
    }
    if (provisional && !ending.empty()) { // it failed, then shrinking crashed or hung: keep the unshrunk failure
        provisional->notes.push_back("not shrunk: while shrinking, " + ending);
        return *provisional;
    }
    prop::CaseResult r = fresh;
    r.counterexample = the_case();
    if (run.end == ChildRun::End::Signaled) {
        r.verdict = Verdict::Crash;
        r.reason = ending;
    } else if (run.end == ChildRun::End::TimedOut) {
        r.verdict = Verdict::Timeout;
        r.reason = ending;
    } else if (run.code != 0 && run.code != kBodyThrew) {
        r.verdict = Verdict::Crash;
        r.reason = ending;
    } else {
        r.verdict = Verdict::Error;
        r.reason = !ending.empty() ? ending
                                   : "the case process ended without a readable result" +
                                         (unreadable.empty() ? std::string() : " (" + unreadable + ")");
    }
    return r;
}

// `unshrunk_note` empty: a FAIL is shrunk; otherwise it is reported as generated, with that note (why not).
CaseRun run_case_isolated(const prop::Target& t, const prop::Property& p, const prop::RunSettings& s, int index,
                          double timeout_s, const std::string& unshrunk_note) {
    const auto body = [&](int fd) {
        prop::CaseResult first = prop::evaluate_case(t, p, prop::generate_case(p, s, index, &t.caps));
        first.id = prop::case_id(p.id, index);
        first.seed = prop::case_seed(s.seed, p.id, index);
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
        send(fd, 'F', prop::shrink_case(t, p, s, index, std::move(first)));
    };
    const ChildRun run = run_in_child(body, timeout_s);
    prop::CaseResult fresh;
    fresh.id = prop::case_id(p.id, index);
    fresh.property = p.id;
    fresh.seed = prop::case_seed(s.seed, p.id, index);
    return {interpret(run, fresh, [&] { return prop::generate_case(p, s, index, &t.caps); }, timeout_s), run.output};
}

CaseRun replay_isolated(const prop::Target& t, const prop::Property& p, const prop::Case& c, const std::string& id,
                        uint64_t seed, double timeout_s) {
    const auto body = [&](int fd) {
        prop::CaseResult r = prop::evaluate_case(t, p, c);
        r.id = id;
        r.seed = seed;
        send(fd, 'F', r);
    };
    const ChildRun run = run_in_child(body, timeout_s);
    prop::CaseResult fresh;
    fresh.id = id;
    fresh.property = p.id;
    fresh.seed = seed;
    return {interpret(run, fresh, [&] { return c; }, timeout_s), run.output};
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

int validate(ValidateOptions& o) {
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
    if (!o.report.empty() && o.report == o.junit) throw BadInput("--report and --junit name the same file");
    const std::vector<Subject> subjects = load_subjects(o.plugin, o.builtin, true);
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
    std::cout << "\n";

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
          {"shrink_first", o.shrink_first >= kShrinkAll ? nlohmann::json("all") : nlohmann::json(o.shrink_first)}}},
        {"implementations", nlohmann::json::array()}};

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
            CaseRun run = run_case_isolated(subj.target, *ref.property, settings, ref.index, o.timeout, unshrunk_note);
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
                    command = "kvcheck replay " + shell_quote(file) + " " + subj.target_args;
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
};

struct ReplayDocument {
    const prop::Property* property = nullptr;
    prop::Case c;
    std::string id, recorded_verdict, recorded_reason;
    std::optional<prop::Mismatch> recorded_mismatch;
    uint64_t seed = 0;
};

ReplayDocument read_replay(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw BadInput(path + ": cannot open the replay file");
    std::ostringstream text;
    text << in.rdbuf();
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text.str());
    } catch (const nlohmann::json::parse_error& e) {
        throw BadInput(path + ": not JSON (" + e.what() + ")");
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
    const ReplayDocument d = read_replay(o.file);
    const std::vector<Subject> subjects = load_subjects(o.plugin, o.builtin, false);
    const Subject& subj = subjects[0];
    std::cout << "kvcheck " KVCHECK_VERSION " replay " << o.file << "\n" << subject_header(subj);
    std::cout << "case " << d.id << " of property " << d.property->id << " (case seed " << d.seed << ")\n";
    if (!d.recorded_reason.empty()) std::cout << "recorded: " << d.recorded_verdict << ": " << d.recorded_reason << "\n";
    if (d.recorded_mismatch)
        std::cout << "recorded first mismatch: " << prop::mismatch_text(*d.recorded_mismatch) << "\n";
    std::cout << indent(prop::describe(d.c), "  ");
    const CaseRun run = replay_isolated(subj.target, *d.property, d.c, d.id, d.seed, o.timeout);
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
    }
}

} // namespace

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
    replay_cmd->callback([&exit_code] { exit_code = guarded("replay", [] { return replay(r); }); });
}

} // namespace kvc::cli
