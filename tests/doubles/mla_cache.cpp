// Latent-attention (MLA) and partial-rotary caches behind the plugin ABI (docs/windowed-caches.md): V rows of their
// own size (head_dim_v) and RoPE on a range of the head dims. One correct cache and one deliberate bug each, to prove
// that the harness's checks of both shapes can fail and fail for the right reason.
// KVC_MLA_DOUBLE selects the behaviour at compile time (CMakeLists.txt lists them).
//
// Storage per (sequence, layer): K rows [n_kv_heads][head_dim] and V rows [n_kv_heads][head_dim_v] in two growing
// arrays, in the cache dtype, keys rotated at their absolute positions. Attention is f32 over the stored rows widened,
// one query row at a time, each row written before its own query attends.
#include "contiguous_cache.hpp"

#include <cmath>
#include <vector>

#ifndef KVC_MLA_DOUBLE
#error "define KVC_MLA_DOUBLE to one of the behaviours below"
#endif

#define MLA_CORRECT 0   // correct
#define MLA_V_FROM_K 1  // reads the appended v with K's row stride (head_dim a KV head): CACHE-CONTENT, EQUIV
#define MLA_ROPE_ALL 2  // rotates every dim of q and k though a range is declared: CACHE-CONTENT, EQUIV
#define MLA_MEMORY_2DK 3 // reports live bytes as if V rows had K's size (2 * head_dim a token): MEMORY
#define MLA_Q_BF16 4     // correct, with q rounded to bf16 before RoPE and that declared (pipeline q = bf16): passes

namespace {

struct Stream {
    uint32_t len = 0;
    std::vector<uint8_t> k, v;
};

struct Cache {
    kvc_config cfg{};
    std::vector<std::vector<Stream>> streams; // [seq][layer]
    std::string error;

