// A test double that reads one slot past its end: a small contiguous f32 cache whose storage keeps a slack row after
// the last one, poisoned with NaN (as freshly mapped or debug-filled memory might be), and whose attention loop runs
// one key too far. Every output it computes is NaN. kvcheck must call that a FAIL of the property that grades
// outputs, with coordinates, never an ERROR: NaN has to survive the child protocol, the reports and replay files.
#include "contiguous_cache.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// f32 rows as floats, with one slack row after the last one.
struct Cache : kvc::dbl::Cache<float> {
    static constexpr uint32_t kSlackRows = 1;
};

void get_caps(kvc_caps* out) {
    kvc::dbl::put_caps(out, kvc::dbl::host_caps(1u << KVC_DTYPE_F32, KVC_FEATURE_GQA | KVC_FEATURE_FORK |
                                                                          KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED));
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
    // the slack row after the last one: NaN
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::fill(s.k.begin() + static_cast<std::ptrdiff_t>(s.len * R), s.k.end(), nan);
    std::fill(s.v.begin() + static_cast<std::ptrdiff_t>(s.len * R), s.v.end(), nan);
    std::vector<float> w;
    for (uint32_t i = 0; i < n_new; ++i)
        for (uint32_t hq = 0; hq < Hq; ++hq) {
            const uint32_t g = hq / (Hq / Hkv);
            const float* qh = q + (static_cast<size_t>(i) * Hq + hq) * d;
            // the bug: `<=` for `<`, one key past the last visible one: the next new row, or for the last new token the
            // NaN slack row, so every call has NaN outputs
            const uint32_t end = before + i + 2;
            w.assign(end, 0.f);
            float m = -INFINITY;
            for (uint32_t j = 0; j < end; ++j) {
                float dot = 0.f;
                for (uint32_t x = 0; x < d; ++x) dot += qh[x] * s.k[j * R + g * d + x];
                w[j] = dot * c->cfg.scale;
                m = std::max(m, w[j]);
            }
            float sum = 0.f;
            for (uint32_t j = 0; j < end; ++j) sum += (w[j] = std::exp(w[j] - m));
            float* o = out + (static_cast<size_t>(i) * Hq + hq) * d;
            for (uint32_t x = 0; x < d; ++x) {
                float acc = 0.f;
                for (uint32_t j = 0; j < end; ++j) acc += w[j] * s.v[j * R + g * d + x];
                o[x] = acc / sum;
            }
        }
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api),
    KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "read-past-end",
    "0",
    get_caps,
    kvc::dbl::create<Cache, 1u << KVC_DTYPE_F32>,
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
