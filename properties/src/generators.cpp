#include "generators.hpp"
#include "generators_shapes.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

namespace kvc::prop::gens {

namespace {

// Block sizes a length is drawn around. The cache's own block size is unknown when a case is drawn (the generator
// runs before create), so besides the hint the common sizes real caches pick for themselves are drawn: a cache
// that ignores the hint still meets lengths at its own boundaries.
rc::Gen<uint32_t> boundary_block(uint32_t hint) {
    if (hint) return rc::gen::weightedElement<uint32_t>({{20, hint}, {1, 16}, {1, 32}, {1, 64}, {1, 128}, {1, 256}});
    return rc::gen::weightedElement<uint32_t>({{20, 16}, {1, 32}, {1, 64}, {1, 128}, {1, 256}});
}

// A length near a multiple of a block size, or small, or one. Around big blocks (128, 256) only the first
// boundaries and no uniform range up to 3 blocks: attention costs grow with the square of the length.
rc::Gen<uint32_t> length_near_blocks(uint32_t hint, uint32_t cap) {
    return rc::gen::mapcat(boundary_block(hint), [cap](uint32_t b) {
        const uint32_t kmax = b >= 128 ? 2u : 4u;
        return rc::gen::map(
            rc::gen::oneOf(rc::gen::just<uint32_t>(1u), rc::gen::inRange<uint32_t>(1u, std::min(3u * b, 195u) + 3u),
                           rc::gen::map(rc::gen::inRange<uint32_t>(1u, kmax), [b](uint32_t k) { return k * b; }),
                           rc::gen::map(rc::gen::inRange<uint32_t>(1u, kmax), [b](uint32_t k) { return k * b + 1; }),
                           rc::gen::map(rc::gen::inRange<uint32_t>(1u, kmax),
                                        [b](uint32_t k) { return std::max(k * b, 2u) - 1; })),
            [cap](uint32_t n) { return std::min(n, cap); });
    });
}

// A length at, just below or just above a multiple of a block size, above `now` (the next boundary or the one
// after): where forks and releases are drawn. Returns `now` when nothing above fits under `cap`.
uint32_t boundary_at_or_above(uint32_t hint, uint32_t now, uint32_t cap) {
    const uint32_t b = *boundary_block(hint).as("boundary block size");
    const uint32_t k = (now + b) / b + *rc::gen::inRange<uint32_t>(0, 2).as("blocks further");
    const int off = *rc::gen::elementOf(std::vector<int>{-1, 0, 1}).as("offset from the boundary");
    const int64_t target = static_cast<int64_t>(k) * b + off;
    if (target <= static_cast<int64_t>(now) || target > static_cast<int64_t>(cap)) return now;
    return static_cast<uint32_t>(target);
}

// The largest granularity drawn as a head_dim of its own (below): 4x the largest candidate. A declared
// head_dim_multiple above it (1,000,000 from a caps file took 23 GB of K/V data to export) is not drawn.
constexpr uint32_t kLargestDrawnMultiple = 1024;

// head_dim candidates inside the declared limit and granularity; large ones rarer (the oracle's cost grows with d).
uint32_t draw_head_dim(const ConfigSpace& space, bool rope, std::vector<uint32_t> small, std::vector<uint32_t> large) {
    const uint32_t limit = space.allow.max_head_dim;
    const uint32_t m = rope ? lcm(head_dim_multiple(space.allow, true), 2u) : head_dim_multiple(space.allow, false);
    const uint32_t first = small.front(); // the case's first candidate, before the granularity filters it
    if (limit && limit % m == 0 && limit <= 256) large.push_back(limit); // the declared maximum itself
    const auto fits = [&](std::vector<uint32_t>& v) {
        v.erase(std::remove_if(v.begin(), v.end(), [&](uint32_t x) { return x % m != 0 || (limit && x > limit); }),
                v.end());
    };
    fits(small);
    fits(large);
    // No candidate fits: the granularity itself, NOT_SUPPORTED where it exceeds the limit, never an error; or, for a
    // granularity too large to draw, the first candidate, NOT_SUPPORTED as "not a multiple" of it.
    if (small.empty() && large.empty()) small.push_back(m <= kLargestDrawnMultiple ? m : first);
    if (small.empty()) return *rc::gen::elementOf(large).as("head_dim");
    if (large.empty()) return *rc::gen::elementOf(small).as("head_dim");
    return *rc::gen::weightedOneOf<uint32_t>({{6, rc::gen::elementOf(small)}, {1, rc::gen::elementOf(large)}})
                .as("head_dim");
}

// An fp8 scale: 1, an exact power of two, or log-uniform over [2^lo, 4]. Inputs are about N(0, 1) (|x| < 3), so
// the small scales push many values x / scale past the format's largest finite value: saturation is exercised
// (2^-9 does it for E4M3FN's 448, 2^-15 for E5M2's 57344).
float draw_fp8_scale(int lo) {
    const uint32_t kind = *rc::gen::weightedElement<uint32_t>({{1, 0}, {2, 1}, {4, 2}}).as("fp8 scale kind");
    if (kind == 0) return 1.0f;
    if (kind == 1) return std::ldexp(1.0f, *rc::gen::inRange<int>(lo, 3).as("fp8 scale, power of two"));
    const uint32_t u = *rc::gen::inRange<uint32_t>(0, 1001).as("fp8 scale, log2 (1/1000 of the range)");
    return static_cast<float>(std::exp2(lo + (2.0 - lo) * u / 1000.0));
}

// The quantization of a quantized dtype, drawn last so that a case of a 16-bit dtype draws what it always drew.
// Per-KV-head scales differ between the heads of a layer (an index taken from the query head is seen), and V's
// from K's at the same place (k_scale used for V is seen).
void draw_quantization(const ConfigSpace& space, CaseConfig& c) {
    if (dtype_is_fp8(c.cache_dtype)) {
        std::vector<uint32_t> modes{KVC_SCALE_NONE};
        if (has(space.allow.quant, KVC_QUANT_FP8_SCALE_TENSOR)) modes.push_back(KVC_SCALE_TENSOR);
        if (has(space.allow.quant, KVC_QUANT_FP8_SCALE_KV_HEAD)) modes.push_back(KVC_SCALE_KV_HEAD);
        c.kv_scale_mode = *rc::gen::elementOf(modes).as("kv_scale_mode");
        const int lo = c.cache_dtype == KVC_DTYPE_FP8_E5M2 ? -15 : -9;
        const size_t n = scales_expected(c), per_layer = c.kv_scale_mode == KVC_SCALE_KV_HEAD ? c.n_kv_heads : 1;
        // every scale of a layer distinct, K's and V's together: a code made with the wrong one is told apart
        const auto taken = [&](size_t i, float x) {
            for (size_t j = i - i % per_layer; j < i; ++j)
                if (c.k_scales[j] == x || c.v_scales[j] == x) return true;
            return false;
        };
        for (size_t i = 0; i < n; ++i) {
            float k = draw_fp8_scale(lo), v = draw_fp8_scale(lo);
            while (taken(i, k)) k *= 1.25f;
            while (taken(i, v) || v == k) v *= 1.25f;
            c.k_scales.push_back(k);
            c.v_scales.push_back(v);
        }
    }
    if (c.cache_dtype == KVC_DTYPE_INT8_TOKEN && has(space.allow.quant, KVC_QUANT_INT8_SCALE_F16))
        c.int8_scale_dtype = *rc::gen::elementOf(std::vector<uint32_t>{KVC_DTYPE_F32, KVC_DTYPE_F16})
                                  .as("int8_scale_dtype");
}

// Whether the declared pipeline forms the scores in f32: q, RoPE and scores not rounded to 16 bits (an fp8 or q8_0
// q is rounded by the oracle exactly, and a quantized cache's rows are dequantized to f32 first).
// Every pipeline that may grade a call of this dtype counts (ABI 1.3 rules): a case's calls may take any path.
bool scores_in_f32(const kvc_caps& caps, uint32_t dtype) {
    const bool narrow_cache = dtype == KVC_DTYPE_F16 || dtype == KVC_DTYPE_BF16;
    for (const Pipeline& p : pipelines_for_dtype(caps, dtype))
        for (uint32_t r : {p.q, p.rope, p.scores})
            if (r == KVC_ROUND_F16 || r == KVC_ROUND_BF16 || (r == KVC_ROUND_CACHE && narrow_cache)) return false;
    return true;
}

// The large-score regime, in a quarter of the cases where the space allows it: scores of magnitude about S, from
// 64 to 3000, beyond exp's f32 range (|s| > 88 overflows or underflows) by one to two orders of magnitude. Drawn
// after everything else, script included, so that a case outside the regime is the case its seed always drew.
// Not where the scores are formed in 16 bits: a 16-bit score of magnitude 1000 is off by up to 0.5 (bf16: 4), where
// the tolerance's first-order model of exp no longer holds; an f32 one by 1e-4.
void draw_large_scores(const ConfigSpace& space, CaseConfig& c) {
    if (!space.large_scores || !scores_in_f32(space.allow, c.cache_dtype)) return;
    if (!*rc::gen::weightedElement<bool>({{3, false}, {1, true}}).as("large scores")) return;
    c.score_scale = static_cast<float>(*rc::gen::weightedOneOf<uint32_t>(
                                            {{1, rc::gen::elementOf(std::vector<uint32_t>{64, 100, 1000, 3000})},
                                             {2, rc::gen::inRange<uint32_t>(64, 3001)}})
                                            .as("score_scale"));
}

// Chunk lengths at the edges of the declared pipeline rules that cover this dtype (ABI 1.3): min_new - 1, min_new
// and min_new + 1 of each rule with min_new > 1, so the calls on either side of every switch are graded.
std::vector<uint32_t> rule_edges(const kvc_caps& caps, uint32_t dtype) {
    std::vector<uint32_t> e;
    for (const kvc_pipeline_rule& r : pipeline_rules(caps))
        if (r.min_new > 1 && rule_covers(r, dtype, r.min_new))
            for (uint32_t x : {r.min_new - 1, r.min_new, r.min_new + 1}) e.push_back(x);
    std::sort(e.begin(), e.end());
    e.erase(std::unique(e.begin(), e.end()), e.end());
    return e;
}

// Lengths a windowed case's appends aim at: the window's edges (W - 1, W, W + 1, 2W +- 1) of some layer and the
// sinks' (S - 1, S, S + 1); empty for a case without windows.
std::vector<uint32_t> window_edges(const CaseConfig& c) {
    std::vector<uint32_t> e;
    for (uint32_t w : c.windows)
        if (w)
            for (uint32_t x : {w - 1, w, w + 1, 2 * w - 1, 2 * w + 1, 3 * w}) e.push_back(x);
    if (!e.empty() && c.n_sinks)
        for (uint32_t x : {c.n_sinks - 1, c.n_sinks, c.n_sinks + 1, c.n_sinks + 2}) e.push_back(x);
    std::sort(e.begin(), e.end());
    e.erase(std::unique(e.begin(), e.end()), e.end());
    return e;
}

} // namespace

rc::Gen<CaseConfig> config(const ConfigSpace& space) {
    return rc::gen::exec([space] {
               CaseConfig c;
               std::vector<uint32_t> dtypes, ropes{KVC_ROPE_NONE};
               for (uint32_t d = 0; d <= KVC_DTYPE_Q8_0; ++d)
                   if (space.allow.dtypes >> d & 1u) dtypes.push_back(d);
               for (uint32_t r = 1; r < 3; ++r)
                   if (space.allow.rope_variants >> r & 1u) ropes.push_back(r);
               if (dtypes.empty()) dtypes.push_back(KVC_DTYPE_F32);
               c.cache_dtype = *rc::gen::elementOf(dtypes).as("dtype");
               c.rope = *rc::gen::elementOf(ropes).as("rope");
               // sizes stay inside the declared limits (0 = none): a limit is not a capability to skip on
               const auto cap = [](uint32_t want, uint32_t limit) { return limit ? std::min(want, limit) : want; };
               const uint32_t max_layers =
                   std::max(cap(space.long_cases ? 1u : space.max_layers, space.allow.max_layers), 1u);
               c.n_layers = *rc::gen::inRange<uint32_t>(std::min(space.min_layers, max_layers), max_layers + 1)
                                 .as("n_layers");
               const uint32_t max_kv =
                   std::max(cap(space.large_queries || space.long_cases ? 2u : 3u, space.allow.max_kv_heads), 1u);
               c.n_kv_heads = *rc::gen::inRange<uint32_t>(1u, max_kv + 1).as("n_kv_heads");
               uint32_t group = 1;
               if (space.force_gqa)
                   group = *rc::gen::elementOf(std::vector<uint32_t>{2, 3, 4, 5, 6, 7, 8}).as("gqa group size");
               else if (has(space.allow.features, KVC_FEATURE_GQA))
                   group = *rc::gen::elementOf(std::vector<uint32_t>{1, 1, 2, 3, 4}).as("gqa group size");
               if (space.long_cases) group = std::min(group, 2u);
               if (space.allow.max_q_heads) // shrink the group (then the KV heads) until the query heads fit
                   while (c.n_kv_heads * group > space.allow.max_q_heads && (group > 1 || c.n_kv_heads > 1))
                       group > 1 ? --group : --c.n_kv_heads;
               c.n_q_heads = c.n_kv_heads * group;
               const bool rope = c.rope != KVC_ROPE_NONE;
               ConfigSpace hs = space; // q8_0's blocks hold 32 values of a head: head_dim a multiple of 32
               if (c.cache_dtype == KVC_DTYPE_Q8_0) {
                   hs.allow.head_dim_multiple = lcm(head_dim_multiple(space.allow, false), 32u);
                   hs.allow.head_dim_multiple_rope = lcm(head_dim_multiple(space.allow, true), 32u);
               }
               if (space.large_queries) {
                   c.n_q_heads = std::max(c.n_q_heads, 4u);
                   c.n_q_heads -= c.n_q_heads % c.n_kv_heads;
                   if (!has(space.allow.features, KVC_FEATURE_GQA)) c.n_kv_heads = c.n_q_heads;
                   c.head_dim = draw_head_dim(hs, rope, {64, 96, 128}, {});
               } else if (space.long_cases) {
                   c.head_dim = draw_head_dim(hs, rope, {2, 4, 8, 16}, {});
               } else if (rope) {
                   c.head_dim = draw_head_dim(hs, rope, {2, 4, 6, 8, 16, 32, 64}, {128, 256});
               } else {
                   c.head_dim = draw_head_dim(hs, rope, {1, 3, 4, 5, 8, 12, 16, 32, 64}, {80, 128, 256});
               }
               c.block_size_hint = *rc::gen::elementOf(std::vector<uint32_t>{0, 1, 2, 3, 5, 7, 8, 13, 16, 17, 32, 64,
                                                                             128})
                                        .as("block_size_hint");
               // ids across max_seqs: 8, 16, 64 and beyond, as well as a few
               c.max_seqs = cap(*rc::gen::weightedElement<uint32_t>({{6, 6}, {1, 8}, {1, 16}, {1, 64}, {1, 257}})
                                     .as("max_seqs"),
                                space.allow.max_seqs);
               // attention costs T^2 * n_q_heads * head_dim * n_layers: wide configs get shorter sequences (and
               // head_dim >= 128 the fewest layers), so that the rare big head stays as cheap as a common case
               if (c.head_dim >= 128) c.n_layers = std::min(c.n_layers, std::max(space.min_layers, 1u));
               const uint32_t work = c.n_q_heads * c.head_dim * c.n_layers;
               const uint32_t tokens =
                   space.long_cases
                       ? 8200u
                       : wide_shape_tokens(work, work > 512 ? std::min(space.max_tokens, 200u) : space.max_tokens);
               c.max_tokens = cap(tokens, space.allow.max_tokens);
               // a cache may allocate max_seqs x max_tokens up front (the example plugin does): sequence counts
               // beyond 6 only while that stays within 16 MiB of f32 K/V, so a case stays cheap for every cache
               const uint64_t per_seq = 8ull * c.n_layers * c.max_tokens * c.n_kv_heads * c.head_dim;
               if (c.max_seqs > 6 && per_seq * c.max_seqs > (16ull << 20))
                   c.max_seqs = std::max<uint32_t>(cap(6, space.allow.max_seqs),
                                                   static_cast<uint32_t>((16ull << 20) / per_seq));
               // 1/sqrt(d) (0 here), 1/d, 1 and values in [0.01, 2]: a kernel that hard-codes its scale fails
               const uint32_t scale_kind =
                   *rc::gen::weightedElement<uint32_t>({{4, 0}, {1, 1}, {1, 2}, {2, 3}}).as("softmax scale kind");
               if (scale_kind == 1) c.softmax_scale = 1.0f / static_cast<float>(c.head_dim);
               if (scale_kind == 2) c.softmax_scale = 1.0f;
               if (scale_kind == 3)
                   c.softmax_scale = static_cast<float>(*rc::gen::inRange<uint32_t>(1, 201).as("scale (1/100)")) / 100;
               // RoPE bases from 100 to 1e6, with the common 10000, 500000 and 1e6 themselves
               const uint32_t theta_kind =
                   *rc::gen::weightedElement<uint32_t>({{3, 0}, {1, 1}, {1, 2}, {1, 3}, {2, 4}}).as("rope_theta kind");
               const float thetas[] = {10000.0f, 500000.0f, 1000000.0f, 100.0f};
               c.rope_theta = theta_kind < 4 ? thetas[theta_kind]
                                             : std::round(std::pow(10.0f, static_cast<float>(*rc::gen::inRange<uint32_t>(
                                                                                 200, 601)
                                                                                 .as("log10 rope_theta (1/100)")) /
                                                                              100));
               // what the implementation hard-codes replaces the draw (drawn anyway: the rest of the case is the same)
               if (space.allow.fixed_scale == KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM) c.softmax_scale = 0.0f;
               if (space.allow.fixed_rope_theta > 0) c.rope_theta = space.allow.fixed_rope_theta;
               draw_quantization(space, c);
               draw_latent(space, c);
               draw_windows(space, c);
               return c;
           })
        .as("config");
}

rc::Gen<Case> case_for(const ConfigSpace& cs, const ScriptSpace& ss) {
    return rc::gen::exec([cs, ss] {
               Case c;
               c.cfg = *config(cs);
               c.data_seed = *rc::gen::inRange<uint64_t>(0, 1u << 30).as("data_seed");
               const uint32_t hint = c.cfg.block_size_hint;
               const uint32_t cap = c.cfg.max_tokens;
               const uint32_t S = c.cfg.max_seqs;
               std::vector<uint32_t> len(S, 0);
               std::vector<bool> live(S, false);
               // the sequences in use: anywhere below max_seqs, the last id often among them
               {
                   std::vector<uint32_t> ids(S);
                   std::iota(ids.begin(), ids.end(), 0u);
                   const uint32_t n = std::min(ss.n_seqs, S);
                   for (uint32_t k = 0; k < n; ++k) {
                       const uint32_t pick = *rc::gen::weightedOneOf<uint32_t>(
                                                  {{3, rc::gen::just<uint32_t>(uint32_t{k})},
                                                   {1, rc::gen::just<uint32_t>(uint32_t{S - 1})},
                                                   {2, rc::gen::inRange<uint32_t>(k, S)}})
                                                  .as("sequence id slot");
                       std::swap(ids[k], ids[std::max(pick, k)]);
                       live[ids[k]] = true;
                   }
               }
               uint32_t total = 0, forks = 0, releases = 0;
               // scripts that must fork or release several times keep a third of max_tokens free in ordinary
               // appends, so that a parent still has room for the appends after its fork
               const uint32_t reserve = ss.min_forks || ss.min_releases ? cap / 3 : 0;
               const std::vector<uint32_t> edges = window_edges(c.cfg);
               const std::vector<uint32_t> rule_lengths = rule_edges(cs.allow, c.cfg.cache_dtype);
               auto draw_append = [&](uint32_t seq) {
                   const uint32_t room = cap - len[seq] - std::min(reserve, cap - len[seq]);
                   uint32_t n;
                   // a pipeline rule's edge in a quarter of the appends that can take one (drawn only where a rule
                   // has one, so every other declaration's cases are the ones its seeds always drew)
                   std::vector<uint32_t> rule_ahead;
                   for (uint32_t x : rule_lengths)
                       if (x <= room && (ss.chunked || len[seq] == 0)) rule_ahead.push_back(x);
                   if (!rule_ahead.empty() &&
                       *rc::gen::weightedElement<bool>({{3, false}, {1, true}}).as("a pipeline rule's chunk length"))
                       return *rc::gen::elementOf(rule_ahead).as("append length at a pipeline rule's edge");
                   std::vector<uint32_t> ahead; // window edges this append can reach: a chunk that ends on one
                   for (uint32_t x : edges)
                       if (x > len[seq] && x - len[seq] <= room && (ss.chunked || len[seq] == 0 || x == len[seq] + 1))
                           ahead.push_back(x - len[seq]);
                   if (!ahead.empty() && *rc::gen::weightedElement<bool>({{2, false}, {1, true}}).as("to a window edge"))
                       return *rc::gen::elementOf(ahead).as("append length to a window edge");
                   if (len[seq] == 0)
                       n = *rc::gen::weightedOneOf<uint32_t>({{1, rc::gen::just<uint32_t>(0u)},
                                                              {8, length_near_blocks(hint, room)}})
                                .as("prompt length");
                   else if (ss.chunked)
                       n = *rc::gen::weightedOneOf<uint32_t>({{3, rc::gen::just<uint32_t>(1u)},
                                                              {2, length_near_blocks(hint, room)}})
                                .as("append length");
                   else
                       n = 1;
                   return std::min(n, room);
               };
               auto push_append = [&](uint32_t seq, uint32_t n, bool extreme = false) {
                   Op op;
                   op.appends.push_back({seq, n, extreme});
                   len[seq] += n;
                   total += n;
                   live[seq] = true;
                   c.ops.push_back(op);
               };
               // an append of at least one token (when there is room), so the op after a fork or release acts
               auto append_some = [&](uint32_t seq) {
                   const uint32_t room = cap - len[seq];
                   uint32_t n = std::min(draw_append(seq), std::max(room / 2, std::min(room, 1u)));
                   if (n == 0 && room > 0) n = 1;
                   if (n > 0) push_append(seq, n);
               };
               auto choose_free = [&]() -> int64_t {
                   std::vector<uint32_t> free_ids;
                   for (uint32_t s = 0; s < S; ++s)
                       if (!live[s] && len[s] == 0) free_ids.push_back(s);
                   if (free_ids.empty()) return -1;
                   return *rc::gen::elementOf(free_ids).as("fork child");
               };
               auto push_fork = [&](uint32_t parent, uint32_t child) { // the child starts as the parent
                   Op op;
                   op.kind = OpKind::Fork;
                   op.seq = parent;
                   op.child = child;
                   live[child] = true;
                   len[child] = len[parent];
                   c.ops.push_back(op);
               };
               // fork at a length around a block boundary, then append to both sides
               auto fork_around_boundary = [&](uint32_t parent, uint32_t child) {
                   const uint32_t target = boundary_at_or_above(hint, len[parent], cap - 1); // room stays after
                   if (target > len[parent] && (ss.chunked || target - len[parent] == 1))
                       push_append(parent, target - len[parent]);
                   push_fork(parent, child);
                   ++forks;
                   append_some(child);
                   append_some(parent);
               };
               uint32_t released_len = 0; // rows the last release freed (its stale fill included)
               // before a release, fill the sequence's tail up to a boundary with extreme rows (stale-slot trap)
               auto release_seq = [&](uint32_t seq, bool then_append) {
                   if (ss.stale_fill) {
                       const uint32_t target = boundary_at_or_above(hint, len[seq], cap);
                       const uint32_t n = target > len[seq] ? target - len[seq] : std::min(1u, cap - len[seq]);
                       if (n > 0 && (ss.chunked || n == 1)) push_append(seq, n, true);
                   }
                   Op op;
                   op.kind = OpKind::Release;
                   op.seq = seq;
                   released_len = len[seq];
                   len[seq] = 0; // stays usable: the next append restarts it
                   c.ops.push_back(op);
                   if (!then_append) return;
                   append_some(seq); // the released sequence restarts (its storage may be reused): counts
                   ++releases;
               };
               auto started = [&] {
                   std::vector<uint32_t> v;
                   for (uint32_t s = 0; s < S; ++s)
                       if (live[s] && len[s] > 0) v.push_back(s);
                   return v;
               };
               // a release while a fork sibling still shares the blocks (ScriptSpace::release_shared): a cache that
               // frees them regardless of who holds them hands the survivor's rows to the restarted sequence
               auto release_while_shared = [&] {
                   std::vector<uint32_t> empty;
                   for (uint32_t s = 0; s < S; ++s)
                       if (len[s] == 0) empty.push_back(s);
                   for (int guard = 0; empty.size() < 2 && guard < 4; ++guard) {
                       const std::vector<uint32_t> st = started();
                       if (st.empty()) break;
                       const uint32_t s = *rc::gen::elementOf(st).as("released to free a sequence");
                       release_seq(s, false);
                       empty.push_back(s);
                   }
                   // several full blocks of the hint or of the sizes caches pick (two of 16 at least), with room
                   // for one more row after
                   std::vector<uint32_t> lens;
                   for (uint64_t x : {uint64_t{2} * hint + 1, uint64_t{3} * hint, uint64_t{4} * hint + 1,
                                      uint64_t{33}, uint64_t{48}, uint64_t{64}, uint64_t{65}, uint64_t{129}})
                       if (x >= 33 && x < cap) lens.push_back(static_cast<uint32_t>(x));
                   if (lens.empty() && cap > 2) lens.push_back(cap - 1); // a short max_tokens: as long as it allows
                   if (empty.size() < 2 || lens.empty()) return;
                   const uint32_t L = *rc::gen::elementOf(lens).as("length a fork shares before a release");
                   const size_t at = *rc::gen::inRange<size_t>(0, empty.size()).as("parent sharing a release");
                   const uint32_t parent = empty[at], child = empty[(at + 1) % empty.size()];
                   push_append(parent, L);
                   push_fork(parent, child);
                   const bool child_goes = *rc::gen::arbitrary<bool>().as("release the child (else the parent)");
                   const uint32_t gone = child_goes ? child : parent, survivor = child_goes ? parent : child;
                   release_seq(gone, false);
                   // the restart takes every freed block back (and one block of 16 or the hint more)
                   push_append(gone, std::min(cap, released_len + std::max(hint, 16u) + 1));
                   append_some(survivor); // read back (unchanged rows) and attended (EQUIV)
               };
               auto started_with_room = [&] { // fork parents: both sides can be appended to afterwards
                   std::vector<uint32_t> v;
                   for (uint32_t s : started())
                       if (len[s] < cap) v.push_back(s);
                   return v;
               };

               if (ss.long_script) { // a few long appends, at the sizes where kernels change code paths
                   const uint32_t seq = [&] {
                       for (uint32_t s = 0; s < S; ++s)
                           if (live[s]) return s;
                       return 0u;
                   }();
                   // a prompt at 2^k or 2^k +- 1 (k = 8 .. 13), at 511 / 512 / 513, or anywhere in 1k - 2k
                   uint32_t k = *rc::gen::weightedElement<uint32_t>({{2, 8}, {3, 9}, {3, 10}, {2, 11}, {1, 12},
                                                                          {1, 13}})
                                           .as("prompt about 2^k");
                   // an implementation's own cost grows as T^2 * n_q_heads * head_dim: keep it near 2^28 at most
                   const double t_max = std::sqrt(static_cast<double>(1u << 28) / (c.cfg.n_q_heads * c.cfg.head_dim));
                   k = std::min<uint32_t>(k, static_cast<uint32_t>(std::floor(std::log2(t_max - 1))));
                   const int off = *rc::gen::elementOf(std::vector<int>{-1, 0, 1}).as("offset from 2^k");
                   const uint32_t prompt =
                       *rc::gen::weightedOneOf<uint32_t>(
                            {{3, rc::gen::just<uint32_t>(static_cast<uint32_t>(static_cast<int>(1u << k) + off))},
                             {1, rc::gen::inRange<uint32_t>(1000, 2001)}})
                            .as("long prompt");
                   push_append(seq, std::min(prompt, cap));
                   const uint32_t steps = *rc::gen::inRange<uint32_t>(1, 4).as("appends after the prompt");
                   for (uint32_t i = 0; i < steps && len[seq] < cap; ++i) {
                       // a chunk of 63 / 64 / 65 new tokens (where kernels switch to their prefill path), of a
                       // declared pipeline rule's edges, or decodes
                       std::vector<uint32_t> sizes = {1, 1, 2, 63, 64, 65};
                       sizes.insert(sizes.end(), rule_lengths.begin(), rule_lengths.end());
                       const uint32_t n = ss.chunked ? *rc::gen::elementOf(sizes).as("append") : 1u;
                       push_append(seq, std::min(n, cap - len[seq]));
                   }
                   draw_large_scores(cs, c.cfg);
                   return c;
               }
               const uint32_t n_ops = *rc::gen::inRange<uint32_t>(ss.min_ops, ss.max_ops + 1).as("number of ops");
               for (uint32_t i = 0; i < n_ops || total < ss.min_total_tokens; ++i) {
                   if (i > 4 * ss.max_ops + 64) break;
                   std::vector<uint32_t> live_ids;
                   for (uint32_t s = 0; s < S; ++s)
                       if (live[s]) live_ids.push_back(s);
                   const std::vector<uint32_t> st = started(); // fork and release need a started sequence
                   const std::vector<uint32_t> parents = started_with_room();
                   const int64_t free_id = ss.fork ? choose_free() : -1;
                   const uint32_t kind = *rc::gen::inRange<uint32_t>(0, 10).as("op kind");
                   if (ss.fork && kind >= 7 && free_id >= 0 && !parents.empty()) {
                       fork_around_boundary(*rc::gen::elementOf(parents).as("fork parent"), static_cast<uint32_t>(free_id));
                       continue;
                   }
                   if (ss.release && kind == 6 && !st.empty()) {
                       release_seq(*rc::gen::elementOf(st).as("released seq"), *rc::gen::arbitrary<bool>().as(
                                                                                   "append right after the release"));
                       continue;
                   }
                   Op op;
                   if (ss.batch && live_ids.size() > 1) {
                       op.kind = OpKind::AppendBatch;
                       // a subset of the sequences in any order, so batch slot i is rarely sequence i
                       std::vector<uint32_t> ids = live_ids; // shuffled (Fisher-Yates), then a prefix
                       for (size_t k = ids.size() - 1; k > 0; --k)
                           std::swap(ids[k], ids[*rc::gen::inRange<size_t>(0, k + 1).as("batch order")]);
                       ids.resize(*rc::gen::inRange<size_t>(2, ids.size() + 1).as("sequences in the batch"));
                       for (uint32_t s : ids) {
                           const uint32_t m = draw_append(s);
                           op.appends.push_back({s, m, false});
                           len[s] += m;
                           total += m;
                       }
                   } else {
                       op.kind = OpKind::Append;
                       const uint32_t s = *rc::gen::elementOf(live_ids).as("sequence");
                       const uint32_t m = draw_append(s);
                       op.appends.push_back({s, m, false});
                       len[s] += m;
                       total += m;
                   }
                   c.ops.push_back(op);
               }
               // every case of FORK and RELEASE exercises its operation several times (where the limits allow)
               for (int guard = 0; forks < ss.min_forks && guard < 8; ++guard) {
                   std::vector<uint32_t> st = started_with_room();
                   if (st.empty()) {
                       std::vector<uint32_t> any;
                       for (uint32_t s = 0; s < S; ++s)
                           if (len[s] < cap) any.push_back(s); // a fresh parent (room left for after the fork)
                       if (any.empty()) break;
                       const uint32_t room = cap - len[any.front()];
                       push_append(any.front(), std::max(1u, std::min(room - 1, *length_near_blocks(hint, cap).as("prompt"))));
                       continue;
                   }
                   const int64_t child = choose_free();
                   if (child < 0) break; // max_seqs leaves no room for another child
                   fork_around_boundary(*rc::gen::elementOf(st).as("fork parent"), static_cast<uint32_t>(child));
               }
               for (int guard = 0; releases < ss.min_releases && guard < 8; ++guard) {
                   std::vector<uint32_t> st = started();
                   if (st.empty()) {
                       std::vector<uint32_t> any;
                       for (uint32_t s = 0; s < S; ++s)
                           if (live[s] && len[s] < cap) any.push_back(s);
                       if (any.empty()) break;
                       append_some(any.front());
                       continue;
                   }
                   const uint32_t s = *rc::gen::elementOf(st).as("released seq");
                   release_seq(s, true);
                   std::vector<uint32_t> others;
                   for (uint32_t o : started())
                       if (o != s) others.push_back(o);
                   if (!others.empty()) append_some(*rc::gen::elementOf(others).as("another sequence"));
               }
               if (ss.release_shared) release_while_shared();
               if (ss.shuffle_layers)
                   for (Op& op : c.ops) {
                       if (op.kind != OpKind::Append && op.kind != OpKind::AppendBatch) continue;
                       op.layer_order.resize(c.cfg.n_layers);
                       std::iota(op.layer_order.begin(), op.layer_order.end(), 0u);
                       const uint32_t rot = *rc::gen::inRange<uint32_t>(0, c.cfg.n_layers).as("layer rotation");
                       const bool rev = *rc::gen::arbitrary<bool>().as("layers reversed");
                       std::rotate(op.layer_order.begin(), op.layer_order.begin() + rot, op.layer_order.end());
                       if (rev) std::reverse(op.layer_order.begin(), op.layer_order.end());
                   }
               draw_large_scores(cs, c.cfg);
               return c;
           })
        .as("case");
}

} // namespace kvc::prop::gens
