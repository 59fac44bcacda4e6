// The model-level properties (docs/model-level.md), written against the model ABI table only.
//
//   MODEL-LOGITS       every logit of every step equals the reference's full recompute of the same history within
//                      the bound; greedy tokens agree wherever the reference's top-2 margin exceeds the bound
//   MODEL-KV           (READ_KV) layer l's cached K (RoPE applied) and V equal the reference's layer-l K and V
//   MODEL-CHUNK        the prompt whole, in chunks or token by token: every returned logit within the bound
//   MODEL-FORK         (FORK) parent and child continue from the shared prefix, each equal to its own history
//   MODEL-RELEASE      (RELEASE) after release a sequence restarts at position 0 with nothing of its past
//   MODEL-MEMORY       bytes per token = 2·L·H_kv·d_h·s; live bytes = tokens held × bytes per token
//   MODEL-PROJECTIONS  (KV_PROJECTIONS) a 2-token prompt and 99 greedy steps project 2 + 99 = 101 tokens' K/V
//                      (the reference's recompute: 5,049)
#pragma once

#include "kvcheck/model/model_case.hpp"
#include "kvcheck/model/model_target.hpp"
#include "kvcheck/properties/runner.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvc::model {

// One verdict vocabulary for both levels: the operation level's. A property here ends PASS, FAIL, NOT_SUPPORTED or
// ERROR; CRASH and TIMEOUT are given by the harness (kvcheck_harness), which runs each case in a child process.
using prop::Verdict;
using prop::verdict_name;

struct PropertyResult {
    std::string id;
    Verdict verdict = Verdict::Pass;
    std::string message;      // FAIL/ERROR: the counterexample (case, step, logit index, values); else a summary
    uint64_t first_seed = 0;  // the run's seed: case k has seed first_seed + k
    uint64_t case_seed = 0;   // FAIL/ERROR: the failing case's seed (replay: run with it and n_cases = 1)
    int cases_run = 0;
    double worst_headroom = 0; // max over compared values of |engine − oracle| / allowed (≤ 1 passes)
    bool out_of_memory = false; // ERROR: a call returned KVC_ERR_OUT_OF_MEMORY or an allocation threw bad_alloc
    std::optional<ModelCase> the_case; // FAIL/ERROR: the case the verdict is about (after shrinking, the shrunk one)
    std::string failure;  // FAIL/ERROR: what went wrong on the_case, without the case's description
    double excess = 0;    // FAIL: |engine − oracle| / allowed of the failing value; infinite when no bound is involved
    int shrink_steps = 0; // FAIL: smaller failing cases taken by shrinking (model_shrink.hpp)
    int shrink_runs = 0;  // FAIL: candidates shrinking ran
};

const std::vector<std::string>& model_property_ids();
// One line per property, for `kvcheck list`; "" for an unknown id.
std::string model_property_summary(const std::string& id);

// Runs one given case as it is: NOT_SUPPORTED when the property needs a feature the engine does not declare or the
// case lies outside its caps (outside_caps); otherwise the property's verdict on it. The message of a FAIL or ERROR is
// the case's describe() and the failure.
PropertyResult run_model_case(const ModelTarget& target, const std::string& id, const ModelCase& c);

// Runs one property over n_cases cases with seeds seed, seed+1, ...; stops at the first failing case, whose message
// ends with the seed that replays it. max_shrink_runs > 0: a FAIL is shrunk first (shrink_model_failure).
PropertyResult run_model_property(const ModelTarget& target, const std::string& id, uint64_t seed, int n_cases,
                                  int max_shrink_runs = 0);

// Every property, in the order of model_property_ids().
std::vector<PropertyResult> run_model_properties(const ModelTarget& target, uint64_t seed, int n_cases);

} // namespace kvc::model
