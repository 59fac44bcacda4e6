// golden verify: every number of every file against the oracle. Reads only; bad input becomes a report, never an
// exception.
#include "kvcheck/golden/golden.hpp"
#include "kvcheck/golden/oracle.hpp"
#include "kvcheck/golden/validate.hpp"

#include "files.hpp"
#include "strict_json.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>

namespace kvc::golden {
namespace {

using nlohmann::json;

std::string number(long double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17Lg", x);
    return buf;
}

std::string shape_text(const std::vector<size_t>& s) {
    if (s.empty()) return "a scalar";
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? " x " : "") + std::to_string(s[i]);
    return t + "]";
}

// "/2" for element 2 of a vector, "/1/3" for row 1, column 3 of a matrix, "" for a scalar.
std::string element(const std::vector<size_t>& shape, size_t i) {
    if (shape.empty()) return "";
    if (shape.size() == 1) return "/" + std::to_string(i);
    return "/" + std::to_string(i / shape[1]) + "/" + std::to_string(i % shape[1]);
}

// computed is stored as a double with 17 significant digits; the reference works in long double.
bool same_computed(long double stored, long double actual) {
    return stored == actual || std::fabs(stored - actual) <= 1e-12L * std::max(std::fabs(stored), std::fabs(actual));
}

void check_entry(const Entry& e, const Value& v, FileReport& r) {
    const std::string p = "/entries/" + std::to_string(e.index);
    for (size_t i = 0; i < v.data.size(); ++i) {
        const long double actual = v.data[i] / e.unit_divisor;
        if (e.kind == "printed") {
            ++r.printed;
            const long double printed = parse_printed(e.printed[i]).value; // validated already
            // the slack absorbs only the binary representation of the decimal printed value
            if (std::fabs(actual - printed) > e.tolerance + 1e-15L * std::max(1.0L, std::fabs(printed)))
                r.mismatches.push_back({p + "/printed" + element(e.shape, i), e.id,
                                        e.printed[i] + (e.exact ? " (exact)" : " (±" + number(e.tolerance) + ")"),
                                        number(actual)});
        } else {
            ++r.derived;
        }
        if (e.greater_than && !(actual > *e.greater_than))
            r.mismatches.push_back({p + "/claim", e.id, "greater than " + number(*e.greater_than), number(actual)});
        const long double stored = (*e.computed)[i];
        if (!same_computed(stored, actual))
            r.stale.push_back({p + "/computed" + element(e.shape, i), e.id, number(stored), number(actual)});
    }
}

} // namespace

FileReport verify_text(const std::string& name, const std::string& text, const Oracle& oracle) {
    FileReport r;
    r.file = name;
    try {
        const GoldenFile g = parse_golden(parse_strict(text), name, /*need_computed=*/true);
        // All entries must be known before any is counted: a malformed file reports nothing else.
        for (const Entry& e : g.entries) {
            const Value* v = oracle.find(e.quantity);
            const std::string p = "/entries/" + std::to_string(e.index);
            if (!v) throw FormatError(p + "/quantity", "unknown quantity \"" + e.quantity + "\"");
            if (v->shape != e.shape)
                throw FormatError(p, "\"" + e.id + "\" holds " + shape_text(e.shape) + ", the reference's " +
                                         e.quantity + " is " + shape_text(v->shape));
        }
        for (const Entry& e : g.entries) check_entry(e, *oracle.find(e.quantity), r);
    } catch (const json::exception& ex) { // parse errors: bad or truncated JSON
        r = FileReport{};
        r.file = name;
        r.malformed = std::string("not valid JSON: ") + ex.what();
    } catch (const FormatError& ex) {
        r = FileReport{};
        r.file = name;
        r.malformed = describe(ex);
    }
    return r;
}

Report verify_dir(const std::filesystem::path& dir) {
    Report report;
    std::vector<std::filesystem::path> files;
    try {
        files = golden_files(dir);
    } catch (const std::exception& ex) {
        report.error = ex.what();
        return report;
    }
    if (interrupted_regen(dir)) { // part of the set may be new, part old: not a set to check number by number
        report.error = "an interrupted golden regen left " + std::string(kJournalName) + " in " + dir.string() +
                       ": the set is part old, part new; run " + kRegenCommand + " to finish it";
        return report;
    }
    std::unique_ptr<Oracle> oracle;
    try {
        oracle = std::make_unique<Oracle>();
    } catch (const std::exception& ex) {
        report.internal = std::string("the reference oracle failed: ") + ex.what();
        return report;
    }
    std::set<std::string> named;
    for (const auto& f : files) {
        std::string text;
        if (std::string why = read_file(f, text); !why.empty()) {
            FileReport r;
            r.file = f.filename().string();
            r.malformed = why;
            report.files.push_back(r);
            continue;
        }
        report.files.push_back(verify_text(f.filename().string(), text, *oracle));
        // which quantities the directory covers, to notice a missing file or entry
        try {
            const json doc = parse_strict(text);
            for (const auto& e : doc.at("entries")) named.insert(e.at("quantity").get<std::string>());
        } catch (const std::exception&) { // already reported as malformed
        }
    }
    // Only meaningful when every file could be read: a malformed file's quantities are unchecked anyway.
    const bool all_read = std::all_of(report.files.begin(), report.files.end(),
                                      [](const FileReport& f) { return f.malformed.empty(); });
    for (const auto& q : oracle->names())
        if (all_read && !named.count(q)) report.unchecked.push_back(q);
    return report;
}

int Report::exit_code() const {
    if (!internal.empty()) return 3;
    if (!error.empty() || !unchecked.empty()) return 2;
    for (const auto& f : files)
        if (!f.malformed.empty()) return 2;
    for (const auto& f : files)
        if (!f.mismatches.empty()) return 1;
    for (const auto& f : files)
        if (!f.stale.empty()) return 2;
    return 0;
}

} // namespace kvc::golden
