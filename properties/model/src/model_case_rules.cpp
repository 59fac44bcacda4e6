// The rules a model-level case keeps, whoever made it: draw_case, shrinking, or a replay file. case_error is about the
// case alone (what the properties and the reference need); outside_caps about one engine's declaration.
#include "kvcheck/model/model_case.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace kvc::model {
namespace {

std::string range_error(const char* field, uint64_t v, uint64_t lo, uint64_t hi) {
    if (v >= lo && v <= hi) return "";
    return std::string(field) + " is " + std::to_string(v) + ", expected " + std::to_string(lo) + " to " +
           std::to_string(hi);
}

// A limit of the caps: 0 is none.
bool within(uint32_t v, uint32_t limit) { return limit == 0 || v <= limit; }

} // namespace

std::string case_error(const ModelCase& c) {
    using B = CaseBounds;
    const kvcm_model_desc& d = c.desc;
    if (d.struct_size != sizeof(kvcm_model_desc)) return "desc.struct_size is not sizeof(kvcm_model_desc)";
    for (const std::string& e :
         {range_error("n_layers", d.n_layers, 1, B::layers), range_error("n_kv_heads", d.n_kv_heads, 1, B::kv_heads),
          range_error("n_heads", d.n_heads, 1, B::heads), range_error("head_dim", d.head_dim, 1, B::head_dim),
          range_error("dim", d.dim, 1, B::dim), range_error("hidden_dim", d.hidden_dim, 1, B::hidden_dim),
          range_error("vocab_size", d.vocab_size, 1, B::vocab), range_error("rope", d.rope, 0, 2),
          range_error("tied", d.tied, 0, 1), range_error("max_context", d.max_context, 1, B::context),
          range_error("max_seqs", d.max_seqs, 1, B::seqs),
          range_error("weights_format", c.weights_format, KVCM_WEIGHTS_SAFETENSORS, KVCM_WEIGHTS_FLAT_F32)})
        if (!e.empty()) return e;
    if (d.n_heads % d.n_kv_heads != 0)
        return "n_heads " + std::to_string(d.n_heads) + " is not a multiple of n_kv_heads " +
               std::to_string(d.n_kv_heads);
    if (d.rope != KVC_ROPE_NONE && d.head_dim % 2 != 0)
        return "head_dim " + std::to_string(d.head_dim) + " is odd, and RoPE turns pairs";
    if (!(std::isfinite(d.rope_theta) && d.rope_theta > 0)) return "rope_theta is not a finite number above 0";
    if (!(std::isfinite(d.rms_eps) && d.rms_eps > 0 && d.rms_eps < 1)) return "rms_eps is not between 0 and 1";
    if (!(std::isfinite(c.embed_rms) && c.embed_rms >= 0 && c.embed_rms < 2))
        return "embed_rms is not from 0 (the embeddings as drawn) to 2 (2 sqrt(eps), eps below 1)";
    if (d.cache_dtype != KVC_DTYPE_F32) return "cache_dtype is not f32 (the properties run f32 caches)";

    // the histories, as draw_case makes them: every one fits max_context
    const size_t ctx = d.max_context, half = std::max<size_t>(1, ctx / 2);
    const size_t p = c.prompt.size(), p2 = c.prompt2.size();
    if (p < 1 || p > half) return "prompt has " + std::to_string(p) + " tokens, expected 1 to " + std::to_string(half);
    if (p2 < 1 || p2 > half)
        return "prompt2 has " + std::to_string(p2) + " tokens, expected 1 to " + std::to_string(half);
    if (c.n_steps < 0 || static_cast<size_t>(c.n_steps) > ctx - p)
        return "n_steps is " + std::to_string(c.n_steps) + ", expected 0 to max_context - prompt = " +
               std::to_string(ctx - p);
    if (c.tail.size() > ctx - p)
        return "tail has " + std::to_string(c.tail.size()) + " tokens, more than max_context - prompt = " +
               std::to_string(ctx - p);
    if (c.tail2.size() > ctx - std::max(p, p2))
        return "tail2 has " + std::to_string(c.tail2.size()) + " tokens, more than max_context - the longer prompt = " +
               std::to_string(ctx - std::max(p, p2));
    for (const auto& [name, list] : {std::pair<const char*, const std::vector<int>*>{"prompt", &c.prompt},
                                     {"prompt2", &c.prompt2}, {"tail", &c.tail}, {"tail2", &c.tail2}})
        for (size_t i = 0; i < list->size(); ++i)
            if ((*list)[i] < 0 || static_cast<uint32_t>((*list)[i]) >= d.vocab_size)
                return std::string(name) + "[" + std::to_string(i) + "] is token " + std::to_string((*list)[i]) +
                       ", not below vocab_size " + std::to_string(d.vocab_size);
    size_t sum = 0;
    for (int n : c.chunks) {
        if (n < 1) return "a chunk of " + std::to_string(n) + " tokens (each call feeds at least one)";
        sum += static_cast<size_t>(n);
    }
    if (sum != p) return "chunks sum to " + std::to_string(sum) + " tokens, the prompt has " + std::to_string(p);
    return "";
}

