// A test double that reads one slot past its end: a small contiguous f32 cache whose storage keeps a slack row after
// the last one, poisoned with NaN (as freshly mapped or debug-filled memory might be), and whose attention loop runs
// one key too far. Every output it computes is NaN. kvcheck must call that a FAIL of the property that grades
// outputs, with coordinates, never an ERROR: NaN has to survive the child protocol, the reports and replay files.
#include "kvcheck/abi.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

struct Stream {
    std::vector<float> k, v; // [len + 1][Hkv*d]: the last row is slack, always NaN
    uint32_t len = 0;
};

struct Cache {
    kvc_config cfg{};
    std::vector<std::vector<Stream>> streams; // [seq][layer]
    std::string error;
};

thread_local std::string g_create_error;

size_t row(const Cache& c) { return static_cast<size_t>(c.cfg.n_kv_heads) * c.cfg.head_dim; }

kvc_status fail(Cache* c, kvc_status s, const std::string& m) {
    c->error = m;
    return s;
}

// Grows a stream to `len` rows plus one slack row of NaN.
void resize(const Cache& c, Stream& s, uint32_t len) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    s.k.resize((len + 1) * row(c));
    s.v.resize((len + 1) * row(c));
    std::fill(s.k.begin() + static_cast<std::ptrdiff_t>(len * row(c)), s.k.end(), nan);
    std::fill(s.v.begin() + static_cast<std::ptrdiff_t>(len * row(c)), s.v.end(), nan);
    s.len = len;
}

void get_caps(kvc_caps* out) {
    kvc_caps c{};
    c.struct_size = sizeof c;
    c.dtypes = 1u << KVC_DTYPE_F32;
    c.features = KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED;
    c.precision = KVC_PRECISION_F32;
    c.memory_space = KVC_MEMORY_HOST;
    const uint32_t n = std::min<uint32_t>(out->struct_size, sizeof c);
    std::memcpy(out, &c, n);
    out->struct_size = n;
}

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (!cfg || !out || cfg->n_kv_heads == 0 || cfg->head_dim == 0 || cfg->n_q_heads % cfg->n_kv_heads != 0 ||
        cfg->cache_dtype != KVC_DTYPE_F32 || cfg->rope != KVC_ROPE_NONE || cfg->n_layers == 0 || cfg->max_seqs == 0) {
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

kvc_status append_attend(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                         const float* v, float* out) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers) return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    Stream& s = c->streams[seq][layer];
    if (s.len + n_new > c->cfg.max_tokens) return fail(c, KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    const uint32_t d = c->cfg.head_dim, Hq = c->cfg.n_q_heads, Hkv = c->cfg.n_kv_heads;
    const size_t R = row(*c);
    const uint32_t before = s.len;
    resize(*c, s, before + n_new);
    std::copy(k, k + n_new * R, s.k.begin() + static_cast<std::ptrdiff_t>(before * R));
    std::copy(v, v + n_new * R, s.v.begin() + static_cast<std::ptrdiff_t>(before * R));
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

kvc_status read_kv(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    Cache* c = reinterpret_cast<Cache*>(h);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers) return fail(c, KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    const Stream& s = c->streams[seq][layer];
    if (static_cast<uint64_t>(pos) + n > s.len) return fail(c, KVC_ERR_INVALID_ARGUMENT, "read past the end");
    const size_t b = row(*c) * sizeof(float);
    std::memcpy(k_out, s.k.data() + pos * row(*c), n * b);
    std::memcpy(v_out, s.v.data() + pos * row(*c), n * b);
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
            live += 2ull * s.len * row(*c) * sizeof(float);
            held += (s.k.capacity() + s.v.capacity()) * sizeof(float);
        }
    m->block_size = 1;
    m->live_bytes = live;
    m->capacity_bytes = live;
    m->pool_bytes = held - std::min(held, live); // the slack rows and vector growth
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
    KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "read-past-end",
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
