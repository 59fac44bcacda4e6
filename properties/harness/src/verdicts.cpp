#include "kvcheck/harness/verdicts.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace kvc::harness {

using prop::Verdict;

int verdict_index(Verdict v) {
    for (int i = 0; i < kVerdictCount; ++i)
        if (kVerdicts[i] == v) return i;
    return 0;
}

bool conformant(Verdict v) {
    return v == Verdict::Pass || v == Verdict::NotSupported || v == Verdict::QualityWarning;
}

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

void add_to_row(Row& row, const prop::CaseResult& r) {
    if (r.outside_declaration) {
        ++row.outside;
        return;
    }
    ++row.counts[verdict_index(r.verdict)];
    row.worst.add(r);
}

// A core property whose every case was NOT_SUPPORTED or outside the declaration tested nothing: that is no
// conformance claim.
bool core_never_ran(const Row& r) {
    const int total = sum(r.counts);
    return r.core && total + r.outside > 0 && r.counts[verdict_index(Verdict::NotSupported)] == total;
}

std::string row_result(const Row& r, bool judge_core) {
    const int* counts = r.counts;
    const int total = sum(counts);
    if (nonconformant(counts)) return "NOT CONFORMANT";
    if (judge_core && core_never_ran(r)) return "NOT CONFORMANT (core property, no case ran)";
    if (total == 0) return r.outside ? "not declared" : "-";
    if (counts[verdict_index(Verdict::NotSupported)] == total) return "not supported";
    if (counts[verdict_index(Verdict::QualityWarning)]) return "ok (quality warnings)";
    return "ok";
}

std::string counts_text(const int counts[kVerdictCount]) {
    std::ostringstream s;
    if (sum(counts) == 0) return "0 cases";
    s << sum(counts) << " cases:";
    bool any = false;
    for (int i = 0; i < kVerdictCount; ++i)
        if (counts[i]) {
            s << (any ? ", " : " ") << counts[i] << " " << prop::verdict_name(kVerdicts[i]);
            any = true;
        }
    return s.str();
}

std::string outside_text(int n) {
    return n ? ", " + std::to_string(n) + " outside the declaration" : std::string();
}

nlohmann::json counts_json(const int counts[kVerdictCount]) {
    nlohmann::json c;
    for (int v = 0; v < kVerdictCount; ++v) c[prop::verdict_name(kVerdicts[v])] = counts[v];
    return c;
}

std::string verdict_table(const std::vector<Row>& rows, bool with_label, bool with_level, bool judge_core) {
    std::vector<std::vector<std::string>> cells;
    std::vector<std::string> head;
    if (with_label) head.push_back("implementation");
    if (with_level) head.push_back("level");
    head.push_back("property");
    for (Verdict v : kVerdicts) head.push_back(prop::verdict_name(v));
    head.push_back("outside");
    head.push_back("worst headroom");
    head.push_back("result");
    cells.push_back(head);
    for (const Row& r : rows) {
        std::vector<std::string> line;
        if (with_label) line.push_back(r.label);
        if (with_level) line.push_back(level_name(r.level));
        line.push_back(r.property);
        for (int i = 0; i < kVerdictCount; ++i) line.push_back(std::to_string(r.counts[i]));
        line.push_back(std::to_string(r.outside));
        line.push_back(r.worst.text());
        line.push_back(row_result(r, judge_core));
        cells.push_back(line);
    }
    // Count columns (the verdicts and "outside") share one fixed width, that of the longest verdict name
    // (QUALITY_WARNING, 15 characters), so tables of different runs line up whatever the counts.
    const std::size_t first_count = 1 + (with_label ? 1 : 0) + (with_level ? 1 : 0),
                      last_count = first_count + kVerdictCount + 1;
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

} // namespace kvc::harness
