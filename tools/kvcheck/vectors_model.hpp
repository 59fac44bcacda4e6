// What `kvcheck export` and `kvcheck grade` share: how a conformance case becomes a list of steps (one call of one
// (sequence, layer) each), the inputs of a step, the rows a cache must store, the per-row tolerance bounds and the
// live-byte formula. docs/vectors.md describes the files built from these.
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

constexpr int kVectorsFormat = 1; // manifest.json "kvcheck_vectors"
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

enum class StepKind { Append, Fork, Release };
const char* step_kind_name(StepKind k); // "append", "fork", "release"

// One call into an implementation. Appends are one (sequence, layer) each: an op appends to its sequences layer by
// layer (layer_order when given), and within a layer to its sequences in the order listed, as the harness's session
// does for an Append op with several entries (an AppendBatch becomes the same single-sequence calls).
struct Step {
    StepKind kind = StepKind::Append;
    uint32_t op = 0;        // index of the case's op it comes from (the input values depend on it)
    uint32_t seq = 0;       // Append: the sequence; Fork: the parent; Release: the sequence
    uint32_t child = 0;     // Fork: the new sequence
    uint32_t layer = 0;     // Append
    uint32_t n_new = 0;     // Append
    uint32_t pos_begin = 0; // Append: rows (seq, layer) held before the step; new rows are pos_begin .. +n_new-1
};
std::vector<Step> expand_steps(const prop::Case& c);
// Step i as manifest.json lists it (input tensors named step<i>.q, .k, .v).
nlohmann::json step_json(const Step& s, size_t i);

// The q, k, v an append step passes, exactly as kvc::prop::input_value gives them (row-major [n][H][d]).
struct StepInputs {
    std::vector<float> q, k, v;
};
StepInputs step_inputs(const prop::Case& c, const Step& s);

// The rows the step's new tokens must be stored as, in the cache dtype's bytes ([n][Hkv][d] elements of
// dtype_size), and the same values widened to float.
struct StoredRows {
    std::vector<uint8_t> k_bits, v_bits;
    std::vector<float> k, v;
};
StoredRows expected_new_rows(const prop::CaseConfig& cfg, const Step& s, const StepInputs& in);

// Allowed relative error per output row (token i, query head h) of each precision class: max(2 * error of the naive
// computation of that class, the class's floor), as kvc::prop::grade_outputs bounds them. [n_new * Hq] each.
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
// "f32" / "q-and-v-accum-in-cache-dtype" <-> kvc_precision; -1 when unknown.
const char* precision_word(uint32_t precision);
int precision_from_word(const std::string& w);

} // namespace kvc::vec