    uint32_t dv() const { return cfg.head_dim_v ? cfg.head_dim_v : cfg.head_dim; }
    size_t es() const { return cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2; }
    size_t k_row() const { return size_t{cfg.n_kv_heads} * cfg.head_dim; } // elements of one token's K
    size_t v_row() const { return size_t{cfg.n_kv_heads} * dv(); }
    bool has(uint32_t seq, uint32_t layer) const { return seq < cfg.max_seqs && layer < cfg.n_layers; }
    kvc_status fail(kvc_status s, const std::string& m) {
        error = m;
        return s;
    }
};

Cache* self(kvc_cache* h) { return reinterpret_cast<Cache*>(h); }

// One head of q or k rotated in place at `pos` (in double, rounded once): dims [begin, begin + dims) as a head of
// their own, the whole head when no range is declared, or (the bug) always.
void rope(const Cache& c, float* x, uint32_t pos) {
    if (c.cfg.rope == KVC_ROPE_NONE) return;
    const bool whole = c.cfg.rope_dims == 0 || KVC_MLA_DOUBLE == MLA_ROPE_ALL;
    const uint32_t begin = whole ? 0 : c.cfg.rope_dim_begin, d = whole ? c.cfg.head_dim : c.cfg.rope_dims;
    for (uint32_t j = 0; j < d / 2; ++j) {
        const double a = pos * std::pow(static_cast<double>(c.cfg.rope_theta), -2.0 * j / d);
        const uint32_t i0 = begin + (c.cfg.rope == KVC_ROPE_NEOX ? j : 2 * j);
        const uint32_t i1 = begin + (c.cfg.rope == KVC_ROPE_NEOX ? j + d / 2 : 2 * j + 1);
        const double x0 = x[i0], x1 = x[i1];
        x[i0] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
        x[i1] = static_cast<float>(x0 * std::sin(a) + x1 * std::cos(a));
    }
}

// Appends row i of a call of n rows (k, v as the ABI lays them out) at the end of s.
void put(const Cache& c, Stream& s, uint32_t n, uint32_t i, const float* k, const float* v) {
    const size_t K = c.k_row(), V = c.v_row(), E = c.es(), d = c.cfg.head_dim;
    std::vector<float> kr(k + i * K, k + (i + 1) * K);
    for (uint32_t h = 0; h < c.cfg.n_kv_heads; ++h) rope(c, kr.data() + h * d, s.len);
    s.k.resize((size_t{s.len} + 1) * K * E);
    s.v.resize((size_t{s.len} + 1) * V * E);
    for (size_t x = 0; x < K; ++x) kvc::ref::store_dtype(kr[x], c.cfg.cache_dtype, s.k.data() + (s.len * K + x) * E);
    for (size_t x = 0; x < V; ++x) {
        // the bug reads head h of row i at (i * n_kv_heads + h) * head_dim; modulo the call's v, so that the double
        // itself stays inside the caller's buffer where a real kernel would read past it
        const size_t hr = i * c.cfg.n_kv_heads + x / c.dv();
        const size_t src = KVC_MLA_DOUBLE == MLA_V_FROM_K ? (hr * d + x % c.dv()) % (size_t{n} * V) : i * V + x;
        kvc::ref::store_dtype(v[src], c.cfg.cache_dtype, s.v.data() + (s.len * V + x) * E);
    }
    ++s.len;
}

// Query row i of a call (query heads at q) against the rows of s up to its position, into out (dv per head).
void attend(const Cache& c, const Stream& s, const float* q, uint32_t pos, float* out) {
    const uint32_t d = c.cfg.head_dim, dv = c.dv(), Hq = c.cfg.n_q_heads, group = Hq / c.cfg.n_kv_heads;
    const size_t E = c.es();
    std::vector<float> qr(d), sc(pos + 1);
    for (uint32_t hq = 0; hq < Hq; ++hq) {
        const uint32_t g = hq / group;
        std::copy(q + size_t{hq} * d, q + size_t{hq + 1} * d, qr.begin());
        if (KVC_MLA_DOUBLE == MLA_Q_BF16)
            for (float& x : qr) {
                uint8_t b[2];
                kvc::ref::store_dtype(x, KVC_DTYPE_BF16, b);
                x = kvc::ref::load_dtype(b, KVC_DTYPE_BF16);
            }
        rope(c, qr.data(), pos);
        float m = -INFINITY;
        for (uint32_t j = 0; j <= pos; ++j) {
            const uint8_t* kr = s.k.data() + (j * c.k_row() + size_t{g} * d) * E;
            float dot = 0;
            for (uint32_t x = 0; x < d; ++x) dot += qr[x] * kvc::ref::load_dtype(kr + x * E, c.cfg.cache_dtype);
            sc[j] = dot * c.cfg.scale;
            m = std::max(m, sc[j]);
        }
        float l = 0;
        for (float& x : sc) l += (x = std::exp(x - m));
        float* o = out + size_t{hq} * dv;
        std::fill(o, o + dv, 0.f);
        for (uint32_t j = 0; j <= pos; ++j) {
            const uint8_t* vr = s.v.data() + (j * c.v_row() + size_t{g} * dv) * E;
            for (uint32_t x = 0; x < dv; ++x) o[x] += sc[j] * kvc::ref::load_dtype(vr + x * E, c.cfg.cache_dtype);
        }
        for (uint32_t x = 0; x < dv; ++x) o[x] /= l;
    }
}

void get_caps(kvc_caps* out) {
    kvc_caps c = kvc::dbl::host_caps(0x7u, KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE |
                                               KVC_FEATURE_CHUNKED | KVC_FEATURE_HEAD_DIM_V | KVC_FEATURE_ROPE_RANGE);
    c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.max_head_dim = 576;
    c.max_head_dim_v = 512;
    if (KVC_MLA_DOUBLE == MLA_Q_BF16)
        c.pipeline = {KVC_ROUND_BF16, KVC_ROUND_F32, KVC_ROUND_F32, KVC_ROUND_F32, KVC_ROUND_F32, KVC_ROUND_F32,
                      KVC_PIPELINE_DECLARED};
    kvc::dbl::put_caps(out, c);
}

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (kvc::dbl::refuses(cfg, out, 0x7u, true)) return KVC_ERR_UNSUPPORTED;
    const bool range_ok = cfg->rope_dims == 0 ? cfg->rope_dim_begin == 0
                                              : cfg->rope_dims % 2 == 0 && cfg->rope != KVC_ROPE_NONE &&
                                                    uint64_t{cfg->rope_dim_begin} + cfg->rope_dims <= cfg->head_dim;
    if (cfg->struct_size < offsetof(kvc_config, rope_dims) + sizeof cfg->rope_dims || cfg->windows ||
        cfg->head_dim_v > 512 || !range_ok) {
        kvc::dbl::create_error = "a config before ABI 1.2, with windows, head_dim_v > 512 or an invalid RoPE range";
        return KVC_ERR_UNSUPPORTED;
    }
    auto* c = new Cache;
    c->cfg = *cfg;
    c->streams.assign(cfg->max_seqs, std::vector<Stream>(cfg->n_layers));
    *out = reinterpret_cast<kvc_cache*>(c);
    return KVC_OK;
}

