// What `kvcheck grade` says once every case is graded: its warnings, the table of graded cases and the summary, and
// the JSON and JUnit reports (docs/vectors.md). Grading decides each verdict and which cases lie outside the
// declaration; this only presents them, the table and the reports from the same counts so that they never disagree.
#pragma once

#include "grade_inputs.hpp"

#include "kvcheck/properties/runner.hpp"
#include "kvcheck/vectors/vectors.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace kvc::vec {

// One case as grade left it: graded, or outside the declaration.
struct Graded {
    prop::CaseResult r;
    int step = -1;         // the step of the first failure or error (-1: none, or not tied to a step)
    bool outputs = false;  // the case's property grades outputs (headroom means something)
    // Outside the declaration: not graded and no verdict, counted apart (docs/vectors.md). `needs` says why;
    // `exported` is false for a case export left out.
    bool outside = false, exported = true;
    std::vector<std::string> needs;
    bool skipped = false;  // no results although the results declare what the case needs (an ERROR)
};

// Everything the table and the reports say, as grading left it.
struct GradeReport {
    Results results;           // the implementation: its name, version and declaration
    uint64_t vectors_seed = 0; // the seed the vectors were exported with
    std::vector<Graded> cases;              // every case, graded or not, in the order of the export
    std::vector<std::string> properties;    // the cases' properties, in the order of the export
    size_t n_outside = 0;                   // cases outside the declaration
    std::map<std::string, int> outside_by_property;
    // "needing ... (exported, no results)" or "(not exported)" -> the ids of those cases, groups in the order
    // first seen
    std::vector<std::pair<std::string, std::vector<std::string>>> outside_groups;
    std::vector<std::string> warnings; // what grade did that the user may not expect
};

// Prints the warnings on `err`, the table and the summary on `out`, then writes the reports `o` asks for (both or
// neither). Returns run_grade's exit code: 0 or 1 by the verdicts; 3 when a report cannot be written, 2 when one
// cannot be built.
int report_grade(const GradeReport& g, const GradeOptions& o, std::ostream& out, std::ostream& err);

} // namespace kvc::vec
