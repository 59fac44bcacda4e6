// The tolerance policy, in one place (docs/tolerance.md says it in words).
//
// An implementation declares its rounding pipeline (kvc_pipeline, ABI 1.1; or a 1.0 precision class, which names a
// preset pipeline). Every output element is compared with the long double oracle, and the allowed error is derived
// from the pipeline and the data, never from one particular summation order:
//     allowed = max(model bound of the declared pipeline on these inputs, floor of the pipeline) ,
// where the model bound adds, stage by stage, how far any correct computation that rounds where the pipeline says
// can move the output (first-order perturbation of the scores, probability and output rounding; a probabilistic
// bound for every partial sum of the V accumulator and the softmax denominator, valid for any order, rescaling or
// split). Errors are reported relative to the largest |v| the row sees. NaN or infinity anywhere fails.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/properties/oracle.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kvc::prop {

// A declared rounding pipeline (kvc_pipeline), one kvc_round per stage.
struct Pipeline {
    uint32_t q = KVC_ROUND_F32, rope = KVC_ROUND_F32, scores = KVC_ROUND_F32, probs = KVC_ROUND_F32,
             accum = KVC_ROUND_F32, output = KVC_ROUND_F32;
    bool new_rows_unrounded = false; // KVC_PIPELINE_NEW_ROWS_UNROUNDED
    // ABI 1.2: how q8_0 codes are rounded (the cache's, and q's under q = KVC_ROUND_Q8_0): 0 for ggml's reference
    // quantize_row_q8_0_ref, or the one flag KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN / KVC_PIPELINE_Q8_0_RECIP_D_EVEN.
    uint32_t q8_0_rounding = 0;
    bool operator==(const Pipeline& o) const;
};

// The 1.0 precision classes as named presets: KVC_PRECISION_F32 (f32 everywhere) and
// KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE (q and accumulator rounded to the cache dtype).
Pipeline pipeline_preset(uint32_t precision);
// What an implementation declares: caps.pipeline when KVC_PIPELINE_DECLARED is set, else the preset of precision.
Pipeline declared_pipeline(const kvc_caps& caps);
kvc_pipeline to_abi(const Pipeline& p); // flags include KVC_PIPELINE_DECLARED
// A kvc_pipeline as declared (its flags are not consulted: the caller has checked KVC_PIPELINE_DECLARED).
Pipeline pipeline_of(const kvc_pipeline& a);

// ABI 1.3: the pipeline rules the caps hold (none before 1.3 or when n_pipeline_rules is 0; at most
// KVC_MAX_PIPELINE_RULES, validated when the plugin is loaded).
std::vector<kvc_pipeline_rule> pipeline_rules(const kvc_caps& caps);
// The pipeline that grades one sequence's outputs of one call appending n_new rows to it in a cache of this dtype:
// the first rule covering (dtype, n_new), else declared_pipeline(caps). `rule` is its index, -1 for the default.
struct ChosenPipeline {
    Pipeline pipeline;
    int rule = -1;
};
ChosenPipeline pipeline_for(const kvc_caps& caps, uint32_t cache_dtype, uint32_t n_new);
// Whether rule r covers a call appending n_new rows to a cache of this dtype.
bool rule_covers(const kvc_pipeline_rule& r, uint32_t cache_dtype, uint32_t n_new);
// Every pipeline that may grade some call in a cache of this dtype: the default and each rule covering the dtype.
std::vector<Pipeline> pipelines_for_dtype(const kvc_caps& caps, uint32_t cache_dtype);
// "pipeline rule 2 (f16, n >= 64)" (numbered from 1) or "the default pipeline" (rule -1).
std::string graded_by_name(const kvc_caps& caps, int rule);
// Why a table of rules is refused at load, in words; empty when it is valid: at most KVC_MAX_PIPELINE_RULES, each
// rule DECLARED with stages in range, dtype bits only of declared dtypes, and the q8_0 rounding of every rule covering
// a dtype equal to kvc_caps.pipeline's (stored codes do not depend on the call).
std::string pipeline_rules_problem(const kvc_caps& caps);
// {"dtypes": ["f16"], "min_new": 64, "pipeline": {...}} per rule (dtypes absent = every dtype)
nlohmann::json rules_to_json(const kvc_caps& caps);
// "f32" for the all-f32 pipeline, the preset's name, or "q=f16 rope=f16 scores=f32 probs=f32 accum=f32 out=f16".
std::string pipeline_name(const Pipeline& p);
// True when no stage rounds below f32 for this cache dtype.
bool pipeline_is_f32(const Pipeline& p, uint32_t cache_dtype);
// {"q": "f16", ..., "new_rows_unrounded": false}, and "q8_0_rounding": "x86" or "neon" when one is declared
nlohmann::json to_json(const Pipeline& p);
Pipeline pipeline_from_json(const nlohmann::json& j); // also accepts a preset name string; throws invalid_argument
const char* round_name(uint32_t r); // "f32", "f16", "bf16", "cache", and for q "fp8_e4m3", "fp8_e5m2", "q8_0"
// "ref" (0), "x86" (KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN), "neon" (KVC_PIPELINE_Q8_0_RECIP_D_EVEN)
const char* q8_0_rounding_name(uint32_t flag);

// The floor on the relative error: 1e-5 for an all-f32 pipeline, else the unit roundoff of the narrowest stage
// (f16 2^-11, bf16 2^-8): below it no 16-bit pipeline is told apart from another.
double tolerance_floor(const Pipeline& p, uint32_t cache_dtype);

// Where the worst element is, in logical coordinates.
struct Worst {
    uint32_t token = 0; // index within the call's new tokens
    uint32_t head = 0;  // query head
    uint32_t dim = 0;
    double expected = 0, actual = 0;
};

struct Grade {
    bool pass = true;
    double error = 0;    // relative error of the worst element (relative to max |v| of its row)
    double allowed = 0;  // the relative bound at that element
    double headroom = 0; // max over elements of error / allowed (<= 1 passes)
    bool nan = false;    // a NaN or an infinity in the output
    bool fails_f32_class = false; // passes its declared narrower pipeline but would fail the f32 one
    Worst worst;
    std::string message; // why it failed, in words; empty on pass
};

// Grades one call's outputs against its expectation under the declared pipeline. `unrounded_new_rows`, when given,
// is the expectation with the call's new rows attended before rounding (only for the diagnosis of a failure).
// `name_pipelines` false leaves narrower pipelines out of a failure's message (the caller knows a better cause).
Grade grade_outputs(const CaseConfig& cfg, const Pipeline& declared, const float* actual, const Expected& e,
                    const Expected* unrounded_new_rows = nullptr, bool name_pipelines = true);

// The allowed relative error (relative to max |v| of the row) of every output element under pipeline p:
// [n_new][Hq*d], the floor included.
std::vector<double> allowed_errors(const CaseConfig& cfg, const Pipeline& p, const Expected& e);

// Headroom (worst error / allowed) of `actual` under pipeline p; infinity when a NaN is present.
double headroom_under(const CaseConfig& cfg, const Pipeline& p, const float* actual, const Expected& e);

} // namespace kvc::prop
