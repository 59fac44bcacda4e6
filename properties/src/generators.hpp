// Structured generators for conformance cases: draw the config, then the fields that depend on it. Biased to the
// boundaries real caches get wrong: lengths at 0 and +-1 modulo the block size (the hinted one and the common
// sizes 16 .. 256 an implementation may pick itself), block size 1 and primes, one token, empty appends,
// non-power-of-two GQA groups, head_dim up to 256, sequence ids across max_seqs, softmax scales and RoPE bases
// other than 1/sqrt(d) and 10000. Every generator is named with .as() so a counterexample reads well.
#pragma once

#include "kvcheck/properties/case.hpp"

#include <rapidcheck.h>

namespace kvc::prop::gens {

// What a config generator may draw.
struct ConfigSpace {
    kvc_caps allow{};          // dtypes, rope variants and features that may appear; limits and head_dim multiples
    bool force_gqa = false;    // n_kv_heads < n_q_heads
    uint32_t min_layers = 1;
    uint32_t max_layers = 3;
    bool large_queries = false; // n_q_heads * head_dim large enough that caching Q shows above the heap slack
    bool long_cases = false;    // small heads, max_tokens up to 8k+ (LONG)
    uint32_t max_tokens = 300;  // per sequence (within the declared limit): 256 +- 1 reachable
    bool large_scores = false;  // some cases in the large-score regime (CaseConfig::score_scale), drawn last
};

rc::Gen<CaseConfig> config(const ConfigSpace& space);

// What a script generator may do.
struct ScriptSpace {
    uint32_t n_seqs = 2;        // sequences used at the start (ids anywhere below max_seqs; fork children too)
    uint32_t min_ops = 1, max_ops = 10;
    bool chunked = true;        // n_new > 1 onto a non-empty sequence
    bool fork = false, release = false, batch = false;
    bool shuffle_layers = false;
    uint32_t min_total_tokens = 0; // per case, e.g. for NO-Q
    uint32_t min_forks = 0;        // forks every case makes (where max_seqs leaves room), each followed by appends
                                   // to the child and to the parent
    uint32_t min_releases = 0;     // releases every case makes, each followed by an append to the released sequence
    bool stale_fill = false;       // before every release, append extreme rows (SeqAppend::extreme) up to a block
                                   // boundary, so stale tail slots read later change outputs
    bool release_shared = false;   // at the end: a prompt of several blocks, a fork of it, the release of one side
                                   // while the other still shares its blocks, a restart of the released side long
                                   // enough to take back every block it freed, then an append to the survivor
                                   // (needs fork and release; empties sequences by releases where none is free)
    bool long_script = false;      // LONG: prompts of 2^k, 2^k+-1 and 1k-8k tokens, chunks of 63/64/65 new tokens
                                   // over 511/512/513 cached, decodes past them
};

rc::Gen<Case> case_for(const ConfigSpace& cs, const ScriptSpace& ss);

} // namespace kvc::prop::gens