void destroy(kvc_cache* h) { delete self(h); }
const char* last_error(const kvc_cache* h) {
    return h ? reinterpret_cast<const Cache*>(h)->error.c_str() : kvc::dbl::create_error.c_str();
}

kvc_status append_attend(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                         const float* v, float* out) {
    Cache* c = self(h);
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    Stream& s = c->streams[seq][layer];
    if (uint64_t{s.len} + n_new > c->cfg.max_tokens) return c->fail(KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    const size_t qrow = size_t{c->cfg.n_q_heads} * c->cfg.head_dim, orow = size_t{c->cfg.n_q_heads} * c->dv();
    for (uint32_t i = 0; i < n_new; ++i) {
        put(*c, s, n_new, i, k, v);
        attend(*c, s, q + i * qrow, s.len - 1, out + i * orow);
    }
    return KVC_OK;
}

kvc_status read_kv(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    Cache* c = self(h);
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    const Stream& s = c->streams[seq][layer];
    if (uint64_t{pos} + n > s.len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "read past the end");
    const size_t kb = c->k_row() * c->es(), vb = c->v_row() * c->es();
    std::memcpy(k_out, s.k.data() + pos * kb, n * kb);
    std::memcpy(v_out, s.v.data() + pos * vb, n * vb);
    return KVC_OK;
}

kvc_status seq_length(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t* len) {
    Cache* c = self(h);
    if (!c->has(seq, layer) || !len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    *len = c->streams[seq][layer].len;
    return KVC_OK;
}

// Exact per token: live = capacity = len * n_kv_heads * (head_dim + head_dim_v) * element size; what the arrays hold
// beyond it is pool.
kvc_status memory(kvc_cache* h, kvc_memory* out) {
    Cache* c = self(h);
    const uint64_t rb = (c->k_row() + (KVC_MLA_DOUBLE == MLA_MEMORY_2DK ? c->k_row() : c->v_row())) * c->es();
    uint64_t live = 0, held = 0;
    for (const auto& seq : c->streams)
        for (const Stream& s : seq) {
            live += uint64_t{s.len} * rb;
            held += s.k.capacity() + s.v.capacity();
        }
    kvc_memory m{};
    m.struct_size = sizeof m;
    m.block_size = 1;
    m.live_bytes = live;
    m.capacity_bytes = (c->k_row() + c->v_row()) * c->es() * (live / rb); // what it holds, whatever it says
    m.pool_bytes = held > live ? held - live : 0;
    kvc::dbl::put_memory(out, m);
    return KVC_OK;
}

kvc_status fork(kvc_cache* h, uint32_t parent, uint32_t child) {
    Cache* c = self(h);
    if (parent >= c->cfg.max_seqs || child >= c->cfg.max_seqs || parent == child)
        return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad fork");
    bool started = false;
    for (const Stream& s : c->streams[parent]) started = started || s.len > 0;
    if (!started) return c->fail(KVC_ERR_INVALID_ARGUMENT, "fork of an empty parent");
    c->streams[child] = c->streams[parent];
    return KVC_OK;
}

kvc_status release(kvc_cache* h, uint32_t seq) {
    Cache* c = self(h);
    if (seq >= c->cfg.max_seqs) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq");
    bool started = false;
    for (const Stream& s : c->streams[seq]) started = started || s.len > 0;
    if (!started) return c->fail(KVC_ERR_INVALID_ARGUMENT, "release of an empty sequence");
    for (Stream& s : c->streams[seq]) s = Stream{};
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api), KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR, "mla-double", "1",
    get_caps, create, destroy, last_error, append_attend, nullptr, read_kv, seq_length, memory, fork, release,
    nullptr};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major,
                                                                                            uint32_t) {
    return major == KVC_ABI_VERSION_MAJOR ? &kApi : nullptr;
}
