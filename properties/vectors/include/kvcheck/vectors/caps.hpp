// What a vectors user declares once: the capabilities of the implementation (dtypes, RoPE variants, features, size
// limits, head_dim granularity) and its rounding pipeline. `kvcheck export --caps FILE` exports only the cases
// inside them; `kvcheck grade` reads the same declaration from the results manifest. docs/vectors.md gives the
// format.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/tolerance.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kvc::vec {

struct Declared {
    kvc_caps caps{};            // dtypes, quant, rope_variants, features, limits, head_dim multiples, pipeline
    prop::Pipeline pipeline;    // the declared rounding pipeline
    bool has_pipeline = false;  // "pipeline" or "precision" was given
    std::string pipeline_text;  // as reports name it ("f32", a preset, or the stages)
};

// Reads a declaration: "capabilities" (words: "dtype f32|f16|bf16|fp8_e4m3|fp8_e5m2|int8_token|q8_0", "fp8 scale
// per tensor", "fp8 scale per kv head", "int8 scale in f16", "rope neox|gptj", "gqa", "chunked", "fork", "release",
// "batch", "paged", "window", "sinks", "head_dim_v", "rope_range"; "evict" is refused by name, since a dump cannot
// say which rows were dropped), optional "limits" ({"max_layers", "max_q_heads", "max_kv_heads", "max_head_dim",
// "max_seqs", "max_tokens", "head_dim_multiple", "head_dim_multiple_rope", "max_window", "max_sinks",
// "max_head_dim_v"}: non-negative integers or null; 0 or null = no limit), optional "fixed" ({"rope_theta": a
// number, "softmax_scale": "1/sqrt(head_dim)"}, each or null: what the implementation hard-codes, so every case is
// drawn with it), and the pipeline: "pipeline" (a preset name or an object of stages, prop::pipeline_from_json) or
// the 1.0 word "precision", with optional "pipeline_rules" (ABI 1.3: [{"dtypes": [...], "min_new": n, "pipeline":
// ...}], into caps.pipeline_rules, refused as a plugin's table would be). Besides these only "about" (free text) and the results manifest's own fields
// ("kvcheck_results", "implementation", "version", so that a results manifest serves as a caps file) are accepted:
// another field is refused, since a misspelt one ("pipelines") would otherwise leave its declaration unread. Throws
// std::invalid_argument naming the field and the problem.
Declared declared_from_json(const nlohmann::json& j, bool need_pipeline);
// The declaration as the vectors manifest echoes it (max_window, max_sinks, max_head_dim_v and "fixed" only when set).
nlohmann::json declared_to_json(const Declared& d);

// Why case c lies outside caps, in words ("dtype bf16", "fork", "head_dim 72 not a multiple of 16 (rope)",
// "layers 3 > 2"); empty when the case is inside.
std::vector<std::string> unsupported(const prop::Case& c, const kvc_caps& caps);

// Where the declaration b, named b_name, declares less than a, named a_name: a capability of a that b lacks, a
// size limit of b below a's, a head_dim multiple of b that a's does not guarantee, a value b hard-codes that a's
// cases were not drawn with ("\"batch\": declared by the export, not by the results", "max_head_dim: 256 in the
// export, 128 in the results", "fixed rope_theta: none in the export, 10000 in the results"); empty when b declares at least
// what a does. The pipeline is compared apart (same_pipeline).
std::vector<std::string> narrower_declaration(const Declared& a, const std::string& a_name, const Declared& b,
                                              const std::string& b_name);
// Whether a and b declare the same rounding pipeline (both none counts as the same).
bool same_pipeline(const Declared& a, const Declared& b);

// The capability words caps declares, in the vocabulary of declared_from_json.
std::vector<std::string> capability_words(const kvc_caps& caps);

} // namespace kvc::vec
