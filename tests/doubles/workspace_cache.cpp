// Test doubles for what a correct cache may hold besides K/V (NO-Q with workspaces), for a kernel that hard-codes
// its softmax scale, for head_dim granularity and for stale tail slots. One source, one shared library per
// behaviour: KVC_WS_DOUBLE selects it (CMakeLists.txt lists them).
//
// The base is a plain contiguous cache (one growing array per sequence and layer), exact in f32, no RoPE.
#include "kvcheck/abi.h"
#include "kvcheck/reference/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef KVC_WS_DOUBLE
#error "define KVC_WS_DOUBLE to one of the behaviours below"
#endif

#define WS_64MIB 0       // correct; a 64 MiB workspace allocated in create, declared as workspace_bytes: passes NO-Q
#define WS_256MIB 1      // the same at the 256 MiB limit: passes NO-Q
#define WS_UNDECLARED 2  // an ABI 1.0 plugin: ~215 KB of block tables and score buffers in create, unreported
#define WS_GROWS 3       // keeps every query in its "workspace" and reports it growing: NO-Q
#define FIXED_SCALE 4    // uses 1/sqrt(head_dim) whatever config.scale says: EQUIV
#define HD_MULTIPLE 5    // refuses head_dim not a multiple of 8 (16 with RoPE), and declares so: no case ERRORs
#define STALE_READER 6   // release keeps the rows; the softmax max also runs over stale tail slots: RELEASE
#define WS_LAZY 7        // correct; a 4 MiB workspace declared from create, allocated on the first append: passes
#define WS_LAZY_OVER 8   // the same, but the first append allocates 256 KiB more than it declared: NO-Q

namespace {

constexpr bool kAbi10 = KVC_WS_DOUBLE == WS_UNDECLARED;
constexpr bool kLazy = KVC_WS_DOUBLE == WS_LAZY || KVC_WS_DOUBLE == WS_LAZY_OVER;

struct Stream {
    std::vector<uint8_t> k, v; // [rows][Hkv*d] in the cache dtype; STALE_READER keeps rows past len after release
    uint32_t len = 0;
};

struct Cache {
    kvc_config cfg{};
    std::vector<std::vector<Stream>> streams; // [seq][layer]
    void* workspace = nullptr;
    uint64_t workspace_bytes = 0;
    std::vector<float> kept_q; // WS_GROWS
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
    c.dtypes = 0x7u;
    c.features = KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED;
    c.precision = KVC_PRECISION_F32;
    c.memory_space = KVC_MEMORY_HOST;
    if (KVC_WS_DOUBLE == HD_MULTIPLE) {
        c.head_dim_multiple = 8;
        c.head_dim_multiple_rope = 16;
    }
    // an ABI 1.0 plugin knows only the fields up to max_tokens
    const uint32_t mine = kAbi10 ? static_cast<uint32_t>(offsetof(kvc_caps, head_dim_multiple)) : sizeof c;
    const uint32_t n = std::min<uint32_t>(out->struct_size, mine);
    c.struct_size = n;
    std::memcpy(out, &c, n);
}

uint64_t workspace_for() {
    switch (KVC_WS_DOUBLE) {
    case WS_64MIB: return 64ull << 20;
    case WS_256MIB: return 256ull << 20;
    case WS_UNDECLARED: return 215000; // block tables and score buffers
    case WS_LAZY:
    case WS_LAZY_OVER: return 4ull << 20;
    default: return 0;
    }
}

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (!cfg || !out || cfg->n_kv_heads == 0 || cfg->head_dim == 0 || cfg->n_q_heads % cfg->n_kv_heads != 0 ||
        cfg->cache_dtype > 2 || cfg->rope != KVC_ROPE_NONE || cfg->n_layers == 0 || cfg->max_seqs == 0) {
        g_create_error = "unsupported or invalid config";
        return KVC_ERR_UNSUPPORTED;
    }
    if (KVC_WS_DOUBLE == HD_MULTIPLE && cfg->head_dim % 8 != 0) { // what the declared granularity promises
        g_create_error = "head_dim " + std::to_string(cfg->head_dim) + " is not a multiple of 8";
        return KVC_ERR_UNSUPPORTED;
    }
    auto* c = new Cache;
    c->cfg = *cfg;
    c->streams.assign(cfg->max_seqs, std::vector<Stream>(cfg->n_layers));
    c->workspace_bytes = workspace_for();
    if (c->workspace_bytes && !kLazy) {
        c->workspace = std::malloc(c->workspace_bytes);
        if (!c->workspace) {
            delete c;
            g_create_error = "workspace allocation failed";
            return KVC_ERR_OUT_OF_MEMORY;
        }
        std::memset(c->workspace, 0, std::min<uint64_t>(c->workspace_bytes, 1u << 20)); // in use, not just mapped
    }
    *out = reinterpret_cast<kvc_cache*>(c);
    return KVC_OK;
}

