// Test doubles for what a correct cache may hold besides K/V (NO-Q with workspaces), for a kernel that hard-codes
// its softmax scale, for head_dim granularity and for stale tail slots. One source, one shared library per
// behaviour: KVC_WS_DOUBLE selects it (CMakeLists.txt lists them).
//
// The base is the plain contiguous cache (contiguous_cache.hpp), rows in the cache dtype, attention in f32, no RoPE.
#include "contiguous_cache.hpp"

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
#define WS_Q_STORE 9     // a store of every query row [layer][seq][max_tokens] made in create, declared as a
                         // constant workspace, written and never read: NO-Q (the Q-store probe)
#define WS_BATCH_SCRATCH 10 // correct; scratch for one batched call over every sequence's max_tokens queries and
                            // scores: grows with the sequences and the tokens, never with the layers: passes NO-Q

namespace {

constexpr bool kAbi10 = KVC_WS_DOUBLE == WS_UNDECLARED;
constexpr bool kLazy = KVC_WS_DOUBLE == WS_LAZY || KVC_WS_DOUBLE == WS_LAZY_OVER;

struct Cache : kvc::dbl::Cache<uint8_t> {
    void* workspace = nullptr;
    uint64_t workspace_bytes = 0;
    std::vector<float> kept_q; // WS_GROWS
    ~Cache() { std::free(workspace); }
};

void get_caps(kvc_caps* out) {
    kvc_caps c = kvc::dbl::host_caps(0x7u, KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE |
                                               KVC_FEATURE_CHUNKED);
    if (KVC_WS_DOUBLE == HD_MULTIPLE) {
        c.head_dim_multiple = 8;
        c.head_dim_multiple_rope = 16;
    }
    // an ABI 1.0 plugin knows only the fields up to max_tokens
    kvc::dbl::put_caps(out, c, kAbi10 ? offsetof(kvc_caps, head_dim_multiple) : sizeof c);
}

uint64_t workspace_for(const kvc_config& cfg) {
    const uint64_t q_row = uint64_t{cfg.n_q_heads} * cfg.head_dim * sizeof(float);
    switch (KVC_WS_DOUBLE) {
    case WS_64MIB: return 64ull << 20;
    case WS_256MIB: return 256ull << 20;
    case WS_UNDECLARED: return 215000; // block tables and score buffers
    case WS_LAZY:
    case WS_LAZY_OVER: return 4ull << 20;
    case WS_Q_STORE: return uint64_t{cfg.n_layers} * cfg.max_seqs * cfg.max_tokens * q_row;
    case WS_BATCH_SCRATCH:
        return uint64_t{cfg.max_seqs} * cfg.max_tokens * (q_row + uint64_t{cfg.n_q_heads} * cfg.max_tokens * 4);
    default: return 0;
    }
}

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (kvc::dbl::refuses(cfg, out, 0x7u, false)) return KVC_ERR_UNSUPPORTED;
    if (KVC_WS_DOUBLE == HD_MULTIPLE && cfg->head_dim % 8 != 0) { // what the declared granularity promises
        kvc::dbl::create_error = "head_dim " + std::to_string(cfg->head_dim) + " is not a multiple of 8";
        return KVC_ERR_UNSUPPORTED;
    }
    Cache* c = kvc::dbl::make<Cache>(*cfg);
    c->workspace_bytes = workspace_for(*cfg);
    if (c->workspace_bytes && !kLazy) {
        c->workspace = std::malloc(c->workspace_bytes);
        if (!c->workspace) {
            delete c;
            kvc::dbl::create_error = "workspace allocation failed";
            return KVC_ERR_OUT_OF_MEMORY;
        }
        std::memset(c->workspace, 0, std::min<uint64_t>(c->workspace_bytes, 1u << 20)); // in use, not just mapped
    }
    *out = reinterpret_cast<kvc_cache*>(c);
    return KVC_OK;
}

kvc_status append_attend(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                         const float* v, float* out) {
    Cache* c = kvc::dbl::self<Cache>(h);
    const kvc_status st = kvc::dbl::check_append(c, seq, layer, n_new);
    if (st != KVC_OK) return st;
    Cache::Stream& s = c->streams[seq][layer];
    const uint32_t d = c->cfg.head_dim, Hq = c->cfg.n_q_heads, Hkv = c->cfg.n_kv_heads;
    const size_t R = c->row(), E = c->es();
    const uint32_t before = s.len;
    kvc::dbl::store(*c, s, n_new, k, v); // STALE_READER never shrinks: rows past len stay from before a release
    if (kLazy && !c->workspace) { // the declared workspace, made when first needed (and more than declared: the bug)
        const uint64_t bytes = c->workspace_bytes + (KVC_WS_DOUBLE == WS_LAZY_OVER ? 256u << 10 : 0u);
        c->workspace = std::malloc(bytes);
        if (!c->workspace) return c->fail(KVC_ERR_OUT_OF_MEMORY, "workspace allocation failed");
        std::memset(c->workspace, 0, bytes); // in use, not just mapped
    }
    if (KVC_WS_DOUBLE == WS_GROWS) { // the bug: a Q store declared as workspace, growing with the tokens
        c->kept_q.insert(c->kept_q.end(), q, q + static_cast<size_t>(n_new) * Hq * d);
        c->workspace_bytes = c->kept_q.capacity() * sizeof(float);
    }
    if (KVC_WS_DOUBLE == WS_Q_STORE) { // the bug: every query row kept, at [layer][seq][position]
        const size_t row = static_cast<size_t>(Hq) * d;
        const size_t at = ((static_cast<size_t>(layer) * c->cfg.max_seqs + seq) * c->cfg.max_tokens + before) * row;
        std::memcpy(static_cast<float*>(c->workspace) + at, q, n_new * row * sizeof(float));
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
                for (uint32_t x = 0; x < d; ++x) dot += qh[x] * c->at(s.k, j * R + g * d + x);
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
                for (uint32_t j = 0; j <= last; ++j) acc += w[j] * c->at(s.v, j * R + g * d + x);
                o[x] = acc / sum;
            }
        }
    return KVC_OK;
}

kvc_status memory(kvc_cache* h, kvc_memory* out) {
    const Cache* c = kvc::dbl::self<Cache>(h);
    const kvc::dbl::Usage u = kvc::dbl::usage(*c);
    // an ABI 1.0 plugin writes only the fields it knows: its scratch stays unreported
    kvc::dbl::put_memory(out, kvc::dbl::report(u, u.live, c->workspace_bytes),
                         kAbi10 ? offsetof(kvc_memory, workspace_bytes) : sizeof(kvc_memory));
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api),
    KVC_ABI_VERSION_MAJOR,
    kAbi10 ? 0u : KVC_ABI_VERSION_MINOR,
    "workspace-double",
    "0",
    get_caps,
    create,
    kvc::dbl::destroy<Cache>,
    kvc::dbl::last_error<Cache>,
    append_attend,
    nullptr,
    kvc::dbl::read_kv<Cache>,
    kvc::dbl::seq_length<Cache>,
    memory,
    kvc::dbl::fork<Cache>,
    kvc::dbl::release<Cache, KVC_WS_DOUBLE == STALE_READER>, // STALE_READER: storage reused as it is
    nullptr, // read_kv_scales: no quantized dtype declared
};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t, uint32_t) {
    return &kApi;
}
