// 002_*.txt: the 2-d toy ("I love" -> next token) through attend_head, and the K/V projection counts of
// "2 + 3 + … + 100 = 5,049" vs "2 + 1 + 1 + … + 1 = 101" through generate() on a small seeded model.
#include "quantities.hpp"

#include "kvcheck/reference/model.hpp"

#include <cmath>

namespace kvc::golden {
namespace {

using LD = long double;
using ref::Mat;

void add_attention(Quantities& q) {
    Mat<LD> query(1, 2), keys(2, 2), values(2, 2);
    query << 1, 2;        // Q
    keys << 1, 0, 0, 1;   // K_I, K_love
    values << 2, 0, 0, 3; // V_I, V_love
    q.scalar("toy2d.d", static_cast<LD>(query.cols()));
    q.vector("toy2d.q", query.row(0));
    q.matrix("toy2d.k", keys);
    q.matrix("toy2d.v", values);

    // The printed softmax is the softmax of the raw scores: scale 1, although the page's formula divides by √d.
    const auto printed = ref::attend_head<LD>(query, keys, values, 1.0L);
    q.scalar("toy2d.scale", 1.0L);
    q.vector("toy2d.scores", printed.scores.row(0));
    q.vector("toy2d.weights", printed.weights.row(0));
    q.vector("toy2d.context", printed.out.row(0));

    // What the page's own formula, softmax(Q·Kᵀ/√d)·V with d = 2, gives instead (recorded, not printed).
    const auto formula = ref::attend_head<LD>(query, keys, values, 1.0L / std::sqrt(2.0L));
    q.vector("toy2d.formula_scale.weights", formula.weights.row(0));
    q.vector("toy2d.formula_scale.context", formula.out.row(0));
}

// A small seeded model that chooses its own tokens; any model gives the same counts, since they depend only on
// the number of tokens each forward pass projects.
ref::Generation<double> run(int steps) {
    ref::ModelConfig cfg;
    cfg.d_model = 8;
    cfg.n_layers = 1;
    cfg.n_q_heads = 2;
    cfg.n_kv_heads = 1;
    cfg.head_dim = 4;
    cfg.vocab = 16;
    cfg.out_proj = true;
    cfg.residual = true;
    cfg.unembed = true;
    return ref::generate<double>(cfg, ref::random_weights(cfg, 2002), {1, 2}, steps); // "I love": 2 tokens
}

void add_counts(Quantities& q) {
    // The step lists: "Step 1: K,V,Q for 2 tokens", "Step 2: ... for 3 (2 recomputed)", "Step 3: ... for 4 (3
    // recomputed)"; with the cache, "compute 1 new · reuse 2", "compute 1 new · reuse 3".
    const auto three = run(3);
    std::vector<long double> per_pass, before, fresh;
    for (size_t i = 0; i < three.steps.size(); ++i) {
        per_pass.push_back(three.steps[i].kv_projections);
        const long prev = i ? three.steps[i - 1].kv_projections : 0; // tokens already projected once
        fresh.push_back(three.steps[i].kv_projections - prev);
        if (i) before.push_back(prev);
    }
    q.vector("counts.no_cache.per_pass", per_pass);   // [2, 3, 4]
    q.vector("counts.no_cache.recomputed", before);   // [2, 3]: steps 2 and 3
    q.vector("counts.cache.new", fresh);              // [2, 1, 1]
    q.vector("counts.cache.reused", before);          // [2, 3]: the cache length before steps 2 and 3

    // 99 passes over 2, 3, …, 100 tokens.
    const auto g = run(99);
    const auto projected = [&](size_t step) { return static_cast<LD>(g.steps[step].kv_projections); };
    const LD prompt = projected(0), generated = static_cast<LD>(g.tokens.size()) - prompt;
    q.scalar("counts.passes", static_cast<LD>(g.steps.size()));
    q.vector("counts.no_cache.terms", {projected(0), projected(1), projected(g.steps.size() - 1)});
    q.scalar("counts.no_cache.total", static_cast<LD>(g.kv_projections)); // 5,049
    // With a cache each token is projected once: the prompt in prefill, then every generated token when it is
    // appended, the last one included. Over the same 99 passes the last one is never needed: 100.
    // terms: the prompt, the tokens first seen by passes 2 and 3, the token appended after the last pass
    q.vector("counts.cache.terms", {prompt, projected(1) - projected(0), projected(2) - projected(1),
                                    static_cast<LD>(g.tokens.size()) - projected(g.steps.size() - 1)});
    q.scalar("counts.cache.total", prompt + generated);                      // 101
    q.scalar("counts.cache.total_same_passes", projected(g.steps.size() - 1)); // 100
    q.scalar("counts.ratio", static_cast<LD>(g.kv_projections) / (prompt + generated));  // 49.99
}

} // namespace

void add_toy2d(Quantities& q) {
    add_attention(q);
    add_counts(q);
}

} // namespace kvc::golden
