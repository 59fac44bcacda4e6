// Structured generators for conformance cases: draw the config, then the fields that depend on it. Biased to the
// boundaries real caches get wrong: lengths at 0 and +-1 modulo the block size, block size 1 and primes, one token,
// empty appends, non-power-of-two GQA groups. Every generator is named with .as() so a counterexample reads well.
#pragma once

#include "kvcheck/properties/case.hpp"

#include <rapidcheck.h>

namespace kvc::prop::gens {

// What a config generator may draw.
struct ConfigSpace {
    kvc_caps allow{};          // dtypes, rope variants and features that may appear
    bool force_gqa = false;    // n_kv_heads < n_q_heads
    uint32_t min_layers = 1;
    uint32_t max_layers = 3;
    bool large_queries = false; // n_q_heads * head_dim large enough that caching Q shows above the heap slack
};

rc::Gen<CaseConfig> config(const ConfigSpace& space);

// What a script generator may do.
struct ScriptSpace {
    uint32_t n_seqs = 2;        // sequences used (ids 0 .. n_seqs-1; fork children above)
    uint32_t min_ops = 1, max_ops = 10;
    bool chunked = true;        // n_new > 1 onto a non-empty sequence
    bool fork = false, release = false, batch = false;
    bool shuffle_layers = false;
    uint32_t min_total_tokens = 0; // per case, e.g. for NO-Q
};

rc::Gen<Case> case_for(const ConfigSpace& cs, const ScriptSpace& ss);

} // namespace kvc::prop::gens
