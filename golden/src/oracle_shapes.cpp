// Structural claims: 003's prefill/decode shapes ("hello i am" -> (B,3,d_h), then (B,4,d_h); a decode query of
// shape (B,1,d_h) from an input of (B,1,C)) and 000's "a 32-layer model caches 32 (K, V) pairs per token", read
// off the reference's traces on small seeded models (B = 1: the reference runs one sequence).
#include "quantities.hpp"

#include "kvcheck/reference/model.hpp"

namespace kvc::golden {
namespace {

using ref::Mat;

ref::ModelConfig small(int layers) {
    ref::ModelConfig c;
    c.d_model = 8;
    c.n_layers = layers;
    c.n_q_heads = 2;
    c.n_kv_heads = 2;
    c.head_dim = 4;
    c.vocab = 16;
    c.out_proj = true;
    c.residual = true;
    c.unembed = true;
    return c;
}

// Rows every layer's K (and V) holds; they must agree across layers.
long cache_rows(const ref::ForwardTrace<double>& t) {
    const long rows = static_cast<long>(t.layers[0].k.rows());
    for (const auto& l : t.layers)
        if (l.k.rows() != rows || l.v.rows() != rows) throw std::logic_error("shapes: layers disagree on cache rows");
    return rows;
}

void add_prefill_decode(Quantities& q) {
    const ref::ModelConfig cfg = small(2);
    const auto w = ref::random_weights(cfg, 2003);
    const std::vector<int> prompt = {3, 1, 4}; // "hello i am" (the page does not print its GPT-2 ids)
    const auto g = ref::generate<double>(cfg, w, prompt, 1); // prefill, then the sampled token is appended
    const auto decode = ref::forward<double>(cfg, w, ref::embed(w, g.tokens)); // the pass that reads 4 rows

    q.scalar("shapes.prefill.cache_rows", cache_rows(g.steps[0]));
    q.scalar("shapes.decode.cache_rows", cache_rows(decode));
    q.scalar("shapes.decode.position", static_cast<long double>(g.tokens.size())); // q_4: 1-based

    // The decode row needs one query and no past queries: q's last row alone against all K/V rows gives the
    // full recompute's last row.
    const auto& l0 = decode.layers[0];
    const Mat<double> q_new = l0.q.middleCols(0, cfg.head_dim).bottomRows(1); // (1, d_h)
    const auto one = ref::attend_head<double>(q_new, l0.k.middleCols(0, cfg.head_dim),
                                              l0.v.middleCols(0, cfg.head_dim), cfg.attention_scale());
    if (!one.out.isApprox(l0.heads[0].out.bottomRows(1), 1e-12))
        throw std::logic_error("shapes: the decode row differs when computed from its query alone");
    q.scalar("shapes.decode.query_rows", static_cast<long double>(q_new.rows()));
    q.scalar("shapes.decode.input_rows", static_cast<long double>(ref::embed(w, {g.tokens.back()}).rows()));
    // K_{1:3}: the 1-based positions of the rows cached before the decode step
    q.vector("shapes.decode.cached_range", {1.0L, static_cast<long double>(g.steps[0].layers[0].k.rows())});
    long attended = 0;
    for (Eigen::Index j = 0; j < one.weights.cols(); ++j) attended += one.weights(0, j) > 0;
    q.scalar("shapes.decode.keys_attended", attended); // 4: k_4 included, as causal attention requires
}

void add_pairs_per_token(Quantities& q) {
    const ref::ModelConfig cfg = small(32);
    const auto w = ref::random_weights(cfg, 32);
    const auto t = ref::forward<double>(cfg, w, ref::embed(w, {5}));
    long pairs = 0; // one (K, V) pair per layer for the single token
    for (const auto& l : t.layers) pairs += l.k.rows() == 1 && l.v.rows() == 1;
    q.scalar("kv_pairs.layers", cfg.n_layers);
    q.scalar("kv_pairs.per_token", pairs);
}

} // namespace

void add_shapes(Quantities& q) {
    add_prefill_decode(q);
    add_pairs_per_token(q);
}

} // namespace kvc::golden
