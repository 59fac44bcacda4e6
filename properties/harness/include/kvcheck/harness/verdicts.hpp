// The verdicts counted: per property (a row of the verdict table), per implementation and per run, and the verdict
// table itself. One vocabulary for both levels (prop::Verdict): PASS, NOT_SUPPORTED and QUALITY_WARNING keep an
// implementation conformant; FAIL, ERROR, CRASH and TIMEOUT do not. A case outside the declaration (it needs a
// capability the implementation does not declare) tested nothing and gets no verdict: it is counted apart.
#pragma once

#include "kvcheck/harness/subjects.hpp"
#include "kvcheck/harness/worst_headroom.hpp"
#include "kvcheck/properties/runner.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kvc::harness {

constexpr prop::Verdict kVerdicts[] = {prop::Verdict::Pass,  prop::Verdict::Fail,  prop::Verdict::NotSupported,
                                       prop::Verdict::QualityWarning, prop::Verdict::Error, prop::Verdict::Crash,
                                       prop::Verdict::Timeout};
constexpr int kVerdictCount = 7;

int verdict_index(prop::Verdict v);
bool conformant(prop::Verdict v);

// One row of the verdict table: one property of one implementation.
struct Row {
    std::string label, property;
    Level level = Level::Operation;
    bool core = false; // a core property of which no case ran makes the implementation not conformant
    int counts[kVerdictCount] = {};
    WorstHeadroom worst;
    int outside = 0; // cases outside the declaration: in no verdict count
};

// Counts r into the row: its verdict and its headroom when it passed, or one more case outside the declaration.
void add_to_row(Row& row, const prop::CaseResult& r);

int sum(const int counts[kVerdictCount]);
int nonconformant(const int counts[kVerdictCount]); // cases with FAIL, ERROR, CRASH or TIMEOUT
bool core_never_ran(const Row& r);
// "ok", "NOT CONFORMANT", ... judge_core: false for a shard, which may legitimately hold no runnable case of a core
// property.
std::string row_result(const Row& r, bool judge_core);
// ", 200 outside the declaration" when n > 0, else "": what follows a counts_text.
std::string outside_text(int n);
std::string counts_text(const int counts[kVerdictCount]); // "12 cases: 11 PASS, 1 FAIL"
nlohmann::json counts_json(const int counts[kVerdictCount]);
// The table: a column per verdict, then the cases outside the declaration; an implementation column when
// with_label, a level column when with_level.
std::string verdict_table(const std::vector<Row>& rows, bool with_label, bool with_level, bool judge_core);

} // namespace kvc::harness
