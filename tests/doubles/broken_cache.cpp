// Deliberately broken (and deliberately different-but-correct) KV caches behind the plugin ABI: the test doubles
// that prove each property can fail, and fails for the right reason. One source, one shared library per behaviour:
// KVC_DOUBLE selects it at compile time (CMakeLists.txt lists them).
//
// The base is a plain contiguous cache (one growing array per sequence and layer), exact in f32, no RoPE.
#include "fault.h"
#include "kvcheck/abi.h"
#include "kvcheck/reference/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifndef KVC_DOUBLE
#error "define KVC_DOUBLE to one of the behaviours below"
#endif

#define DOUBLE_CORRECT 0      // correct: the control
#define DOUBLE_Q_KEEPER 1     // keeps every past query (unreported) and lets it nudge outputs: NO-Q
#define DOUBLE_REWRITER 2     // flips the lowest bit of the first stored key on every append: APPEND-ONLY
#define DOUBLE_SKIP_SELF 3    // a query does not see its own key (off by one position): EQUIV
#define DOUBLE_REVERSE_SUM 4  // sums keys last-to-first with a two-pass softmax: correct, passes EQUIV
#define DOUBLE_F16_ACCUM 5    // rounds q and accumulates V in the cache dtype while declaring f32: EQUIV
#define DOUBLE_F16_HONEST 6   // the same arithmetic, declared as such: passes, graded below f32
#define DOUBLE_TILE 7         // query head h reads KV head h % n_kv ("tile"): GQA
#define DOUBLE_CRASH 8        // dereferences NULL when a sequence reaches 5 tokens: CRASH
#define DOUBLE_HANG 9         // never returns when a sequence reaches 5 tokens: TIMEOUT
#define DOUBLE_NEWER_ABI 10   // a table of ABI major version 2: refused at load
#define DOUBLE_MISREPORT 11   // reports live bytes with n_q_heads instead of n_kv_heads: MEMORY
#define DOUBLE_Q_HOARDER 12   // keeps every query (unreported heap) but never uses it: NO-Q's allocator watch
#define DOUBLE_DECLARES_NOTHING 13 // declares no cache dtype, so every case is NOT_SUPPORTED: not conformant

namespace {

struct Stream {
    std::vector<uint8_t> k, v; // [len][Hkv*d] in the cache dtype
    uint32_t len = 0;
};

struct Cache {
    kvc_config cfg{};
    std::vector<std::vector<Stream>> streams; // [seq][layer]
    std::vector<float> past_q;                // DOUBLE_Q_KEEPER's hidden store
    std::string error;
};

thread_local std::string g_create_error;

size_t es(const Cache& c) { return c.cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2; }
size_t row(const Cache& c) { return static_cast<size_t>(c.cfg.n_kv_heads) * c.cfg.head_dim; }

kvc_status fail(Cache* c, kvc_status s, const std::string& m) {
    c->error = m;
    return s;
}

void get_caps(kvc_caps* out) {
    kvc_caps c{};
    c.struct_size = sizeof c;
    c.dtypes = KVC_DOUBLE == DOUBLE_REWRITER ? 1u : KVC_DOUBLE == DOUBLE_DECLARES_NOTHING ? 0u : 0x7u;
    c.features = KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED;
    c.precision = KVC_DOUBLE == DOUBLE_F16_HONEST ? KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE : KVC_PRECISION_F32;
    c.memory_space = KVC_MEMORY_HOST;
    const uint32_t n = std::min<uint32_t>(out->struct_size, sizeof c);
    std::memcpy(out, &c, n);
    out->struct_size = n;
}

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (!cfg || !out || cfg->n_kv_heads == 0 || cfg->head_dim == 0 || cfg->n_q_heads % cfg->n_kv_heads != 0 ||
        cfg->cache_dtype > 2 || cfg->rope != KVC_ROPE_NONE || cfg->n_layers == 0 || cfg->max_seqs == 0) {
        g_create_error = "unsupported or invalid config";
        return KVC_ERR_UNSUPPORTED;
    }
    auto* c = new Cache;
    c->cfg = *cfg;
    c->streams.assign(cfg->max_seqs, std::vector<Stream>(cfg->n_layers));
    *out = reinterpret_cast<kvc_cache*>(c);
    return KVC_OK;
}

void destroy(kvc_cache* h) { delete reinterpret_cast<Cache*>(h); }

const char* last_error(const kvc_cache* h) {
    return h ? reinterpret_cast<const Cache*>(h)->error.c_str() : g_create_error.c_str();
}

float load(const Cache& c, const std::vector<uint8_t>& b, size_t i) {
    return kvc::ref::load_dtype(b.data() + i * es(c), c.cfg.cache_dtype);
}

