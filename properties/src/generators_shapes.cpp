// The shapes beyond a plain cache, drawn onto the case config() drew: windows and sinks (with eviction), MLA
// (K rows of latent + RoPE dims, V rows of the latent dims) and partial rotary (RoPE on a range of the head dims).
#include "generators_shapes.hpp"

#include "kvcheck/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvc::prop::gens {

namespace {

// An MLA shape (d_c latent dims, r RoPE dims): K rows of d_c + r dims, V rows of d_c, RoPE on the last r when a range
// is declared. The real shape (512 + 64) in one case of five, the small ones of the same form otherwise; only those
// inside the declared limits and head_dim granularity. {0, 0} when none fits.
std::pair<uint32_t, uint32_t> draw_mla_dims(const ConfigSpace& space, bool rope) {
    const kvc_caps& a = space.allow;
    const uint32_t m = rope ? lcm(head_dim_multiple(a, true), 2u) : head_dim_multiple(a, false);
    const uint32_t max_v = a.max_head_dim_v ? a.max_head_dim_v : a.max_head_dim;
    const auto fits = [&](uint32_t dc, uint32_t r) {
        return (dc + r) % m == 0 && (!a.max_head_dim || dc + r <= a.max_head_dim) && (!max_v || dc <= max_v);
    };
    if (fits(512, 64) && *rc::gen::weightedElement<bool>({{4, false}, {1, true}}).as("MLA 576/512/64")) return {512, 64};
    std::vector<std::pair<uint32_t, uint32_t>> small;
    for (uint32_t dc : {8u, 16u, 32u, 64u})
        for (uint32_t r : {2u, 4u, 8u})
            if (fits(dc, r)) small.emplace_back(dc, r);
    if (small.empty()) return {0, 0};
    return *rc::gen::elementOf(small).as("MLA d_c, r");
}

} // namespace

// Latent (MLA) and partial-rotary shapes where the caps declare them (KVC_FEATURE_HEAD_DIM_V, KVC_FEATURE_ROPE_RANGE
// with a RoPE variant), for the 16-bit and f32 dtypes. Drawn after the sizes, so that a case for an implementation
// that declares neither draws what it always drew. MLA: one KV head read by every query head (MQA), K = [latent |
// rope part], V = the latent part. Partial rotary: RoPE on a prefix of half or a quarter of the head.
void draw_latent(const ConfigSpace& space, CaseConfig& c) {
    const bool dv_ok = has(space.allow.features, KVC_FEATURE_HEAD_DIM_V);
    const bool range_ok = has(space.allow.features, KVC_FEATURE_ROPE_RANGE) && c.rope != KVC_ROPE_NONE;
    if ((!dv_ok && !range_ok) || space.long_cases || space.large_queries || dtype_is_quantized(c.cache_dtype)) return;
    // 0: neither, 1: MLA, 2: partial rotary, weighted 2 : 2 : 1 among those declared
    std::vector<uint32_t> kinds{0u, 0u};
    if (dv_ok) kinds.insert(kinds.end(), {1u, 1u});
    if (range_ok) kinds.push_back(2u);
    const uint32_t kind = *rc::gen::elementOf(kinds).as("latent shape");
    if (kind == 2) {
        const uint32_t d = c.head_dim, part = *rc::gen::elementOf(std::vector<uint32_t>{2, 4}).as("rotary 1/part");
        if (d % (2 * part) != 0) return; // rope_dims even
        c.rope_dim_begin = 0;
        c.rope_dims = d / part;
        return;
    }
    if (kind != 1) return;
    const auto [dc, r] = draw_mla_dims(space, c.rope != KVC_ROPE_NONE);
    if (dc == 0) return;
    c.head_dim = dc + r;
    c.head_dim_v = dc;
    if (range_ok) {
        c.rope_dim_begin = dc;
        c.rope_dims = r;
    }
    c.n_kv_heads = 1;
    uint32_t hq = has(space.allow.features, KVC_FEATURE_GQA)
                      ? *rc::gen::elementOf(std::vector<uint32_t>{2, 3, 4, 8}).as("MLA query heads")
                      : 1u;
    if (space.allow.max_q_heads) hq = std::min(hq, space.allow.max_q_heads);
    c.n_q_heads = hq;
    c.max_tokens = wide_shape_tokens(c.n_q_heads * c.head_dim * c.n_layers, c.max_tokens);
    // config() sized max_seqs for the head dim drawn before this one: a wider latent head must not multiply it
    c.max_seqs = std::min(c.max_seqs, 32u);
    if (dc >= 512) { // the real shape is wide: one layer, few sequences keep it as cheap as a common case; 64
                     // tokens still fit one page of the 64-token pages MLA kernels use (block_size <= max_tokens)
        c.n_layers = std::min(c.n_layers, std::max(space.min_layers, 1u));
        c.n_q_heads = std::min(c.n_q_heads, 4u);
        c.max_tokens = std::min(c.max_tokens, 64u);
        c.max_seqs = std::min(c.max_seqs, 6u);
    }
}

// Windows, sinks and eviction where declared, drawn after everything else so that a case for an implementation
// without windows draws what it always drew. Windows are short next to the sequences (max_tokens 100-300), so rings
// wrap many times; some layers keep full attention (Gemma's interleaving); W = 1 (a query sees itself only) and
// windows at block sizes +-1 are where ring and block arithmetic goes wrong.
void draw_windows(const ConfigSpace& space, CaseConfig& c) {
    if (!has(space.allow.features, KVC_FEATURE_WINDOW) || space.long_cases) return;
    if (!*rc::gen::weightedElement<bool>({{1, false}, {2, true}}).as("windowed")) return;
    const uint32_t max_w = space.allow.max_window ? space.allow.max_window : UINT32_MAX;
    for (uint32_t l = 0; l < c.n_layers; ++l) {
        uint32_t w = *rc::gen::weightedOneOf<uint32_t>(
                          {{1, rc::gen::just<uint32_t>(0u)},
                           {1, rc::gen::elementOf(std::vector<uint32_t>{1, 2, 3})},
                           {3, rc::gen::elementOf(std::vector<uint32_t>{7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65})},
                           {2, rc::gen::inRange<uint32_t>(1, 80)}})
                          .as("window");
        c.windows.push_back(std::min(w, max_w));
    }
    if (!c.windowed()) c.windows[0] = std::min(16u, max_w); // a windowed case has a window somewhere
    if (has(space.allow.features, KVC_FEATURE_SINKS)) {
        const uint32_t max_s = space.allow.max_sinks ? space.allow.max_sinks : UINT32_MAX;
        c.n_sinks = std::min(max_s, *rc::gen::weightedOneOf<uint32_t>({{2, rc::gen::just<uint32_t>(0u)},
                                                                       {2, rc::gen::elementOf(std::vector<uint32_t>{
                                                                               1, 2, 4, 16, 17})},
                                                                       {1, rc::gen::inRange<uint32_t>(1, 40)}})
                                                 .as("sinks"));
    }
    if (has(space.allow.features, KVC_FEATURE_EVICT)) c.evict = *rc::gen::arbitrary<bool>().as("evict");
}

} // namespace kvc::prop::gens
