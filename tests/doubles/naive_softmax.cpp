// Softmax without the running maximum: the control and the bug of the large-score regime (docs/conformance.md,
// EQUIV). One source, one shared library per behaviour: KVC_DOUBLE selects it at compile time.
//
// The base is the plain contiguous cache (contiguous_cache.hpp), rows in the cache dtype, attention in f32, no RoPE.
#include "contiguous_cache.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#ifndef KVC_DOUBLE
#error "define KVC_DOUBLE to one of the behaviours below"
#endif

#define DOUBLE_MAX_SUBTRACTED 0 // two passes, exp(s - max): correct for every score magnitude
#define DOUBLE_NAIVE_EXP 1      // exp(s) accumulated directly: Inf or 0/0 once |s| passes f32 exp's range

namespace {

using Cache = kvc::dbl::Cache<uint8_t>;

void get_caps(kvc_caps* out) {
    kvc::dbl::put_caps(out, kvc::dbl::host_caps(0x7u, KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE |
                                                          KVC_FEATURE_CHUNKED));
}

kvc_status append_attend(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                         const float* v, float* out) {
    Cache* c = kvc::dbl::self<Cache>(h);
    const kvc_status st = kvc::dbl::check_append(c, seq, layer, n_new);
    if (st != KVC_OK) return st;
    Cache::Stream& s = c->streams[seq][layer];
    const uint32_t d = c->cfg.head_dim, Hq = c->cfg.n_q_heads, Hkv = c->cfg.n_kv_heads;
    const size_t R = c->row();
    const uint32_t before = s.len;
    kvc::dbl::store(*c, s, n_new, k, v);
    std::vector<float> w;
    for (uint32_t i = 0; i < n_new; ++i)
        for (uint32_t hq = 0; hq < Hq; ++hq) {
            const uint32_t g = hq / (Hq / Hkv), last = before + i;
            const float* qh = q + (static_cast<size_t>(i) * Hq + hq) * d;
            w.assign(last + 1, 0.f);
            float m = -INFINITY;
            for (uint32_t j = 0; j <= last; ++j) {
                float dot = 0.f;
                for (uint32_t x = 0; x < d; ++x) dot += qh[x] * c->at(s.k, j * R + g * d + x);
                w[j] = dot * c->cfg.scale;
                m = std::max(m, w[j]);
            }
            if (KVC_DOUBLE == DOUBLE_NAIVE_EXP) m = 0.f; // the bug
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

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api),
    KVC_ABI_VERSION_MAJOR,
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
    kvc::dbl::memory<Cache>,
    kvc::dbl::fork<Cache>,
    kvc::dbl::release<Cache>,
    nullptr, // read_kv_scales: no quantized dtype declared
};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t, uint32_t) {
    return &kApi;
}
