// The capability vocabulary of the ABI in words: what `kvcheck list` prints and how reports decode a kvc_caps.
// The words are the ones the properties library uses when it says what a case needs ("dtype f16", "gqa", ...).
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/model_abi.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvc::harness {

struct Word {
    uint32_t value;      // the enum value (dtypes, rope, precision, memory) or the KVC_FEATURE_* bit (features)
    std::string name;    // the word
    std::string meaning; // one line
};

const std::vector<Word>& dtype_words();        // f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8_token, q8_0
const std::vector<Word>& quant_words();        // KVC_QUANT_* bits: fp8_scale_tensor, fp8_scale_kv_head, ...
const std::vector<Word>& scale_mode_words();   // kvc_scale_mode: none, tensor, kv_head
const std::vector<Word>& rope_words();         // none, neox, gptj
const std::vector<Word>& feature_words();      // gqa, paged, fork, release, batch, chunked
const std::vector<Word>& precision_words();    // f32, q_and_v_accum_in_cache_dtype
const std::vector<Word>& memory_space_words(); // host, device

// The name of `value` in `words`, or "unknown(N)".
std::string word_for(const std::vector<Word>& words, uint32_t value);

// Declared capabilities decoded to words: dtypes, rope_variants, features, quant, precision, memory_space, limits.
nlohmann::json caps_to_json(const kvc_caps& caps);
// The same on a few readable lines, each starting with `indent`.
std::string caps_to_text(const kvc_caps& caps, const std::string& indent);

// The model level's words: KVCM_FEATURE_* bits and weight formats, and a kvcm_caps decoded with them (the dtypes and
// RoPE variants are the operation level's words).
const std::vector<Word>& model_feature_words(); // all_logits, prompt, chunked, fork, release, read_kv, ...
const std::vector<Word>& weight_format_words(); // safetensors, flat_f32
nlohmann::json model_caps_to_json(const kvcm_caps& caps);
std::string model_caps_to_text(const kvcm_caps& caps, const std::string& indent);

} // namespace kvc::harness