kvc_status append_attend(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                         const float* v, float* out) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers) return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    Stream& s = c->streams[seq][layer];
    if (s.len + n_new > c->cfg.max_tokens) return fail(c, KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    const uint32_t d = c->cfg.head_dim, Hq = c->cfg.n_q_heads, Hkv = c->cfg.n_kv_heads, dt = c->cfg.cache_dtype;
    const size_t R = row(*c), E = es(*c);
    if (KVC_DOUBLE == DOUBLE_REWRITER && s.len > 0) s.k[0] ^= 1; // the bug: touch the past
    const uint32_t before = s.len;
    s.k.resize((before + n_new) * R * E);
    s.v.resize((before + n_new) * R * E);
    for (size_t i = 0; i < n_new * R; ++i) {
        kvc::ref::store_dtype(k[i], dt, s.k.data() + (before * R + i) * E);
        kvc::ref::store_dtype(v[i], dt, s.v.data() + (before * R + i) * E);
    }
    s.len += n_new;
    if (KVC_DOUBLE == DOUBLE_CRASH && s.len >= 5) kvc_double_fault();
    if (KVC_DOUBLE == DOUBLE_HANG && s.len >= 5)
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));

    const bool narrow = (KVC_DOUBLE == DOUBLE_F16_ACCUM || KVC_DOUBLE == DOUBLE_F16_HONEST);
    float nudge = 0.f;
    if (KVC_DOUBLE == DOUBLE_Q_HOARDER) // the bug: a Q cache nobody reads, visible only as memory
        c->past_q.insert(c->past_q.end(), q, q + static_cast<size_t>(n_new) * Hq * d);
    if (KVC_DOUBLE == DOUBLE_Q_KEEPER) { // the bug: remember queries, and let the past ones matter a little
        for (float x : c->past_q) nudge += x;
        nudge = 4e-7f * std::sin(nudge); // a few ulps, relative: inside every tolerance, never bitwise the same
        c->past_q.insert(c->past_q.end(), q, q + static_cast<size_t>(n_new) * Hq * d);
    }
    std::vector<float> qh(d), w;
    for (uint32_t i = 0; i < n_new; ++i)
        for (uint32_t hq = 0; hq < Hq; ++hq) {
            const uint32_t g = KVC_DOUBLE == DOUBLE_TILE ? hq % Hkv : hq / (Hq / Hkv);
            for (uint32_t x = 0; x < d; ++x) {
                qh[x] = q[(static_cast<size_t>(i) * Hq + hq) * d + x];
                if (narrow) qh[x] = kvc::ref::round_to_dtype(qh[x], dt);
            }
            uint32_t last = before + i; // the last key this query may see
            const bool sees_nothing = KVC_DOUBLE == DOUBLE_SKIP_SELF && last == 0;
            if (KVC_DOUBLE == DOUBLE_SKIP_SELF && last > 0) --last;
            w.assign(last + 1, 0.f);
            float m = -INFINITY;
            for (uint32_t j = 0; j <= last; ++j) {
                float dot = 0.f;
                for (uint32_t x = 0; x < d; ++x) dot += qh[x] * load(*c, s.k, j * R + g * d + x);
                w[j] = dot * c->cfg.scale;
                m = std::max(m, w[j]);
            }
            float sum = 0.f;
            for (uint32_t j = 0; j <= last; ++j) sum += (w[j] = std::exp(w[j] - m));
            float* o = out + (static_cast<size_t>(i) * Hq + hq) * d;
            for (uint32_t x = 0; x < d; ++x) {
                float acc = 0.f;
                for (uint32_t jj = 0; jj <= last; ++jj) {
                    const uint32_t j = KVC_DOUBLE == DOUBLE_REVERSE_SUM ? last - jj : jj;
                    acc += w[j] * load(*c, s.v, j * R + g * d + x);
                    if (narrow) acc = kvc::ref::round_to_dtype(acc, dt);
                }
                o[x] = sees_nothing ? 0.f : acc / sum * (1.f + nudge);
            }
        }
    return KVC_OK;
}

kvc_status read_kv(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers) return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    const Stream& s = c->streams[seq][layer];
    if (static_cast<uint64_t>(pos) + n > s.len) return fail(c, KVC_ERR_INVALID_ARGUMENT, "read past the end");
    const size_t b = row(*c) * es(*c);
    std::memcpy(k_out, s.k.data() + pos * b, n * b);
    std::memcpy(v_out, s.v.data() + pos * b, n * b);
    return KVC_OK;
}

kvc_status seq_length(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t* len) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers) return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    *len = c->streams[seq][layer].len;
    return KVC_OK;
}

kvc_status memory(kvc_cache* h, kvc_memory* m) {
    Cache* c = reinterpret_cast<Cache*>(h);
    uint64_t live = 0, held = 0;
    for (const auto& seq : c->streams)
        for (const Stream& s : seq) {
            live += 2ull * s.len * row(*c) * es(*c);
            held += s.k.capacity() + s.v.capacity();
        }
    if (KVC_DOUBLE == DOUBLE_MISREPORT) live = live / c->cfg.n_kv_heads * c->cfg.n_q_heads; // the bug
    m->block_size = 1;
    m->live_bytes = live;
    m->capacity_bytes = KVC_DOUBLE == DOUBLE_MISREPORT ? std::min(live, held) : live;
    m->pool_bytes = held - std::min(held, m->capacity_bytes);
    return KVC_OK;
}

kvc_status fork(kvc_cache* h, uint32_t parent, uint32_t child) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (parent >= c->cfg.max_seqs || child >= c->cfg.max_seqs || c->streams[parent][0].len == 0 ||
        c->streams[child][0].len != 0)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad fork");
    c->streams[child] = c->streams[parent];
    return KVC_OK;
}

kvc_status release(kvc_cache* h, uint32_t seq) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (seq >= c->cfg.max_seqs) return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad seq");
    for (Stream& s : c->streams[seq]) s = Stream{};
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api),
    KVC_DOUBLE == DOUBLE_NEWER_ABI ? 2u : KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "test-double",
    "0",
    get_caps,
    create,
    destroy,
    last_error,
    append_attend,
    nullptr,
    read_kv,
    seq_length,
    memory,
    fork,
    release,
};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t, uint32_t) {
    return &kApi;
}
