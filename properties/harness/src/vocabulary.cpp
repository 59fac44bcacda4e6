#include "kvcheck/harness/vocabulary.hpp"

#include "kvcheck/properties/tolerance.hpp"

#include <sstream>

namespace kvc::harness {

const std::vector<Word>& dtype_words() {
    static const std::vector<Word> w = {
        {KVC_DTYPE_F32, "f32", "IEEE binary32, 4 bytes per element"},
        {KVC_DTYPE_F16, "f16", "IEEE binary16, 2 bytes per element"},
        {KVC_DTYPE_BF16, "bf16", "bfloat16 (8-bit exponent, 7-bit mantissa), 2 bytes per element"},
        {KVC_DTYPE_FP8_E4M3, "fp8_e4m3",
         "fp8 E4M3FN (max 448, saturating), 1 byte per element; code = fp8(x / scale), scale from the config"},
        {KVC_DTYPE_FP8_E5M2, "fp8_e5m2",
         "fp8 E5M2 (max 57344, saturating), 1 byte per element; code = fp8(x / scale), scale from the config"},
        {KVC_DTYPE_INT8_TOKEN, "int8_token",
         "int8 symmetric per token and KV head: 1 byte per element plus one f32 (or f16) scale absmax/127 per head row"},
        {KVC_DTYPE_Q8_0, "q8_0",
         "llama.cpp block_q8_0 along each head: 32 int8 codes and one f16 scale per block (head_dim % 32 == 0)"},
    };
    return w;
}

const std::vector<Word>& quant_words() {
    static const std::vector<Word> w = {
        {KVC_QUANT_FP8_SCALE_TENSOR, "fp8_scale_tensor",
         "fp8 with one k and one v scale per layer (kv_scale_mode tensor; mode none is implied by an fp8 dtype)"},
        {KVC_QUANT_FP8_SCALE_KV_HEAD, "fp8_scale_kv_head", "fp8 with one k and one v scale per layer and KV head"},
        {KVC_QUANT_INT8_SCALE_F16, "int8_scale_f16",
         "int8_token keeping its row scales in f16 (f32 is implied by the dtype)"},
    };
    return w;
}

const std::vector<Word>& scale_mode_words() {
    static const std::vector<Word> w = {
        {KVC_SCALE_NONE, "none", "fp8 without scales: code = fp8(x)"},
        {KVC_SCALE_TENSOR, "tensor", "k_scales, v_scales [n_layers]"},
        {KVC_SCALE_KV_HEAD, "kv_head", "k_scales, v_scales [n_layers][n_kv_heads]"},
    };
    return w;
}

const std::vector<Word>& rope_words() {
    static const std::vector<Word> w = {
        {KVC_ROPE_NONE, "none", "no rotary embedding: K is cached as given (always supported)"},
        {KVC_ROPE_NEOX, "neox", "the implementation rotates pairs (i, i + d/2) by the token's position"},
        {KVC_ROPE_GPTJ, "gptj", "the implementation rotates interleaved pairs (2i, 2i + 1) by the token's position"},
    };
    return w;
}

const std::vector<Word>& feature_words() {
    static const std::vector<Word> w = {
        {KVC_FEATURE_GQA, "gqa", "fewer KV heads than query heads (GQA and MQA)"},
        {KVC_FEATURE_PAGED, "paged", "storage in fixed-size blocks of kvc_memory.block_size tokens"},
        {KVC_FEATURE_FORK, "fork", "fork(): a child sequence shares its parent's rows"},
        {KVC_FEATURE_RELEASE, "release", "release(): a sequence is emptied and its storage reused"},
        {KVC_FEATURE_BATCH, "batch", "append_attend_batch(): several sequences of one layer in one call"},
        {KVC_FEATURE_CHUNKED, "chunked", "several new tokens onto a sequence that already holds tokens"},
        {KVC_FEATURE_WINDOW, "window", "a sliding window per layer: a query sees only the last W keys (and the sinks)"},
        {KVC_FEATURE_SINKS, "sinks", "attention sinks: the first S tokens stay visible in windowed layers"},
        {KVC_FEATURE_EVICT, "evict", "rows no later query can see are dropped and their memory freed or reused"},
        {KVC_FEATURE_HEAD_DIM_V, "head_dim_v",
         "V and output rows of their own size (config.head_dim_v, up to max_head_dim_v): latent attention (MLA)"},
        {KVC_FEATURE_ROPE_RANGE, "rope_range",
         "RoPE on a range of the head dims (rope_dim_begin, rope_dims): partial rotary, MLA's RoPE part"},
        {KVC_FEATURE_FORK_SHARES, "fork_shares",
         "fork shares every full block (counted once); only the partly filled last block of a stream is copied"},
    };
    return w;
}

const std::vector<Word>& precision_words() {
    static const std::vector<Word> w = {
        {KVC_PRECISION_F32, "f32", "q as given, K/V widened from the cache dtype, scores/softmax/accumulation in f32"},
        {KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE, "q_and_v_accum_in_cache_dtype",
         "q rounded to the cache dtype and V accumulated in it (16-bit caches); graded against that class"},
    };
    return w;
}

const std::vector<Word>& memory_space_words() {
    static const std::vector<Word> w = {
        {KVC_MEMORY_HOST, "host", "the cache lives in host memory (NO-Q watches the heap)"},
        {KVC_MEMORY_DEVICE, "device", "the cache lives in device memory (NO-Q and MEMORY watch device memory through the CUDA runtime)"},
    };
    return w;
}

std::string word_for(const std::vector<Word>& words, uint32_t value) {
    for (const Word& w : words)
        if (w.value == value) return w.name;
    return "unknown(" + std::to_string(value) + ")";
}

namespace {

std::vector<std::string> bits_to_words(const std::vector<Word>& words, uint32_t mask, bool value_is_bit) {
    std::vector<std::string> out;
    for (const Word& w : words) {
        const uint32_t bit = value_is_bit ? w.value : (1u << w.value);
        if (mask & bit) out.push_back(w.name);
    }
    return out;
}

std::string join(const std::vector<std::string>& v) {
    if (v.empty()) return "(none)";
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
    return s;
}

// A declared limit: 0 means "no limit", written as null.
nlohmann::json limit(uint32_t n) { return n == 0 ? nlohmann::json(nullptr) : nlohmann::json(n); }

// " name=value" for every limit that is set, or " none"; then the end of the line.
void write_limits(std::ostringstream& s, const nlohmann::json& limits) {
    bool any = false;
    for (const auto& [k, v] : limits.items())
        if (!v.is_null()) {
            s << " " << k << "=" << v.get<uint32_t>();
            any = true;
        }
    if (!any) s << " none";
    s << "\n";
}

// "fixed by ... (every case drawn with it): rope_theta 10000, ..." for the values that are set, or "".
std::string fixed_line(const nlohmann::json& fixed, const std::string& indent, const char* by) {
    std::string list;
    for (const auto& [k, v] : fixed.items())
        if (!v.is_null()) list += (list.empty() ? " " : ", ") + k + " " + (v.is_string() ? v.get<std::string>() : v.dump());
    return list.empty() ? "" : indent + "fixed by the " + by + " (every case drawn with it):" + list + "\n";
}

} // namespace

namespace {

nlohmann::json caps_json(const kvc_caps& caps) {
    std::vector<std::string> ropes = {"none"}; // implied
    for (const std::string& r : bits_to_words(rope_words(), caps.rope_variants, false))
        if (r != "none") ropes.push_back(r);
    return {{"dtypes", bits_to_words(dtype_words(), caps.dtypes, false)},
            {"rope_variants", ropes},
            {"features", bits_to_words(feature_words(), caps.features, true)},
            {"quant", bits_to_words(quant_words(), caps.quant, true)},
            {"precision", word_for(precision_words(), caps.precision)},
            {"memory_space", word_for(memory_space_words(), caps.memory_space)},
            {"limits",
             {{"max_layers", limit(caps.max_layers)},
              {"max_q_heads", limit(caps.max_q_heads)},
              {"max_kv_heads", limit(caps.max_kv_heads)},
              {"max_head_dim", limit(caps.max_head_dim)},
              {"max_seqs", limit(caps.max_seqs)},
              {"max_tokens", limit(caps.max_tokens)},
              {"max_window", limit(caps.max_window)},
              {"max_sinks", limit(caps.max_sinks)},
              {"head_dim_multiple", caps.head_dim_multiple > 1 ? nlohmann::json(caps.head_dim_multiple) : nullptr},
              {"head_dim_multiple_rope",
               caps.head_dim_multiple_rope > 1 ? nlohmann::json(caps.head_dim_multiple_rope) : nullptr}}},
            {"pipeline", prop::to_json(prop::declared_pipeline(caps))},
            {"pipeline_name", prop::pipeline_name(prop::declared_pipeline(caps))},
            // what the implementation hard-codes: every case was drawn with it
            {"fixed",
             {{"rope_theta", caps.fixed_rope_theta > 0 ? nlohmann::json(caps.fixed_rope_theta) : nullptr},
              {"softmax_scale",
               caps.fixed_scale == KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM ? nlohmann::json("1/sqrt(head_dim)") : nullptr}}}};
}

} // namespace

nlohmann::json caps_to_json(const kvc_caps& caps) {
    nlohmann::json j = caps_json(caps);
    // only where declared: every other implementation's caps read as they always did
    if (caps.features & KVC_FEATURE_HEAD_DIM_V) j["limits"]["max_head_dim_v"] = limit(caps.max_head_dim_v);
    // ABI 1.3, only where declared: the pipelines that replace "pipeline" for some dtypes and call shapes
    if (!prop::pipeline_rules(caps).empty()) j["pipeline_rules"] = prop::rules_to_json(caps);
    return j;
}


std::string caps_to_text(const kvc_caps& caps, const std::string& indent) {
    const nlohmann::json j = caps_to_json(caps);
    std::ostringstream s;
    s << indent << "dtypes: " << join(j["dtypes"].get<std::vector<std::string>>())
      << "; rope: " << join(j["rope_variants"].get<std::vector<std::string>>())
      << "; features: " << join(j["features"].get<std::vector<std::string>>()) << "\n";
    if (caps.dtypes >> KVC_DTYPE_FP8_E4M3) // a quantized dtype: its scale forms
        s << indent << "quantized scale forms: " << join(j["quant"].get<std::vector<std::string>>()) << "\n";
    s << indent << "precision pipeline: " << j["pipeline_name"].get<std::string>()
      << "; memory space: " << j["memory_space"].get<std::string>() << "; limits:";
    write_limits(s, j["limits"]);
    const std::vector<kvc_pipeline_rule> rules = prop::pipeline_rules(caps);
    for (size_t i = 0; i < rules.size(); ++i) // the first rule covering a call grades it, else the pipeline above
        s << indent << prop::graded_by_name(caps, static_cast<int>(i)) << ": "
          << prop::pipeline_name(prop::pipeline_of(rules[i].pipeline)) << "\n";
    s << fixed_line(j["fixed"], indent, "implementation");
    return s.str();
}

const std::vector<Word>& model_feature_words() {
    static const std::vector<Word> w = {
        {KVCM_FEATURE_ALL_LOGITS, "all_logits", "forward writes one logit row per token, not only the last"},
        {KVCM_FEATURE_PROMPT, "prompt", "several tokens in one call onto an empty sequence"},
        {KVCM_FEATURE_CHUNKED, "chunked", "several tokens in one call onto a sequence that holds tokens"},
        {KVCM_FEATURE_FORK, "fork", "fork(): a child sequence continues from its parent's tokens"},
        {KVCM_FEATURE_RELEASE, "release", "release(): a sequence restarts empty"},
        {KVCM_FEATURE_READ_KV, "read_kv", "read_kv(): the cache of each layer can be read back"},
        {KVCM_FEATURE_TIED, "tied", "a classifier tied to the embedding"},
        {KVCM_FEATURE_UNTIED, "untied", "a separate classifier (lm_head)"},
        {KVCM_FEATURE_FREE_HEAD_DIM, "free_head_dim", "head_dim need not equal dim / n_heads"},
        {KVCM_FEATURE_KV_PROJECTIONS, "kv_projections", "kv_projections(): the engine counts its K/V projections"},
    };
    return w;
}

const std::vector<Word>& weight_format_words() {
    static const std::vector<Word> w = {
        {KVCM_WEIGHTS_SAFETENSORS, "safetensors", "F32 tensors with the Llama names (docs/model-level.md)"},
        {KVCM_WEIGHTS_FLAT_F32, "flat_f32", "a flat f32 checkpoint behind a 7-int32 header"},
    };
    return w;
}

nlohmann::json model_caps_to_json(const kvcm_caps& caps) {
    return {{"features", bits_to_words(model_feature_words(), caps.features, true)},
            {"weight_formats", bits_to_words(weight_format_words(), caps.weight_formats, false)},
            {"cache_dtypes", bits_to_words(dtype_words(), caps.cache_dtypes, false)},
            {"rope_variants", bits_to_words(rope_words(), caps.rope_variants, false)},
            {"limits",
             {{"max_context", limit(caps.max_context)},
              {"max_seqs", limit(caps.max_seqs)},
              {"max_layers", limit(caps.max_layers)},
              {"max_heads", limit(caps.max_heads)},
              {"max_kv_heads", limit(caps.max_kv_heads)},
              {"max_head_dim", limit(caps.max_head_dim)},
              {"max_dim", limit(caps.max_dim)},
              {"max_hidden_dim", limit(caps.max_hidden_dim)},
              {"max_vocab", limit(caps.max_vocab)}}},
            // the parameters the engine hard-codes (model ABI 1.1): every case was drawn with these values
            {"fixed",
             {{"rope_theta", caps.fixed_rope_theta > 0 ? nlohmann::json(caps.fixed_rope_theta) : nullptr},
              {"rms_eps", caps.fixed_rms_eps > 0 ? nlohmann::json(caps.fixed_rms_eps) : nullptr}}}};
}

std::string model_caps_to_text(const kvcm_caps& caps, const std::string& indent) {
    const nlohmann::json j = model_caps_to_json(caps);
    std::ostringstream s;
    s << indent << "model features: " << join(j["features"].get<std::vector<std::string>>())
      << "; weights: " << join(j["weight_formats"].get<std::vector<std::string>>())
      << "; cache dtypes: " << join(j["cache_dtypes"].get<std::vector<std::string>>())
      << "; rope: " << join(j["rope_variants"].get<std::vector<std::string>>()) << "\n";
    s << indent << "model limits:";
    write_limits(s, j["limits"]);
    s << fixed_line(j["fixed"], indent, "engine");
    return s.str();
}

} // namespace kvc::harness
