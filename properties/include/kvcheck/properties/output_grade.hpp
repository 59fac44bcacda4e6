// EQUIV's rule for one call, written once for both graders (the plugin harness and `kvcheck grade`): the outputs of
// the graded rows against the oracle over the rows the cache model holds, under the pipeline the implementation
// declares (tolerance.hpp). On a failure the diagnosis names the likelier cause: the new rows attended before their
// rounding to the cache dtype, or a storage error the model saw when its rows came back.
#pragma once

#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/mismatch.hpp"
#include "kvcheck/properties/tolerance.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvc::prop {

// The rows of one call being graded. The graded rows are the last n_rows of the first `history` rows of the
// stream: all of a call's rows, or one row of it graded alone over the history truncated after it.
struct GradedRows {
    const float* q = nullptr;   // [n_rows][Hq*d] their queries, as passed
    const float* out = nullptr; // [n_rows][Hq*d] what the implementation returned for them
    uint32_t n_rows = 0;
    uint32_t history = 0;       // rows the last graded row attends
    uint32_t call_begin = 0;    // position of the call's first new row (its new rows run up to `history`)
    const float* call_k = nullptr; // [history - call_begin][Hkv*d] the call's new rows as given (keys unrotated)
    const float* call_v = nullptr;
};

struct OutputVerdict {
    Grade grade;         // pass, headroom, fails_f32_class, the worst element
    std::string reason;  // on a failure: the tolerance policy's words and the diagnosis
    Mismatch where;      // on a failure: the worst element, in the case's coordinates (op left to the caller)
};

// storage_mismatch: the first element the model found stored wrongly in this case, when CACHE-CONTENT is not the
// property checked (the oracle attends the rows as they should be stored, so the storage is named as the cause).
OutputVerdict grade_call_outputs(const CacheModel& model, uint32_t seq, uint32_t layer, const Pipeline& declared,
                                 const GradedRows& rows, const std::optional<Mismatch>& storage_mismatch);

// The queries as the declared pipeline's q stage rounds them before anything else: a copy of q [n floats], each
// quantized to fp8 (unscaled, saturating; the reference encoder) when pipeline.q is KVC_ROUND_FP8_*, to q8_0 blocks
// of 32 and dequantized, rounded as pipeline.q8_0_rounding declares, when it is KVC_ROUND_Q8_0 (n and so head_dim a
// multiple of 32: std::invalid_argument otherwise), else as given (16-bit q stages are covered by the bound instead).
std::vector<float> queries_as_rounded(const Pipeline& declared, const float* q, size_t n);

// The expectation of the graded rows over the first `history` rows of (seq, layer) as the model holds them.
Expected expected_outputs(const CacheModel& model, uint32_t seq, uint32_t layer, const GradedRows& rows,
                          HeadMap map = HeadMap::Repeat);

// What a windowed layer's failed outputs match instead (docs/windowed-caches.md), told at the first graded row that
// fails: "; the outputs match a window of 17 keys: ...", the window of the call's first row used for every row, or
// the sinks left out; "" when none fits or the layer has no window. Both graders append it to EQUIV's reason.
std::string window_diagnosis(const CacheModel& model, uint32_t seq, uint32_t layer, const Pipeline& declared,
                             const GradedRows& rows);

} // namespace kvc::prop
