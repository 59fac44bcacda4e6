// The reference's model run with the KV cache: the same ModelConfig and weights as kvc::ref (cast to float), but
// each forward pass projects K and V only for the tokens it adds and attends through the CPU engine, which holds
// every earlier token's K and V. Prefill is one pass over the prompt; each decode step is one pass over one token.
//
// It counts K/V projections the way the documents do: a token's K and V are projected once, when it is appended.
// Greedy generation of n tokens after a p-token prompt therefore projects p + n (the reference projects
// p + (p+1) + ... + (p+n-1), recomputing the whole prefix at every step).
#pragma once

#include "kvcheck/abi.hpp"
#include "kvcheck/reference/model.hpp"

#include <cstdint>
#include <vector>

namespace kvc::opt {

struct ModelEngineOptions {
    uint32_t cache_dtype = KVC_DTYPE_F32;
    uint32_t block_size = 16;
    uint32_t max_tokens = 0; // per sequence; 0: no limit
    uint32_t max_seqs = 1;
};

class ModelEngine {
public:
    // Throws kvc::ref::ConfigError for a config or weights the reference would refuse, kvc::AbiError when the cache
    // refuses the shape.
    ModelEngine(const ref::ModelConfig& cfg, const ref::Weights<double>& weights, const ModelEngineOptions& opt = {});

    // Runs tokens at the end of sequence seq through every layer, appending their K and V; returns the logits of
    // the last one ([vocab]). A prompt (empty sequence), a decode step (one token) or a chunk: one code path.
    std::vector<float> forward(uint32_t seq, const std::vector<int>& tokens);

    struct Generation {
        std::vector<int> tokens;                 // prompt followed by the generated tokens
        std::vector<std::vector<float>> logits;  // [n_steps] the logits each generated token was chosen from
        long kv_projections = 0;                 // tokens whose K and V were projected (per layer)
    };
    // Greedy: prefill the prompt, then n_steps steps, each the argmax (first maximum on ties) of the last logits.
    // Every generated token is appended, the last one too, so the cache is ready for the next turn: a 2-token
    // prompt and 99 steps project 2 + 99 = 101 tokens.
    Generation generate(const std::vector<int>& prompt, int n_steps, uint32_t seq = 0);

    long kv_projections() const { return kv_projections_; }
    void release(uint32_t seq) { cache_.release(seq); }
    kvc_memory memory() { return cache_.memory(); }

private:
    ref::ModelConfig cfg_;
    ref::Weights<float> w_;
    Cache cache_;
    long kv_projections_ = 0;
};

} // namespace kvc::opt
