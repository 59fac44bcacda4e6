// What `kvcheck export` and `kvcheck grade` share: how a conformance case becomes a list of steps (one call each: one
// (sequence, layer), or one layer of a batch of sequences), the inputs of a step, the rows a cache must store, the
// per-row tolerance bounds and the live-byte formula. docs/vectors.md describes the files built from these.
// What is not about files (the steps, their inputs, the rows a cache must store, live bytes) is the properties
// library's cache model, shared with the plugin harness.
#pragma once

#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/vectors/safetensors.hpp"

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

// The steps, inputs, stored rows and live bytes of a case are the properties library's cache model
// (kvcheck/properties/cache_model.hpp), the same the plugin harness keeps.
using prop::AppendInputs;
using prop::expand_steps;
using prop::expected_new_rows;
using prop::live_bytes;
using prop::Slice;
using prop::Step;
using prop::step_inputs;
using prop::step_kind_name;
using prop::StepKind;
using prop::StoredRows;

// Step i as manifest.json lists it (input tensors named step<i>.q, .k, .v; the dumps it asks for, and for a
// quantized cache the names of their scales).
nlohmann::json step_json(const Step& s, size_t i, bool quantized = false);
// The names of the K and V dumps of one slice of append step i: "step<i>.k" for an append, "step<i>.s<seq>.k" in a
// batch.
std::string dump_name(const Step& s, size_t i, const Slice& sl, const char* kv);
// The tensor holding the scales of a quantized dump: "<dump>.scales" ("step3.k.scales", "final.s0.l1.v.scales").
std::string scales_name(const std::string& dump);
// A dump's names as the manifest lists them: {"k", "v"}, and {"k_scales", "v_scales"} for a quantized cache.
nlohmann::json dump_names_json(const std::string& k, const std::string& v, bool quantized);

// Allowed relative error per output row (token i, query head h) of each preset precision class, the tightest
// element's bound of the row (kvc::prop::allowed_errors). [n_new * Hq] each.
struct RowBounds {
    std::vector<double> f32, cache_dtype;
};
RowBounds row_bounds(const prop::CaseConfig& cfg, const prop::Expected& e);

// The safetensors dtype of a cache dtype's rows: F32, F16, BF16; a quantized dtype's codes F8_E4M3, F8_E5M2, or I8
// (int8_token and q8_0, two's complement).
st::DType cache_st_dtype(uint32_t cache_dtype);
// A quantized cache's scales as files hold them (read_kv_scales' bytes): the dtype (F32 for fp8 and f32 int8
// scales, F16 for f16 int8 scales and q8_0 blocks) and the shape of `rows` rows of one (seq, layer): [rows,
// n_kv_heads], or [rows, n_kv_heads, head_dim / 32] for q8_0.
st::DType scales_st_dtype(const prop::CaseConfig& cfg);
std::vector<uint64_t> scales_shape(const prop::CaseConfig& cfg, uint64_t rows);
// What a quantized case's files need beyond the 16-bit config (docs/vectors.md): the codes' and scales' dtypes,
// scales per head row, and the fp8 scales (kv_scale_mode, k_scales, v_scales, their bit patterns) or the int8
// scale dtype. Empty object for a 16-bit dtype.
nlohmann::json quant_config_json(const prop::CaseConfig& cfg);

// "0x3e800000"
std::string float_bits(float x);
// A case's file stem: "CACHE-CONTENT/3" -> "CACHE-CONTENT_3".
std::string case_stem(const std::string& id);
// Capabilities a case needs, in the words of a caps file ("dtype f16", "rope neox", "gqa", "chunked", "fork",
// "release", "batch", "window", "sinks", "head_dim_v", "rope_range").
std::vector<std::string> required_words(const prop::Case& c);
// The config as the manifest writes it (exact scalars also as bit patterns; a quantized dtype's fields of
// quant_config_json besides; "windows", "sinks", "evict", "head_dim_v", "rope_dim_begin", "rope_dims" only where
// the case has them).
nlohmann::json config_json(const prop::CaseConfig& cfg);

} // namespace kvc::vec