void destroy(kvc_cache* h) {
    Cache* c = reinterpret_cast<Cache*>(h);
    std::free(c->workspace);
    delete c;
}

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
    const uint32_t before = s.len;
    const size_t rows_held = s.k.size() / (R * E);
    if (before + n_new > rows_held) { // STALE_READER never shrinks: rows past len stay from before a release
        s.k.resize((before + n_new) * R * E);
        s.v.resize((before + n_new) * R * E);
    }
    for (size_t i = 0; i < n_new * R; ++i) {
        kvc::ref::store_dtype(k[i], dt, s.k.data() + (before * R + i) * E);
        kvc::ref::store_dtype(v[i], dt, s.v.data() + (before * R + i) * E);
    }
    s.len += n_new;
    if (kLazy && !c->workspace) { // the declared workspace, made when first needed (and more than declared: the bug)
        const uint64_t bytes = c->workspace_bytes + (KVC_WS_DOUBLE == WS_LAZY_OVER ? 256u << 10 : 0u);
        c->workspace = std::malloc(bytes);
        if (!c->workspace) return fail(c, KVC_ERR_OUT_OF_MEMORY, "workspace allocation failed");
        std::memset(c->workspace, 0, bytes); // in use, not just mapped
    }
    if (KVC_WS_DOUBLE == WS_GROWS) { // the bug: a Q store declared as workspace, growing with the tokens
        c->kept_q.insert(c->kept_q.end(), q, q + static_cast<size_t>(n_new) * Hq * d);
        c->workspace_bytes = c->kept_q.capacity() * sizeof(float);
    }
    const float scale = KVC_WS_DOUBLE == FIXED_SCALE ? 1.0f / std::sqrt(static_cast<float>(d)) : c->cfg.scale;
    const uint32_t stored = static_cast<uint32_t>(s.k.size() / (R * E));
    std::vector<float> w;
    for (uint32_t i = 0; i < n_new; ++i)
        for (uint32_t hq = 0; hq < Hq; ++hq) {
            const uint32_t g = hq / (Hq / Hkv);
            const float* qh = q + (static_cast<size_t>(i) * Hq + hq) * d;
            const uint32_t last = before + i;
            auto score = [&](uint32_t j) {
                float dot = 0.f;
                for (uint32_t x = 0; x < d; ++x) dot += qh[x] * load(*c, s.k, j * R + g * d + x);
                return dot * scale;
            };
            w.assign(last + 1, 0.f);
            float m = -INFINITY;
            for (uint32_t j = 0; j <= last; ++j) m = std::max(m, w[j] = score(j));
            if (KVC_WS_DOUBLE == STALE_READER) // the bug: the max runs over the block's tail slots past the length
                for (uint32_t j = s.len; j < std::min(stored, (s.len + 15) / 16 * 16); ++j) m = std::max(m, score(j));
            float sum = 0.f;
            for (uint32_t j = 0; j <= last; ++j) sum += (w[j] = std::exp(w[j] - m));
            float* o = out + (static_cast<size_t>(i) * Hq + hq) * d;
            for (uint32_t x = 0; x < d; ++x) {
                float acc = 0.f;
                for (uint32_t j = 0; j <= last; ++j) acc += w[j] * load(*c, s.v, j * R + g * d + x);
                o[x] = acc / sum;
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
    kvc_memory r{};
    r.struct_size = m->struct_size;
    r.block_size = 1;
    r.live_bytes = live;
    r.capacity_bytes = live;
    r.pool_bytes = held - live;
    r.workspace_bytes = c->workspace_bytes;
    // an ABI 1.0 plugin writes only the fields it knows: its scratch stays unreported
    const size_t mine = kAbi10 ? offsetof(kvc_memory, workspace_bytes) : sizeof r;
    std::memcpy(m, &r, std::min<size_t>(m->struct_size, mine));
    return KVC_OK;
}

kvc_status fork(kvc_cache* h, uint32_t parent, uint32_t child) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (parent >= c->cfg.max_seqs || child >= c->cfg.max_seqs || parent == child)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad fork");
    bool started = false;
    for (uint32_t l = 0; l < c->cfg.n_layers; ++l) {
        started = started || c->streams[parent][l].len > 0;
        if (c->streams[child][l].len != 0) return fail(c, KVC_ERR_INVALID_ARGUMENT, "child not empty");
    }
    if (!started) return fail(c, KVC_ERR_INVALID_ARGUMENT, "parent not started");
    for (uint32_t l = 0; l < c->cfg.n_layers; ++l) {
        const Stream& p = c->streams[parent][l];
        Stream& ch = c->streams[child][l];
        const size_t b = p.len * row(*c) * es(*c);
        ch.k.assign(p.k.begin(), p.k.begin() + static_cast<std::ptrdiff_t>(b));
        ch.v.assign(p.v.begin(), p.v.begin() + static_cast<std::ptrdiff_t>(b));
        ch.len = p.len;
    }
    return KVC_OK;
}

kvc_status release(kvc_cache* h, uint32_t seq) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (seq >= c->cfg.max_seqs) return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad seq");
    for (Stream& s : c->streams[seq]) {
        if (KVC_WS_DOUBLE == STALE_READER) s.len = 0; // storage reused as it is: the rows stay behind
        else s = Stream{};
    }
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api), KVC_ABI_VERSION_MAJOR, kAbi10 ? 0u : KVC_ABI_VERSION_MINOR, "workspace-double", "0",
    get_caps, create, destroy, last_error, append_attend, nullptr, read_kv, seq_length, memory, fork, release,
};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t, uint32_t) {
    return &kApi;
}
