// kvcheck grade's table, summary and reports. The JSON report has the shape of validate's, so that one JUnit writer
// (kvcheck/harness/report.hpp) serves both; cases outside the declaration are listed apart and are no test cases.
#include "grade_report.hpp"

#include "kvcheck/harness/errors.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/harness/report.hpp"
#include "kvcheck/harness/worst_headroom.hpp"
#include "kvcheck/vectors/caps.hpp"

#include "kvcheck/properties/tolerance.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace kvc::vec {

using nlohmann::json;

namespace {

// The verdicts a graded case can get, in the order of the table's and the report's columns.
constexpr prop::Verdict kOrder[] = {prop::Verdict::Pass, prop::Verdict::QualityWarning, prop::Verdict::Fail,
                                    prop::Verdict::Error};
constexpr int kVerdictWidth = 15; // QUALITY_WARNING, the longest verdict name

// The graded cases counted once, for the table and the reports alike.
struct Tally {
    std::map<std::string, int> counts; // verdict name -> cases
    std::map<std::string, std::map<std::string, int>> by_property;
    std::map<std::string, harness::WorstHeadroom> worst; // per property
    std::map<std::string, int> notes;                    // note -> cases carrying it
    bool bad = false;                                    // a FAIL or an ERROR
};

Tally tally(const GradeReport& g) {
    Tally t;
    for (const Graded& c : g.cases) {
        if (c.outside) continue;
        const char* v = prop::verdict_name(c.r.verdict);
        ++t.counts[v];
        ++t.by_property[c.r.property][v];
        if (c.outputs) t.worst[c.r.property].add(c.r);
        for (const std::string& n : c.r.notes) ++t.notes[n];
        t.bad = t.bad || c.r.verdict == prop::Verdict::Fail || c.r.verdict == prop::Verdict::Error;
    }
    return t;
}

// m[key], or the value of a key never counted (0, or a headroom that is "-").
template <class Map>
typename Map::mapped_type at_or_none(const Map& m, const std::string& key) {
    const auto it = m.find(key);
    return it == m.end() ? typename Map::mapped_type{} : it->second;
}

int verdict_count(const Tally& t, const std::string& property, prop::Verdict v) {
    return at_or_none(at_or_none(t.by_property, property), prop::verdict_name(v));
}

std::string detail(const Graded& g) {
    std::string d = g.r.reason;
    if (g.step >= 0) d += " [step " + std::to_string(g.step) + "]";
    if (g.r.mismatch) d += "; first mismatch: " + g.r.mismatch->describe();
    return d;
}

// The heading, a line per graded case, the cases outside the declaration by what they need, the counts per property,
// the notes and the summary.
void print_table(const GradeReport& g, const Tally& t, std::ostream& out) {
    const Results& res = g.results;
    size_t width = 8;
    for (const Graded& c : g.cases) width = std::max(width, c.r.id.size());
    out << "kvcheck grade: " << res.name << (res.version.empty() ? "" : " " + res.version) << ", pipeline "
        << res.declared.pipeline_text << ", " << g.cases.size() - g.n_outside << " cases graded";
    if (g.n_outside > 0) out << ", " << g.n_outside << " outside the declaration";
    out << "\n";
    for (const Graded& c : g.cases) {
        if (c.outside) continue;
        std::ostringstream line;
        line << "  " << std::left << std::setw(static_cast<int>(width)) << c.r.id << "  " << std::setw(kVerdictWidth)
             << prop::verdict_name(c.r.verdict) << "  ";
        if (c.r.verdict == prop::Verdict::Fail) line << c.r.failed_property << ": ";
        if (c.r.verdict == prop::Verdict::Pass) {
            if (c.outputs) line << std::setprecision(3) << "headroom " << c.r.headroom;
        } else {
            line << detail(c);
        }
        std::string text = line.str();
        text.erase(text.find_last_not_of(' ') + 1);
        out << text << "\n";
    }
    if (g.n_outside > 0) {
        out << "outside the declaration, not graded: " << g.n_outside << (g.n_outside == 1 ? " case" : " cases")
            << "\n";
        constexpr size_t kIdsShown = 5;
        for (const auto& [key, ids] : g.outside_groups) {
            out << "  " << ids.size() << " " << key << ":";
            for (size_t k = 0; k < ids.size() && k < kIdsShown; ++k) out << (k ? ", " : " ") << ids[k];
            if (ids.size() > kIdsShown) out << " and " << ids.size() - kIdsShown << " more";
            out << "\n";
        }
    }
    // counts per property, one fixed-width column per verdict, then the cases outside the declaration
    size_t pw = 8;
    for (const std::string& p : g.properties) pw = std::max(pw, p.size());
    out << "  " << std::left << std::setw(static_cast<int>(pw)) << "property";
    for (prop::Verdict v : kOrder) out << "  " << std::right << std::setw(kVerdictWidth) << prop::verdict_name(v);
    out << "  " << std::right << std::setw(kVerdictWidth) << "outside";
    out << "  worst headroom\n";
    for (const std::string& p : g.properties) {
        out << "  " << std::left << std::setw(static_cast<int>(pw)) << p;
        for (prop::Verdict v : kOrder) out << "  " << std::right << std::setw(kVerdictWidth) << verdict_count(t, p, v);
        out << "  " << std::right << std::setw(kVerdictWidth) << at_or_none(g.outside_by_property, p);
        out << "  " << at_or_none(t.worst, p).text() << "\n";
    }
    for (const auto& [n, k] : t.notes) out << "note (" << k << (k == 1 ? " case" : " cases") << "): " << n << "\n";
    out << std::left << "summary:";
    for (const auto& [v, n] : t.counts) out << " " << n << " " << v;
    out << (t.bad ? "  => NOT CONFORMANT" : "  => every graded case passes") << "\n";
}

json report_json(const GradeReport& g, const Tally& t, int code) {
    const Results& res = g.results;
    json cases = json::array(), outside = json::array();
    for (const Graded& c : g.cases) {
        if (c.outside) {
            outside.push_back({{"id", c.r.id},
                               {"property", c.r.property},
                               {"seed", c.r.seed},
                               {"needs", c.needs},
                               {"exported", c.exported}});
            continue;
        }
        json j = prop::to_json(c.r);
        if (c.step >= 0) j["step"] = c.step;
        if (c.skipped) j["skipped_by_driver"] = true;
        cases.push_back(j);
    }
    json summary = json::object();
    for (const auto& [v, n] : t.counts) summary[v] = n;
    json properties = json::array(); // in the order of the export, as the table
    for (const std::string& p : g.properties) {
        json c = json::object();
        for (prop::Verdict v : kOrder) c[prop::verdict_name(v)] = verdict_count(t, p, v);
        properties.push_back({{"id", p},
                              {"counts", c},
                              {"outside_declaration", at_or_none(g.outside_by_property, p)},
                              {"worst_headroom", at_or_none(t.worst, p).json()}});
    }
    return {{"kvcheck_grade", 1},
            {"kvcheck_version", KVCHECK_VERSION},
            {"suite_version", KVCHECK_VERSION},
            {"run", {{"seed", g.vectors_seed}, {"profile", "offline"}}},
            {"implementations",
             json::array({{{"name", res.name},
                           {"label", res.name},
                           {"version", res.version},
                           {"precision", res.declared.pipeline_text},
                           {"pipeline", prop::to_json(res.declared.pipeline)},
                           {"capabilities", capability_words(res.declared.caps)},
                           {"declared", declared_to_json(res.declared)},
                           {"properties", properties},
                           {"cases", cases},
                           {"outside_declaration", outside}}})},
            {"vectors_seed", g.vectors_seed},
            {"summary", summary},
            {"outside_declaration", g.n_outside},
            {"warnings", g.warnings},
            {"exit_code", code}};
}

} // namespace

int report_grade(const GradeReport& g, const GradeOptions& o, std::ostream& out, std::ostream& err) {
    for (const std::string& w : g.warnings) err << "kvcheck grade: warning: " << harness::printable(w, true) << "\n";
    const Tally t = tally(g);
    print_table(g, t, out);
    const int code = t.bad ? harness::kExitNotConformant : harness::kExitOk;
    if (o.report.empty() && o.junit.empty()) return code;
    try {
        const json report = report_json(g, t, code);
        std::vector<std::pair<std::string, std::string>> files; // both or neither
        if (!o.report.empty()) files.emplace_back(o.report, harness::dump_json(report, 1) + "\n");
        if (!o.junit.empty()) files.emplace_back(o.junit, harness::junit_from_report(report));
        std::string error;
        if (!harness::write_files_atomically(files, error)) { // exit 3, as validate (docs/cli.md)
            err << "kvcheck grade: cannot write the report: " << harness::printable(error, true) << "\n";
            return harness::kExitInternal;
        }
    } catch (const std::runtime_error& e) {
        err << "kvcheck grade: " << harness::printable(e.what(), true) << "\n";
        return harness::kExitBadInput;
    }
    return code;
}

} // namespace kvc::vec
