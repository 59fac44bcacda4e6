// Correct (and one overclaiming) KV caches whose attention arithmetic follows a declared rounding pipeline and a
// summation order, behind the plugin ABI: the whole suite — sessions, RoPE applied by the implementation, GQA,
// chunked appends — must pass each honest one and fail the ones that say less than they do. The arithmetic is the
// emulator's (pipeline_emulator.hpp); KVC_PIPE_DOUBLE selects the behaviour (CMakeLists.txt lists them).
//
// Storage is the plain contiguous cache (contiguous_cache.hpp), the stored values widened to float; keys are
// rotated in float (f32 angles) and rounded to the cache dtype, as an ordinary implementation does.
#include "contiguous_cache.hpp"
#include "pipeline_emulator.hpp"

#include <cmath>
#include <vector>

#ifndef KVC_PIPE_DOUBLE
#error "define KVC_PIPE_DOUBLE to one of the behaviours below"
#endif

#define PIPE_ONLINE_Q_ACCUM 0  // q and accumulator in the cache dtype, online softmax re-rounding: declared so
#define PIPE_EAGER_ALL16 1     // every stage in the cache dtype, eager probabilities: declared so
#define PIPE_SPLIT_F32 2       // f32, split-KV over 7-row chunks merged: declared f32
#define PIPE_SDPA16 3          // q, RoPE tables and output in the cache dtype, reverse two-pass: declared so
#define PIPE_NEW_ROWS_PLAIN 4  // f32 arithmetic over the call's new rows *unrounded*, declares plain f32: fails
#define PIPE_NEW_ROWS_DECL 5   // the same, declaring KVC_PIPELINE_NEW_ROWS_UNROUNDED: passes with a note
#define PIPE_OVERCLAIM 6       // every stage in the cache dtype, declares f32: fails
#define PIPE_KEYS_TRUNCATED 7  // f32, but rotated keys stored rounded toward zero in 16 bits: CACHE-CONTENT fails
#define PIPE_PROBS_PLAIN 8     // probabilities rounded to the cache dtype before P.V, declares f32: EQUIV fails
#define PIPE_FIXED_DECL 9      // f32, RoPE base 10000 and scale 1/sqrt(d) hard-coded, declared fixed: passes
#define PIPE_FIXED_PLAIN 10    // the same arithmetic, not declared: EQUIV (and CACHE-CONTENT on RoPE keys) fail
#define PIPE_ROPE16_DECL 11    // f32, but RoPE's cos, sin and products in f16 (q and keys) on every dtype: declared
#define PIPE_ROPE16_PLAIN 12   // the same, declares f32: EQUIV and CACHE-CONTENT fail on RoPE cases, naming the stage
// A ggml-like CPU flash attention (ABI 1.3 pipeline rules): an f16 cache rounds q to f16 and accumulates V in f16 on
// calls of fewer than 64 rows and takes an all-f32 tiled path from 64; a bf16 cache rounds q to bf16 and
// accumulates in f32; an f32 cache is f32 throughout.
#define PIPE_GGML_RULES 13     // declares exactly that with rules: passes
#define PIPE_GGML_F32 14       // the same kernel declaring f32 for every call, no rules: EQUIV fails
#define PIPE_GGML_LONG16 15    // f16 accumulation on chunks of 64 rows and more too, declaring the rules of 13: fails
#define PIPE_GGML_LOOSEST 16   // the kernel of 13 declaring one pipeline, the loosest of its paths: passes, looser
#define PIPE_GGML_BAD_RULES 17 // the rules of 13, one covering a dtype it does not declare: refused at load

