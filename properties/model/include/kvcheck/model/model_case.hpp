// A model-level case: a model description drawn from a seed inside what the implementation declares, its weights'
// seed, and the token histories the properties feed. The same seed gives the same case on every platform (own
// splitmix64 stream), so a counterexample replays from the seed printed with it.
#pragma once

#include "kvcheck/model_abi.h"

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

} // namespace kvc::model
