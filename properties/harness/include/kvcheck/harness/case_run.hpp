// One case in a child process of its own, at either level, and what came back turned into a verdict: the child's
// own result when it sent one, else CRASH (a signal, or the implementation ended the process), TIMEOUT, or ERROR
// (the harness could not read a result; the memory limit refused an allocation).
#pragma once

#include "kvcheck/harness/isolate.hpp"
#include "kvcheck/harness/subjects.hpp"
#include "kvcheck/model/model_case.hpp"
#include "kvcheck/properties/runner.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kvc::harness {

struct CaseRun {
    prop::CaseResult result;
    std::string output;    // what the implementation printed, if anything (printable, lines kept)
    Level level = Level::Operation;
    std::string case_text; // the case in words (model level: ModelCase::describe(); operation level: describe())
};

// Turns what came back from the child into a result. `fresh` describes the case itself (id, property, seed), for
// verdicts the child could not report; `the_case` makes the operation-level case as generated, needed only when
// the verdict is not conformant (the report and the replay file carry it), so passing cases do not pay for
// generating it twice. An empty `the_case` (model level: the case travels as result.model_case) leaves the
// counterexample empty.
prop::CaseResult interpret(const ChildRun& run, const prop::CaseResult& fresh,
                           const std::function<prop::Case()>& the_case, double timeout_s, uint64_t memory_limit,
                           bool memory_limit_asked);

// Operation level: case `index` of p. `unshrunk_note` empty: a FAIL is shrunk; otherwise it is reported as
// generated, with that note (why not).
CaseRun run_case_isolated(const Subject& subj, const prop::Property& p, const prop::RunSettings& s, int index,
                          double timeout_s, const std::string& unshrunk_note);

// Operation level, several cases in one process (validate --cases-per-process), to spare each case the start of a
// process and of the implementation (a CUDA context costs 0.2-0.4 s). Each case is evaluated as generated and never
// shrunk there. Returns, per item in order, the case's result when the batch gave a clean conformant one (PASS,
// QUALITY_WARNING, NOT_SUPPORTED: the final line for exactly that case, in order, on a pipe that carried nothing
// else); nullopt for every other case, which the caller runs alone (run_case_isolated), so that every FAIL, CRASH,
// TIMEOUT or ERROR verdict, its shrinking and its output come from a process of its own. The batch's deadline is
// timeout_s per item. The result covers the items up to the first one the batch did not answer cleanly (the process
// ended in it, or the pipe stopped being trusted there); the items after it were not reached and may go to another
// batch.
struct BatchItem {
    const prop::Property* property = nullptr;
    int index = 0;
};
std::vector<std::optional<CaseRun>> run_cases_batched(const Subject& subj, const std::vector<BatchItem>& items,
                                                      const prop::RunSettings& s, double timeout_s);

// Operation level: a recorded case, as it is (no shrinking).
CaseRun replay_isolated(const Subject& subj, const prop::Property& p, const prop::Case& c, const std::string& id,
                        uint64_t seed, double timeout_s);

// Model level: the case of property `property` drawn from `case_seed` inside the declared caps. `unshrunk_note`
// empty: a FAIL is shrunk (model_shrink.hpp); otherwise it is reported as drawn, with that note (why not). For every
// verdict but PASS and NOT_SUPPORTED, result.model_case (JSON) and case_text are the case as run: the shrunk one
// after shrinking, which the replay file carries.
CaseRun run_model_case_isolated(const Subject& subj, const std::string& property, const std::string& id,
                                uint64_t case_seed, double timeout_s, const std::string& unshrunk_note);

// Model level, a recorded case as it is (no shrinking): `given` (a replay file's case), else the one drawn from
// `case_seed` inside the caps declared now (a replay file that carries only the seed).
CaseRun replay_model_case_isolated(const Subject& subj, const std::string& property, const std::string& id,
                                   uint64_t case_seed, const std::optional<model::ModelCase>& given,
                                   double timeout_s);

// Model level: a case's seed for a run (the same derivation as the operation level's case seeds).
uint64_t model_case_seed(uint64_t run_seed, const std::string& property, int index);

} // namespace kvc::harness
