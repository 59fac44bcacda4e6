#include "generators.hpp"

#include <algorithm>
#include <numeric>

namespace kvc::prop::gens {

namespace {

bool has(uint32_t mask, uint32_t bit) { return (mask & bit) != 0; }

// A length near a multiple of the block size, or small, or one.
rc::Gen<uint32_t> length_near_blocks(uint32_t block, uint32_t cap) {
    const uint32_t b = std::max(block, 1u);
    return rc::gen::map(
        rc::gen::oneOf(rc::gen::just<uint32_t>(1u), rc::gen::inRange<uint32_t>(1u, 3u * b + 3u),
                       rc::gen::map(rc::gen::inRange<uint32_t>(1u, 4u), [b](uint32_t k) { return k * b; }),
                       rc::gen::map(rc::gen::inRange<uint32_t>(1u, 4u), [b](uint32_t k) { return k * b + 1; }),
                       rc::gen::map(rc::gen::inRange<uint32_t>(1u, 4u), [b](uint32_t k) { return std::max(k * b, 2u) - 1; })),
        [cap](uint32_t n) { return std::min(n, cap); });
}

} // namespace

rc::Gen<CaseConfig> config(const ConfigSpace& space) {
    return rc::gen::exec([space] {
               CaseConfig c;
               std::vector<uint32_t> dtypes, ropes{KVC_ROPE_NONE};
               for (uint32_t d = 0; d < 3; ++d)
                   if (space.allow.dtypes >> d & 1u) dtypes.push_back(d);
               for (uint32_t r = 1; r < 3; ++r)
                   if (space.allow.rope_variants >> r & 1u) ropes.push_back(r);
               if (dtypes.empty()) dtypes.push_back(KVC_DTYPE_F32);
               c.dtype = *rc::gen::elementOf(dtypes).as("dtype");
               c.rope = *rc::gen::elementOf(ropes).as("rope");
               // sizes stay inside the declared limits (0 = none): a limit is not a capability to skip on
               const auto cap = [](uint32_t want, uint32_t limit) { return limit ? std::min(want, limit) : want; };
               const auto fits = [](std::vector<uint32_t> v, uint32_t limit) {
                   if (limit) v.erase(std::remove_if(v.begin(), v.end(), [&](uint32_t x) { return x > limit; }), v.end());
                   return v.empty() ? std::vector<uint32_t>{limit ? limit : 1u} : v;
               };
               const uint32_t max_layers = std::max(cap(space.max_layers, space.allow.max_layers), 1u);
               c.n_layers = *rc::gen::inRange<uint32_t>(std::min(space.min_layers, max_layers), max_layers + 1)
                                 .as("n_layers");
               const uint32_t max_kv = std::max(cap(space.large_queries ? 2u : 3u, space.allow.max_kv_heads), 1u);
               c.n_kv_heads = *rc::gen::inRange<uint32_t>(1u, max_kv + 1).as("n_kv_heads");
               uint32_t group = 1;
               if (space.force_gqa)
                   group = *rc::gen::elementOf(std::vector<uint32_t>{2, 3, 4, 5, 6, 7, 8}).as("gqa group size");
               else if (has(space.allow.features, KVC_FEATURE_GQA))
                   group = *rc::gen::elementOf(std::vector<uint32_t>{1, 1, 2, 3, 4}).as("gqa group size");
               if (space.allow.max_q_heads) // shrink the group (then the KV heads) until the query heads fit
                   while (c.n_kv_heads * group > space.allow.max_q_heads && (group > 1 || c.n_kv_heads > 1))
                       group > 1 ? --group : --c.n_kv_heads;
               c.n_q_heads = c.n_kv_heads * group;
               if (space.large_queries) {
                   c.n_q_heads = std::max(c.n_q_heads, 4u);
                   c.n_q_heads -= c.n_q_heads % c.n_kv_heads;
                   if (!has(space.allow.features, KVC_FEATURE_GQA)) c.n_kv_heads = c.n_q_heads;
                   c.head_dim = *rc::gen::elementOf(fits({64, 96, 128}, space.allow.max_head_dim)).as("head_dim");
               } else if (c.rope != KVC_ROPE_NONE) {
                   c.head_dim =
                       *rc::gen::elementOf(fits({2, 4, 6, 8, 16, 32, 64}, space.allow.max_head_dim)).as("head_dim");
               } else {
                   c.head_dim =
                       *rc::gen::elementOf(fits({1, 3, 4, 5, 8, 16, 32, 64}, space.allow.max_head_dim)).as("head_dim");
               }
               c.block_size_hint =
                   *rc::gen::elementOf(std::vector<uint32_t>{0, 1, 2, 3, 5, 7, 8, 13, 16, 17, 32, 64}).as("block_size_hint");
               c.max_seqs = cap(6, space.allow.max_seqs);
               c.max_tokens = cap(200, space.allow.max_tokens);
               return c;
           })
        .as("config");
}

rc::Gen<Case> case_for(const ConfigSpace& cs, const ScriptSpace& ss) {
    return rc::gen::exec([cs, ss] {
               Case c;
               c.cfg = *config(cs);
               c.data_seed = *rc::gen::inRange<uint64_t>(0, 1u << 30).as("data_seed");
               const uint32_t block = c.cfg.block_size_hint ? c.cfg.block_size_hint : 16;
               const uint32_t cap = c.cfg.max_tokens;
               std::vector<uint32_t> len(c.cfg.max_seqs, 0);
               std::vector<bool> live(c.cfg.max_seqs, false);
               for (uint32_t s = 0; s < std::min(ss.n_seqs, c.cfg.max_seqs); ++s) live[s] = true;
               const uint32_t n_ops = *rc::gen::inRange<uint32_t>(ss.min_ops, ss.max_ops + 1).as("number of ops");
               uint32_t total = 0;
               auto draw_append = [&](uint32_t seq) {
                   const uint32_t room = cap - len[seq];
                   uint32_t n;
                   if (len[seq] == 0)
                       n = *rc::gen::weightedOneOf<uint32_t>({{1, rc::gen::just<uint32_t>(0u)},
                                                              {8, length_near_blocks(block, room)}})
                                .as("prompt length");
                   else if (ss.chunked)
                       n = *rc::gen::weightedOneOf<uint32_t>({{3, rc::gen::just<uint32_t>(1u)},
                                                              {2, length_near_blocks(block, room)}})
                                .as("append length");
                   else
                       n = 1;
                   return std::min(n, room);
               };
               for (uint32_t i = 0; i < n_ops || total < ss.min_total_tokens; ++i) {
                   if (i > 4 * ss.max_ops + 64) break;
                   Op op;
                   std::vector<uint32_t> live_ids, free_ids, started; // fork and release need a started sequence
                   for (uint32_t s = 0; s < c.cfg.max_seqs; ++s) {
                       (live[s] ? live_ids : free_ids).push_back(s);
                       if (live[s] && len[s] > 0) started.push_back(s);
                   }
                   const uint32_t kind = *rc::gen::inRange<uint32_t>(0, 10).as("op kind");
                   if (ss.fork && kind >= 7 && !free_ids.empty() && !started.empty()) {
                       op.kind = OpKind::Fork;
                       op.seq = *rc::gen::elementOf(started).as("fork parent");
                       op.child = free_ids.front();
                       live[op.child] = true;
                       len[op.child] = len[op.seq];
                   } else if (ss.release && kind == 6 && !started.empty()) {
                       op.kind = OpKind::Release;
                       op.seq = *rc::gen::elementOf(started).as("released seq");
                       len[op.seq] = 0; // stays usable: the next append restarts it
                   } else if (ss.batch && live_ids.size() > 1) {
                       op.kind = OpKind::AppendBatch;
                       // a subset of the sequences in any order, so batch slot i is rarely sequence i
                       std::vector<uint32_t> ids = live_ids; // shuffled (Fisher-Yates), then a prefix
                       for (size_t k = ids.size() - 1; k > 0; --k)
                           std::swap(ids[k], ids[*rc::gen::inRange<size_t>(0, k + 1).as("batch order")]);
                       ids.resize(*rc::gen::inRange<size_t>(2, ids.size() + 1).as("sequences in the batch"));
                       for (uint32_t s : ids) {
                           const uint32_t m = draw_append(s);
                           op.appends.push_back({s, m});
                           len[s] += m;
                           total += m;
                       }
                   } else {
                       op.kind = OpKind::Append;
                       const uint32_t s = *rc::gen::elementOf(live_ids).as("sequence");
                       const uint32_t m = draw_append(s);
                       op.appends.push_back({s, m});
                       len[s] += m;
                       total += m;
                   }
                   if (ss.shuffle_layers && (op.kind == OpKind::Append || op.kind == OpKind::AppendBatch)) {
                       op.layer_order.resize(c.cfg.n_layers);
                       std::iota(op.layer_order.begin(), op.layer_order.end(), 0u);
                       const uint32_t rot = *rc::gen::inRange<uint32_t>(0, c.cfg.n_layers).as("layer rotation");
                       const bool rev = *rc::gen::arbitrary<bool>().as("layers reversed");
                       std::rotate(op.layer_order.begin(), op.layer_order.begin() + rot, op.layer_order.end());
                       if (rev) std::reverse(op.layer_order.begin(), op.layer_order.end());
                   }
                   c.ops.push_back(op);
               }
               return c;
           })
        .as("case");
}

} // namespace kvc::prop::gens
