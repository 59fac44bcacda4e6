// Replay files: the document `validate` writes for each case that did not pass, and reading one back for `replay`.
// An operation-level document carries the case itself; a model-level one ("level": "model") carries its case seed
// and the case as run ("case", model_case.hpp's JSON form; the shrunk one after shrinking, with "shrink_steps"). A
// model-level document without "case" has it drawn again from the seed inside the declared caps (docs/model-level.md).
#pragma once

#include "kvcheck/harness/subjects.hpp"
#include "kvcheck/model/model_case.hpp"
#include "kvcheck/properties/runner.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace kvc::harness {

// Writes the replay document of a case that did not pass into dir (dir/LABEL when `several`), named
// PROPERTY-INDEX.json; returns its path, or "" with the reason in `error`.
std::string write_counterexample(const std::string& dir, bool several, const Subject& subj, Level level,
                                 const prop::CaseResult& r, int index, uint64_t run_seed, const std::string& case_text,
                                 std::string& error);

struct ReplayDocument {
    Level level = Level::Operation;
    std::string property_id;
    const prop::Property* property = nullptr; // operation level
    prop::Case c;                             // operation level
    std::string id, recorded_verdict, recorded_reason, case_text;
    std::optional<prop::Mismatch> recorded_mismatch;
    uint64_t seed = 0; // the case seed: at the model level, the case itself when model_case is absent
    std::optional<model::ModelCase> model_case; // model level: the recorded case, run as it is
    int shrink_steps = 0;                       // model level: the shrinking steps that made model_case
};

// Reads and checks a replay document. Throws BadInput naming the file and what is wrong.
ReplayDocument read_replay(const std::string& path);

} // namespace kvc::harness
