// Deliberately broken (and deliberately different-but-correct) KV caches behind the plugin ABI: the test doubles
// that prove each property can fail, and fails for the right reason. One source, one shared library per behaviour:
// KVC_DOUBLE selects it at compile time (CMakeLists.txt lists them).
//
// The base is the plain contiguous cache (contiguous_cache.hpp), rows in the cache dtype, attention in f32, no RoPE.
#include "contiguous_cache.hpp"
#include "fault.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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

struct Cache : kvc::dbl::Cache<uint8_t> {
    std::vector<float> past_q; // DOUBLE_Q_KEEPER's and DOUBLE_Q_HOARDER's hidden store
};

void get_caps(kvc_caps* out) {
    const uint32_t dtypes = KVC_DOUBLE == DOUBLE_REWRITER ? 1u : KVC_DOUBLE == DOUBLE_DECLARES_NOTHING ? 0u : 0x7u;
    kvc_caps c = kvc::dbl::host_caps(dtypes, KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE |
                                                 KVC_FEATURE_CHUNKED);
    if (KVC_DOUBLE == DOUBLE_F16_HONEST) c.precision = KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE;
    kvc::dbl::put_caps(out, c);
}

kvc_status append_attend(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                         const float* v, float* out) {
    Cache* c = kvc::dbl::self<Cache>(h);
    const kvc_status st = kvc::dbl::check_append(c, seq, layer, n_new);
    if (st != KVC_OK) return st;
    Cache::Stream& s = c->streams[seq][layer];
    const uint32_t d = c->cfg.head_dim, Hq = c->cfg.n_q_heads, Hkv = c->cfg.n_kv_heads, dt = c->cfg.cache_dtype;
    const size_t R = c->row();
    if (KVC_DOUBLE == DOUBLE_REWRITER && s.len > 0) s.k[0] ^= 1; // the bug: touch the past
    const uint32_t before = s.len;
    kvc::dbl::store(*c, s, n_new, k, v);
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
                for (uint32_t x = 0; x < d; ++x) dot += qh[x] * c->at(s.k, j * R + g * d + x);
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
                    acc += w[j] * c->at(s.v, j * R + g * d + x);
                    if (narrow) acc = kvc::ref::round_to_dtype(acc, dt);
                }
                o[x] = sees_nothing ? 0.f : acc / sum * (1.f + nudge);
            }
        }
    return KVC_OK;
}

kvc_status memory(kvc_cache* h, kvc_memory* out) {
    if (KVC_DOUBLE != DOUBLE_MISREPORT) return kvc::dbl::memory<Cache>(h, out);
    const Cache* c = kvc::dbl::self<Cache>(h);
    kvc::dbl::Usage u = kvc::dbl::usage(*c);
    u.live = u.live / c->cfg.n_kv_heads * c->cfg.n_q_heads; // the bug
    kvc::dbl::put_memory(out, kvc::dbl::report(u, std::min(u.live, u.held)));
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api),
    KVC_DOUBLE == DOUBLE_NEWER_ABI ? 2u : KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "test-double",
    "0",
    get_caps,
    kvc::dbl::create<Cache>,
    kvc::dbl::destroy<Cache>,
    kvc::dbl::last_error<Cache>,
    append_attend,
    nullptr,
    kvc::dbl::read_kv<Cache>,
    kvc::dbl::seq_length<Cache>,
    memory,
    kvc::dbl::fork<Cache>,
    kvc::dbl::release<Cache>,
    nullptr, // read_kv_scales: no quantized dtype declared
};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t, uint32_t) {
    return &kApi;
}
