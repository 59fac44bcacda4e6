// 000_*.txt's 4-d toy, run through the reference in long double. The reference has no cache: "prefill" and
// "turn 1" are one forward pass over "the cat sat on", turn 2 a second pass over the five tokens. The document's
// next tokens (mat, then ".") are given to generate() as forced tokens: the toy's layer 1, MLP and unembedding are
// not in the document, so no model could choose them.
#include "kvcheck/golden/cache_size.hpp"
#include "kvcheck/golden/toy4d.hpp"

#include "quantities.hpp"

namespace kvc::golden {
namespace {

using ref::Mat;

// The last row of one decode turn's layer-0 attention: what the document's turn tables print.
//   pass: a forward over T tokens -> q [d], k [T x d], dots/scores/weights [T], out [d]
void add_turn(Quantities& q, const std::string& turn, const ref::ForwardTrace<LD>& pass) {
    const auto& l0 = pass.layers[0];
    const auto& head = l0.heads[0];
    const Eigen::Index last = l0.q.rows() - 1;
    q.vector(turn + ".q", l0.q.row(last));
    q.matrix(turn + ".k", l0.k);
    q.vector(turn + ".dots", head.dots.row(last));
    q.vector(turn + ".scores", head.scores.row(last));
    q.vector(turn + ".weights", head.weights.row(last));
    q.vector(turn + ".out", head.out.row(last));
}

} // namespace

void add_toy4d(Quantities& q) {
    const Toy4d& t = toy4d();
    const Toy4dPrinted& p = toy4d_printed();
    const ref::LayerWeights<LD>& l0 = t.weights.layers[0];

    // the model, as the reference is given it
    q.scalar("toy4d.config.d_model", t.cfg.d_model);
    q.scalar("toy4d.config.n_heads", t.cfg.n_q_heads);
    q.scalar("toy4d.config.head_dim", t.cfg.head_dim);
    q.scalar("toy4d.config.n_layers", t.cfg.n_layers);
    q.scalar("toy4d.scale", static_cast<LD>(t.cfg.attention_scale()));
    q.vector("toy4d.prompt_ids", std::vector<long double>(p.prompt.begin(), p.prompt.end()));
    q.matrix("toy4d.embeddings", ref::embed<LD>(t.weights, p.prompt)); // [4 x 4] the, cat, sat, on
    q.matrix("toy4d.w_k.columns", l0.w_k.transpose());                // row j = column j
    q.matrix("toy4d.w_v.columns", l0.w_v.transpose());

    // the worked dot products for "the": term i of K_j is e_i · W[i][j]
    const ref::RowVec<LD> e_the = t.weights.embedding.row(p.prompt[0]);
    q.matrix("toy4d.the.k_terms", l0.w_k.transpose() * e_the.asDiagonal());
    q.matrix("toy4d.the.v_terms", l0.w_v.transpose() * e_the.asDiagonal());

    // what the document leaves out
    q.vector("toy4d.mat.embedding", t.mat_embedding);
    q.scalar("toy4d.w_k.determinant", t.w_k_det);
    q.matrix("toy4d.w_q.columns", t.w_q.transpose());
    q.scalar("toy4d.w_q.system_rank", t.q_system_rank);
    q.vector("toy4d.w_q.null_direction", t.w_q_null);

    // two decode turns by full recompute; the next tokens are the document's (mat 14, then "." with no id)
    const auto gen = ref::generate<LD>(t.cfg, t.weights, p.prompt, 2, {p.mat_id, t.dot_placeholder_id});
    const auto& prefill = gen.steps[0].layers[0]; // the pass over the prompt: prefill and turn 1 at once
    q.matrix("toy4d.prefill.k", prefill.k);
    q.matrix("toy4d.prefill.v", prefill.v);
    q.vector("toy4d.the.k", prefill.k.row(0));
    q.vector("toy4d.the.v", prefill.v.row(0));
    q.vector("toy4d.the.q", prefill.q.row(0));
    q.scalar("toy4d.prefill.rows", static_cast<LD>(prefill.k.rows()));
    std::vector<long double> positions;
    for (Eigen::Index r = 0; r < prefill.k.rows(); ++r) positions.push_back(static_cast<LD>(r));
    q.vector("toy4d.prefill.row_positions", positions);

    add_turn(q, "toy4d.turn1", gen.steps[0]);
    q.scalar("toy4d.turn1.next_token", gen.tokens[4]);
    q.scalar("toy4d.turn1.rows_after", static_cast<LD>(gen.steps[1].layers[0].k.rows()));
    add_turn(q, "toy4d.turn2", gen.steps[1]);
    q.vector("toy4d.mat.v", gen.steps[1].layers[0].v.row(4)); // from the derived embedding: derived too
    const auto after_turn2 = ref::forward<LD>(t.cfg, t.weights, ref::embed<LD>(t.weights, gen.tokens));
    q.scalar("toy4d.turn2.rows_after", static_cast<LD>(after_turn2.layers[0].k.rows()));

    // "one token costs 2 × 1 × 4 × 2 = 16 numbers": the cache formula at B = 1, T = 1, one number per element
    const CacheShape per_token{"toy4d.per_token", 1, static_cast<uint64_t>(t.cfg.n_layers), 1,
                               static_cast<uint64_t>(t.cfg.n_kv_heads), static_cast<uint64_t>(t.cfg.head_dim), 1};
    q.vector("toy4d.per_token.factors", {2, static_cast<LD>(per_token.kv_heads), static_cast<LD>(per_token.head_dim),
                                         static_cast<LD>(per_token.layers)});
    q.scalar("toy4d.per_token.numbers", static_cast<LD>(kv_cache_bytes(per_token)));
}

} // namespace kvc::golden