std::string outside_caps(const ModelCase& c, const kvcm_caps& caps) {
    const kvcm_model_desc& d = c.desc;
    struct Limit {
        const char* name;
        uint32_t value, limit;
    };
    for (const Limit& l :
         {Limit{"max_context", d.max_context, caps.max_context}, Limit{"max_seqs", d.max_seqs, caps.max_seqs},
          Limit{"n_layers", d.n_layers, caps.max_layers}, Limit{"n_heads", d.n_heads, caps.max_heads},
          Limit{"n_kv_heads", d.n_kv_heads, caps.max_kv_heads}, Limit{"head_dim", d.head_dim, caps.max_head_dim},
          Limit{"dim", d.dim, caps.max_dim}, Limit{"hidden_dim", d.hidden_dim, caps.max_hidden_dim},
          Limit{"vocab_size", d.vocab_size, caps.max_vocab}})
        if (!within(l.value, l.limit))
            return std::string(l.name) + " " + std::to_string(l.value) + " is beyond the declared limit " +
                   std::to_string(l.limit);
    static const char* ropes[] = {"none", "neox", "gptj"};
    if (d.rope > 2 || !(caps.rope_variants & (1u << d.rope)))
        return std::string("RoPE variant ") + (d.rope <= 2 ? ropes[d.rope] : "?") + " is not declared";
    if (d.tied && !(caps.features & KVCM_FEATURE_TIED)) return "a tied classifier is not declared (KVCM_FEATURE_TIED)";
    if (!d.tied && !(caps.features & KVCM_FEATURE_UNTIED))
        return "a separate classifier is not declared (KVCM_FEATURE_UNTIED)";
    if (d.dim != d.n_heads * d.head_dim && !(caps.features & KVCM_FEATURE_FREE_HEAD_DIM))
        return "head_dim " + std::to_string(d.head_dim) + " is not dim / n_heads, and KVCM_FEATURE_FREE_HEAD_DIM is "
                                                          "not declared";
    if (c.weights_format > KVCM_WEIGHTS_FLAT_F32 || !(caps.weight_formats & (1u << c.weights_format)))
        return std::string("weights in the ") +
               (c.weights_format == KVCM_WEIGHTS_SAFETENSORS ? "safetensors"
                : c.weights_format == KVCM_WEIGHTS_FLAT_F32  ? "flat f32"
                                                             : "unknown") +
               " format are not accepted";
    if (!(caps.cache_dtypes & (1u << KVC_DTYPE_F32))) return "an f32 cache is not declared";
    const bool v11 = caps.struct_size > KVCM_CAPS_SIZE_1_0;
    if (v11 && caps.fixed_rope_theta > 0 && d.rope_theta != caps.fixed_rope_theta)
        return "rope_theta " + std::to_string(d.rope_theta) + " is not the engine's fixed " +
               std::to_string(caps.fixed_rope_theta);
    if (v11 && caps.fixed_rms_eps > 0 && d.rms_eps != caps.fixed_rms_eps)
        return "rms_eps " + std::to_string(d.rms_eps) + " is not the engine's fixed " +
               std::to_string(caps.fixed_rms_eps);
    return "";
}

} // namespace kvc::model