namespace {

using kvc::emu::Order;
using kvc::emu::Stages;

constexpr uint32_t C = KVC_ROUND_CACHE;
constexpr bool kGgml = KVC_PIPE_DOUBLE >= PIPE_GGML_RULES && KVC_PIPE_DOUBLE <= PIPE_GGML_BAD_RULES;
constexpr uint32_t kTiledFrom = 64; // the ggml-like kernel's all-f32 path: calls appending this many rows or more

// The ggml-like kernel's arithmetic for a call appending n_new rows to a cache of this dtype.
Stages ggml_stages(uint32_t dtype, uint32_t n_new) {
    const bool long16 = KVC_PIPE_DOUBLE == PIPE_GGML_LONG16;
    if (dtype == KVC_DTYPE_F16 && (n_new < kTiledFrom || long16)) return {C, 0, 0, 0, C, 0};
    if (dtype == KVC_DTYPE_BF16) return {C, 0, 0, 0, 0, 0};
    return {};
}

Stages stages(uint32_t dtype, uint32_t n_new) {
    if (kGgml) return ggml_stages(dtype, n_new);
    switch (KVC_PIPE_DOUBLE) {
    case PIPE_ONLINE_Q_ACCUM: return {C, 0, 0, 0, C, 0};
    case PIPE_EAGER_ALL16:
    case PIPE_OVERCLAIM: return {C, C, C, C, C, C};
    case PIPE_SDPA16: return {C, C, 0, 0, 0, C};
    case PIPE_PROBS_PLAIN: return {0, 0, 0, C, 0, 0};
    case PIPE_ROPE16_DECL:
    case PIPE_ROPE16_PLAIN: return {0, KVC_ROUND_F16, 0, 0, 0, 0};
    default: return {};
    }
}

Order order(uint32_t n_new) {
    if (kGgml) return n_new < kTiledFrom ? Order::OnlineForward : Order::SplitKV; // the tiled path merges tiles
    switch (KVC_PIPE_DOUBLE) {
    case PIPE_ONLINE_Q_ACCUM: return Order::OnlineForward;
    case PIPE_EAGER_ALL16:
    case PIPE_OVERCLAIM: return Order::Eager;
    case PIPE_SPLIT_F32: return Order::SplitKV;
    case PIPE_SDPA16: return Order::TwoPassReverse;
    default: return Order::TwoPassForward;
    }
}

constexpr bool kNewRowsUnrounded = KVC_PIPE_DOUBLE == PIPE_NEW_ROWS_PLAIN || KVC_PIPE_DOUBLE == PIPE_NEW_ROWS_DECL;

using Cache = kvc::dbl::Cache<float>;

// What a kernel that hard-codes its parameters computes with, whatever the config says.
constexpr bool kHardCoded = KVC_PIPE_DOUBLE == PIPE_FIXED_DECL || KVC_PIPE_DOUBLE == PIPE_FIXED_PLAIN;
float theta_used(const kvc_config& cfg) { return kHardCoded ? 10000.0f : cfg.rope_theta; }
float scale_used(const kvc_config& cfg) {
    return kHardCoded ? 1.0f / std::sqrt(static_cast<float>(cfg.head_dim)) : cfg.scale;
}

constexpr bool kRope16 = KVC_PIPE_DOUBLE == PIPE_ROPE16_DECL || KVC_PIPE_DOUBLE == PIPE_ROPE16_PLAIN;
float rope_round(float x) { return kRope16 ? kvc::ref::round_to_dtype(x, KVC_DTYPE_F16) : x; }

void rotate(const kvc_config& cfg, float* x, uint32_t pos) { // float RoPE, f32 angles (f16 tables: kRope16)
    if (cfg.rope == KVC_ROPE_NONE) return;
    const uint32_t d = cfg.head_dim, half = d / 2;
    for (uint32_t j = 0; j < half; ++j) {
        const float inv = std::pow(theta_used(cfg), -2.0f * static_cast<float>(j) / static_cast<float>(d));
        const float a = static_cast<float>(pos) * inv, c = rope_round(std::cos(a)), s = rope_round(std::sin(a));
        const uint32_t i0 = cfg.rope == KVC_ROPE_NEOX ? j : 2 * j, i1 = cfg.rope == KVC_ROPE_NEOX ? j + half : 2 * j + 1;
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = rope_round(rope_round(x0 * c) - rope_round(x1 * s));
        x[i1] = rope_round(rope_round(x0 * s) + rope_round(x1 * c));
    }
}

// x in the cache dtype rounded toward zero, as a conversion that drops the low bits does: within one unit of the
// dtype of the nearest value, so only the shape of the rounding (not a bound of units) can tell it apart.
float truncate_to_dtype(float x, uint32_t dtype) {
    const float r = kvc::ref::round_to_dtype(x, dtype);
    if (dtype == KVC_DTYPE_F32 || std::fabs(r) <= std::fabs(x)) return r;
    uint16_t b = dtype == KVC_DTYPE_F16 ? kvc::ref::f16_bits(r) : kvc::ref::bf16_bits(r);
    b = static_cast<uint16_t>((b & 0x8000u) | ((b & 0x7fffu) - 1u)); // one unit toward zero
    return dtype == KVC_DTYPE_F16 ? kvc::ref::f16_value(b) : kvc::ref::bf16_value(b);
}

void get_caps(kvc_caps* out) {
    kvc_caps c = kvc::dbl::host_caps(0x7u, KVC_FEATURE_GQA | KVC_FEATURE_CHUNKED);
    c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    const Stages st = stages(KVC_DTYPE_F32, 1);
    const bool declares = KVC_PIPE_DOUBLE != PIPE_OVERCLAIM && KVC_PIPE_DOUBLE != PIPE_NEW_ROWS_PLAIN &&
                          KVC_PIPE_DOUBLE != PIPE_PROBS_PLAIN && KVC_PIPE_DOUBLE != PIPE_ROPE16_PLAIN && !kGgml;
    if (declares) {
        c.pipeline = {st.q, st.rope, st.scores, st.probs, st.accum, st.output, KVC_PIPELINE_DECLARED};
        if (KVC_PIPE_DOUBLE == PIPE_NEW_ROWS_DECL) c.pipeline.flags |= KVC_PIPELINE_NEW_ROWS_UNROUNDED;
    }
    if (KVC_PIPE_DOUBLE == PIPE_GGML_RULES || KVC_PIPE_DOUBLE == PIPE_GGML_LONG16 ||
        KVC_PIPE_DOUBLE == PIPE_GGML_BAD_RULES) {
        // the first rule covering a call grades it: the f16 tiled path before the f16 short-call rule
        c.pipeline = {0, 0, 0, 0, 0, 0, KVC_PIPELINE_DECLARED};
        c.n_pipeline_rules = 3;
        c.pipeline_rules[0] = {1u << KVC_DTYPE_F16, kTiledFrom, {0, 0, 0, 0, 0, 0, KVC_PIPELINE_DECLARED}};
        c.pipeline_rules[1] = {1u << KVC_DTYPE_F16, 0, {C, 0, 0, 0, C, 0, KVC_PIPELINE_DECLARED}};
        c.pipeline_rules[2] = {1u << KVC_DTYPE_BF16, 0, {C, 0, 0, 0, 0, 0, KVC_PIPELINE_DECLARED}};
    }
    if (KVC_PIPE_DOUBLE == PIPE_GGML_BAD_RULES) c.pipeline_rules[2].cache_dtypes |= 1u << KVC_DTYPE_Q8_0;
    if (KVC_PIPE_DOUBLE == PIPE_GGML_F32) c.pipeline = {0, 0, 0, 0, 0, 0, KVC_PIPELINE_DECLARED};
    // the loosest single declaration covering every path: q and accumulator in the cache dtype
    if (KVC_PIPE_DOUBLE == PIPE_GGML_LOOSEST) c.pipeline = {C, 0, 0, 0, C, 0, KVC_PIPELINE_DECLARED};
    if (KVC_PIPE_DOUBLE == PIPE_FIXED_DECL) {
        c.fixed_rope_theta = 10000.0f;
        c.fixed_scale = KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM;
    }
    kvc::dbl::put_caps(out, c);
}

kvc_status append_attend(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                         const float* k, const float* v, float* out) {
    Cache* c = kvc::dbl::self<Cache>(cache);
    const kvc_status status = kvc::dbl::check_append(c, seq, layer, n_new);
    if (status != KVC_OK) return status;
    Cache::Stream& s = c->streams[seq][layer];
    const size_t r = c->row();
    const uint32_t before = s.len, d = c->cfg.head_dim, Hkv = c->cfg.n_kv_heads, Hq = c->cfg.n_q_heads;
    // what this call attends: the stored rows, and its own new rows stored (or, unrounded, as given)
    std::vector<float> k_att = s.k, v_att = s.v;
    for (uint32_t i = 0; i < n_new; ++i) {
        std::vector<float> kr(k + i * r, k + (i + 1) * r);
        for (uint32_t h = 0; h < Hkv; ++h) rotate(c->cfg, kr.data() + h * d, before + i);
        for (size_t x = 0; x < r; ++x) {
            const bool truncates = KVC_PIPE_DOUBLE == PIPE_KEYS_TRUNCATED && c->cfg.rope != KVC_ROPE_NONE;
            const float ks = truncates ? truncate_to_dtype(kr[x], c->cfg.cache_dtype)
                                       : kvc::ref::round_to_dtype(kr[x], c->cfg.cache_dtype);
            const float vs = kvc::ref::round_to_dtype(v[i * r + x], c->cfg.cache_dtype);
            s.k.push_back(ks);
            s.v.push_back(vs);
            k_att.push_back(kNewRowsUnrounded ? kr[x] : ks);
            v_att.push_back(kNewRowsUnrounded ? v[i * r + x] : vs);
        }
    }
    s.len += n_new;
    const uint32_t group = Hq / Hkv;
    for (uint32_t i = 0; i < n_new; ++i)
        for (uint32_t h = 0; h < Hq; ++h) {
            kvc::emu::Row er;
            er.d = d;
            er.dtype = c->cfg.cache_dtype;
            er.rope = c->cfg.rope;
            er.scale = scale_used(c->cfg);
            er.theta = theta_used(c->cfg);
            er.pos = before + i;
            er.q = q + (static_cast<size_t>(i) * Hq + h) * d;
            er.k = k_att.data() + static_cast<size_t>(h / group) * d;
            er.v = v_att.data() + static_cast<size_t>(h / group) * d;
            er.ld = r;
            er.n = before + i + 1;
            kvc::emu::attend(er, stages(c->cfg.cache_dtype, n_new), order(n_new),
                             out + (static_cast<size_t>(i) * Hq + h) * d, 7);
        }
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api),
    KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "double-pipeline",
    "1",
    get_caps,
    kvc::dbl::create<Cache, 0x7u, true>,
    kvc::dbl::destroy<Cache>,
    kvc::dbl::last_error<Cache>,
    append_attend,
    nullptr,
    kvc::dbl::read_kv<Cache>,
    kvc::dbl::seq_length<Cache>,
    kvc::dbl::memory<Cache>,
    nullptr,
    nullptr,
    nullptr, // read_kv_scales: no quantized dtype declared
};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major,
                                                                                             uint32_t /*minor*/) {
    return major == KVC_ABI_VERSION_MAJOR ? &kApi : nullptr;
}
