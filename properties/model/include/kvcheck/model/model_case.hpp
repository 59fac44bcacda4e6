// A model-level case: a model description drawn from a seed inside what the implementation declares, its weights'
// seed, and the token histories the properties feed. The same seed gives the same case on every platform (own
// splitmix64 stream), so a drawn counterexample replays from the seed printed with it. A shrunk one is no longer
// what its seed draws: it replays from its JSON form (to_json, case_from_json), which holds every field, the weights
// being drawn from (description, seed, embed_rms).
#pragma once

#include "kvcheck/model_abi.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvc::model {

struct ModelCase {
    uint64_t seed = 0;
    kvcm_model_desc desc{};
    uint32_t weights_format = KVCM_WEIGHTS_SAFETENSORS; // the format the harness writes (one the target accepts)
    std::vector<int> prompt;  // sequence 0's prompt
    std::vector<int> prompt2; // a second history's prompt (sequence 1, or sequence 0 after a release)
    int n_steps = 0;          // greedy steps after the prompt (LOGITS)
    std::vector<int> chunks;  // a split of prompt into calls (CHUNK): sizes summing to prompt.size()
    std::vector<int> tail;    // fixed tokens fed one per call after prompt (CHUNK, FORK's parent, KV, RELEASE)
    std::vector<int> tail2;   // fixed tokens after prompt2, or for FORK's child after prompt
    // The small-norm regime (half the cases): every embedding row scaled to this RMS, between sqrt(eps) / 2 and
    // 2 sqrt(eps), so that layer 0's hidden states have mean(x^2) within a factor 4 of rms_eps and an engine using
    // another eps normalizes them visibly differently. 0: the embeddings as drawn.
    double embed_rms = 0;
    std::string describe() const; // seed, description, lengths, split: a counterexample's first line
};

// Draws a case inside caps: layers, heads, GQA groups (including MQA), head_dim (odd sizes without RoPE; equal to
// dim / n_heads unless KVCM_FEATURE_FREE_HEAD_DIM), hidden_dim, vocab, RoPE variant and theta (10000, 100, 500000,
// 10^6 or log-uniform; the declared fixed_rope_theta where there is one), eps (1e-6 to 0.1, or fixed_rms_eps), the
// small-norm regime, tied or separate classifier, lengths up to min(max_context, 64), a chunk
// split, fork and release histories.
ModelCase draw_case(uint64_t seed, const kvcm_caps& caps);

// The harness's own bounds, the largest values draw_case draws: a case beyond them (a replay file's) is refused.
struct CaseBounds {
    static constexpr uint32_t layers = 4, kv_heads = 3, heads = 12, head_dim = 32, hidden_dim = 96, vocab = 257,
                              context = 64, seqs = 3;
    static constexpr uint32_t dim = heads * head_dim; // FREE_HEAD_DIM draws dim up to n_heads * head_dim
};

// What makes c malformed whatever the engine, in words naming the field; "" when it is well formed. The rules every
// drawn case keeps: sizes from 1 to CaseBounds, n_heads a multiple of n_kv_heads, an even head_dim with RoPE, a
// finite theta > 0, 0 < eps < 1, an f32 cache; prompt and prompt2 of 1 to max(1, max_context / 2) tokens, prompt +
// n_steps, prompt + tail and max(prompt, prompt2) + tail2 within max_context; every token below vocab_size; chunks
// of at least one token summing to the prompt.
std::string case_error(const ModelCase& c);

// What c needs that caps do not declare, in words; "" when the engine declares all of it: each size within its
// limit, the RoPE variant, the classifier kind, head_dim != dim / n_heads only with FREE_HEAD_DIM, the weight format,
// and the theta and eps the engine fixes, if it fixes any.
std::string outside_caps(const ModelCase& c, const kvcm_caps& caps);

// The JSON form of a case: {"seed", "weights_format", "embed_rms", "desc": {every kvcm_model_desc field but
// struct_size}, "prompt", "prompt2", "n_steps", "chunks", "tail", "tail2"}; rope, tied, cache_dtype and the format in
// words. case_from_json reads exactly that back and throws std::invalid_argument naming the field for a missing or
// unknown field, a wrong type, a number out of range or a case that breaks case_error's rules.
nlohmann::json to_json(const ModelCase& c);
ModelCase case_from_json(const nlohmann::json& j);

} // namespace kvc::model
