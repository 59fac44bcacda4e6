// What `kvcheck export` and `kvcheck grade` share: how a conformance case becomes a list of steps (one call each: one
// (sequence, layer), or one layer of a batch of sequences), the inputs of a step, the rows a cache must store, the
// per-row tolerance bounds and the live-byte formula. docs/vectors.md describes the files built from these.
//
// Candidates for the properties library (kept here so that library is untouched by this tool): step expansion,
// expected_new_rows, row_bounds and live_bytes restate what session.cpp and tolerance.cpp compute inline.
#pragma once

#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/oracle.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvc::vec {

constexpr int kVectorsFormat = 2; // manifest.json "kvcheck_vectors" (2: batched calls are one step)
constexpr int kResultsFormat = 1; // results manifest.json "kvcheck_results"

// The properties whose checks make sense offline (no allocator, no second run), and what each checks.
struct OfflineChecks {
    bool equiv = false;     // outputs vs the oracle under the tolerance policy
    bool content = false;   // new rows dumped equal the expected stored rows; dump lengths agree
    bool unchanged = false; // rows once dumped never change (fork copies the parent's, release forgets)
    bool memory = false;    // reported live bytes equal the formula
};
// ok == false when the property cannot be graded offline (NO-Q) or is unknown.
struct OfflineProperty {
    bool ok = false;
    OfflineChecks checks;
};
OfflineProperty offline_property(const std::string& id);
std::vector<std::string> offline_property_ids();

enum class StepKind { Append, AppendBatch, Fork, Release };
const char* step_kind_name(StepKind k); // "append", "append_batch", "fork", "release"

// One sequence's part of an append step: its new tokens sit at rows token_begin .. token_begin+n_new-1 of the
// step's packed q, k, v and out tensors, at positions pos_begin .. pos_begin+n_new-1 of (seq, layer).
struct Slice {
    uint32_t seq = 0;
    uint32_t n_new = 0;
    uint32_t pos_begin = 0;   // rows (seq, layer) held before the step
    uint32_t token_begin = 0; // first row of the slice in the packed tensors
};

// One call into an implementation. An Append op becomes one append step per layer (layer_order when given); an
// AppendBatch op becomes one append_batch step per layer, the call that takes every sequence of the batch at once
// (kvc_batch), as the harness's session makes it.
struct Step {
    StepKind kind = StepKind::Append;
    uint32_t op = 0;      // index of the case's op it comes from (the input values depend on it)
    uint32_t seq = 0;     // Append: the sequence; Fork: the parent; Release: the sequence
    uint32_t child = 0;   // Fork: the new sequence
    uint32_t layer = 0;   // Append, AppendBatch
    uint32_t n_new = 0;   // Append, AppendBatch: tokens of the whole call
    uint32_t pos_begin = 0; // Append: rows (seq, layer) held before the step
    std::vector<Slice> slices; // Append: one; AppendBatch: one per sequence, in the call's order
    bool appends() const { return kind == StepKind::Append || kind == StepKind::AppendBatch; }
};
std::vector<Step> expand_steps(const prop::Case& c);
// Step i as manifest.json lists it (input tensors named step<i>.q, .k, .v; the dumps it asks for).
nlohmann::json step_json(const Step& s, size_t i);
// The names of the K and V dumps of one slice of append step i: "step<i>.k" for an append, "step<i>.s<seq>.k" in a
// batch.
std::string dump_name(const Step& s, size_t i, const Slice& sl, const char* kv);

// The q, k, v an append step passes, exactly as kvc::prop::input_value gives them (row-major [n][H][d], slices
// packed one after another).
struct StepInputs {
    std::vector<float> q, k, v;
};
StepInputs step_inputs(const prop::Case& c, const Step& s);

// The rows one slice's new tokens must be stored as, in the cache dtype's bytes ([n][Hkv][d] elements of
// dtype_size), and the same values widened to float. k, v: the slice's inputs ([n][Hkv*d]).
struct StoredRows {
    std::vector<uint8_t> k_bits, v_bits;
    std::vector<float> k, v;
    std::vector<float> rotated; // the keys before the rounding to the cache dtype (long double rotation, to float)
};
StoredRows expected_new_rows(const prop::CaseConfig& cfg, const Slice& sl, const float* k, const float* v);

// Allowed relative error per output row (token i, query head h) of each preset precision class, the tightest
// element's bound of the row (kvc::prop::allowed_errors). [n_new * Hq] each.
struct RowBounds {
    std::vector<double> f32, cache_dtype;
};
RowBounds row_bounds(const prop::CaseConfig& cfg, const prop::Expected& e);

// Live bytes of the formula: 2 * sum over (seq, layer) of length * n_kv_heads * head_dim * sizeof(dtype).
uint64_t live_bytes(const prop::CaseConfig& cfg, const std::vector<std::vector<uint32_t>>& lengths);


// "0x3e800000"
std::string float_bits(float x);
// A case's file stem: "CACHE-CONTENT/3" -> "CACHE-CONTENT_3".
std::string case_stem(const std::string& id);
// Capabilities a case needs, in words ("dtype f16", "rope neox", "gqa", "chunked", "fork", "release", "batch").
std::vector<std::string> required_words(const prop::Case& c);
// The config as the manifest writes it (exact scalars also as bit patterns).
nlohmann::json config_json(const prop::CaseConfig& cfg);

} // namespace kvc::vec
