// Correct (and one overclaiming) KV caches whose attention arithmetic follows a declared rounding pipeline and a
// summation order, behind the plugin ABI: the whole suite — sessions, RoPE applied by the implementation, GQA,
// chunked appends — must pass each honest one and fail the ones that say less than they do. The arithmetic is the
// emulator's (pipeline_emulator.hpp); KVC_PIPE_DOUBLE selects the behaviour (CMakeLists.txt lists them).
//
// Storage is one contiguous stream per (sequence, layer); keys are rotated in float (f32 angles) and rounded to the
// cache dtype, as an ordinary implementation does.
#include "pipeline_emulator.hpp"

#include "kvcheck/abi.h"
#include "kvcheck/reference/dtype.hpp"

#include <cmath>
#include <cstring>
#include <string>
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

namespace {

using kvc::emu::Order;
using kvc::emu::Stages;

constexpr uint32_t C = KVC_ROUND_CACHE;

Stages stages() {
    switch (KVC_PIPE_DOUBLE) {
    case PIPE_ONLINE_Q_ACCUM: return {C, 0, 0, 0, C, 0};
    case PIPE_EAGER_ALL16:
    case PIPE_OVERCLAIM: return {C, C, C, C, C, C};
    case PIPE_SDPA16: return {C, C, 0, 0, 0, C};
    case PIPE_PROBS_PLAIN: return {0, 0, 0, C, 0, 0};
    default: return {};
    }
}

Order order() {
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

struct Stream {
    std::vector<float> k, v; // [len][Hkv*d] stored values (rounded to the cache dtype), widened
    uint32_t len = 0;
};

struct Cache {
    kvc_config cfg{};
    std::vector<std::vector<Stream>> streams; // [seq][layer]
    std::string error;
};

thread_local std::string g_create_error;

size_t row(const Cache& c) { return static_cast<size_t>(c.cfg.n_kv_heads) * c.cfg.head_dim; }

void rotate(const kvc_config& cfg, float* x, uint32_t pos) { // float RoPE, f32 angles
    if (cfg.rope == KVC_ROPE_NONE) return;
    const uint32_t d = cfg.head_dim, half = d / 2;
    for (uint32_t j = 0; j < half; ++j) {
        const float inv = std::pow(cfg.rope_theta, -2.0f * static_cast<float>(j) / static_cast<float>(d));
        const float a = static_cast<float>(pos) * inv, c = std::cos(a), s = std::sin(a);
        const uint32_t i0 = cfg.rope == KVC_ROPE_NEOX ? j : 2 * j, i1 = cfg.rope == KVC_ROPE_NEOX ? j + half : 2 * j + 1;
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
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
    kvc_caps c{};
    c.struct_size = sizeof c;
    c.dtypes = 0x7u;
    c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.features = KVC_FEATURE_GQA | KVC_FEATURE_CHUNKED;
    c.precision = KVC_PRECISION_F32;
    c.memory_space = KVC_MEMORY_HOST;
    const Stages st = stages();
    const bool declares = KVC_PIPE_DOUBLE != PIPE_OVERCLAIM && KVC_PIPE_DOUBLE != PIPE_NEW_ROWS_PLAIN &&
                          KVC_PIPE_DOUBLE != PIPE_PROBS_PLAIN;
    if (declares) {
        c.pipeline = {st.q, st.rope, st.scores, st.probs, st.accum, st.output, KVC_PIPELINE_DECLARED};
        if (KVC_PIPE_DOUBLE == PIPE_NEW_ROWS_DECL) c.pipeline.flags |= KVC_PIPELINE_NEW_ROWS_UNROUNDED;
    }
    const uint32_t n = out->struct_size < sizeof c ? out->struct_size : static_cast<uint32_t>(sizeof c);
    std::memcpy(out, &c, n);
    out->struct_size = n;
}

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (!cfg || !out || cfg->n_kv_heads == 0 || cfg->head_dim == 0 || cfg->n_q_heads % cfg->n_kv_heads != 0 ||
        cfg->cache_dtype > 2 || cfg->rope > 2 || (cfg->rope && cfg->head_dim % 2) || cfg->n_layers == 0 ||
        cfg->max_seqs == 0) {
        g_create_error = "unsupported or invalid config";
        return KVC_ERR_UNSUPPORTED;
    }
    auto* c = new Cache;
    c->cfg = *cfg;
    c->streams.assign(cfg->max_seqs, std::vector<Stream>(cfg->n_layers));
    *out = reinterpret_cast<kvc_cache*>(c);
    return KVC_OK;
}

void destroy(kvc_cache* cache) { delete reinterpret_cast<Cache*>(cache); }

const char* last_error(const kvc_cache* cache) {
    return cache ? reinterpret_cast<const Cache*>(cache)->error.c_str() : g_create_error.c_str();
}

kvc_status append_attend(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                         const float* k, const float* v, float* out) {
    Cache* c = reinterpret_cast<Cache*>(cache);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers) {
        c->error = "sequence or layer out of range";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    Stream& s = c->streams[seq][layer];
    if (c->cfg.max_tokens && s.len + n_new > c->cfg.max_tokens) {
        c->error = "max_tokens reached";
        return KVC_ERR_OUT_OF_MEMORY;
    }
    const size_t r = row(*c);
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
            er.scale = c->cfg.scale;
            er.theta = c->cfg.rope_theta;
            er.pos = before + i;
            er.q = q + (static_cast<size_t>(i) * Hq + h) * d;
            er.k = k_att.data() + static_cast<size_t>(h / group) * d;
            er.v = v_att.data() + static_cast<size_t>(h / group) * d;
            er.ld = r;
            er.n = before + i + 1;
            kvc::emu::attend(er, stages(), order(), out + (static_cast<size_t>(i) * Hq + h) * d, 7);
        }
    return KVC_OK;
}

kvc_status read_kv(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                   void* v_out) {
    Cache* c = reinterpret_cast<Cache*>(cache);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers || pos + n > c->streams[seq][layer].len) {
        c->error = "rows out of range";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    const Stream& s = c->streams[seq][layer];
    const size_t r = row(*c), es = c->cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2;
    for (size_t x = 0; x < n * r; ++x) {
        kvc::ref::store_dtype(s.k[pos * r + x], c->cfg.cache_dtype, static_cast<uint8_t*>(k_out) + x * es);
        kvc::ref::store_dtype(s.v[pos * r + x], c->cfg.cache_dtype, static_cast<uint8_t*>(v_out) + x * es);
    }
    return KVC_OK;
}

kvc_status seq_length(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t* length) {
    Cache* c = reinterpret_cast<Cache*>(cache);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers || !length) {
        c->error = "sequence or layer out of range";
        return KVC_ERR_INVALID_ARGUMENT;
    }
    *length = c->streams[seq][layer].len;
    return KVC_OK;
}

kvc_status memory(kvc_cache* cache, kvc_memory* out) {
    Cache* c = reinterpret_cast<Cache*>(cache);
    uint64_t live = 0, held = 0;
    const uint64_t rb = 2ull * row(*c) * (c->cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2);
    for (const auto& layers : c->streams)
        for (const Stream& s : layers) {
            live += s.len * rb;
            held += (s.k.capacity() + s.v.capacity()) * sizeof(float); // widened storage: all of it reported
        }
    kvc_memory m{};
    m.struct_size = sizeof m;
    m.block_size = 1;
    m.live_bytes = live;
    m.capacity_bytes = live;
    m.pool_bytes = held > live ? held - live : 0;
    const uint32_t n = out->struct_size < sizeof m ? out->struct_size : static_cast<uint32_t>(sizeof m);
    std::memcpy(out, &m, n);
    out->struct_size = n;
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api), KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR, "double-pipeline", "1",
    get_caps, create, destroy, last_error, append_attend, nullptr, read_kv, seq_length, memory, nullptr, nullptr};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major,
                                                                                             uint32_t /*minor*/) {
    return major == KVC_ABI_VERSION_MAJOR ? &kApi : nullptr;
}
