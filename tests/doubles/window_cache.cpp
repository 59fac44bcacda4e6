// Windowed KV caches behind the plugin ABI (docs/windowed-caches.md): correct ones in three storage forms, and one
// deliberate bug each, to prove that every windowed rule can fail and fails for the right reason.
// KVC_WIN_DOUBLE selects the behaviour at compile time (CMakeLists.txt lists them).
//
// Storage per (sequence, layer) where the config asks for eviction and the layer has a window W:
//   ring    sinks in slots 0..S-1, position p >= S in slot S + (p - S) % W: the last W rows after the sinks
//   blocks  blocks of 4 positions; a block whose every row is dead (no later query sees it) is freed
// and otherwise (no eviction, or a layer without a window) every row in a growing array. Attention is f32 over the
// stored rows widened, one query row at a time, each row written before its own query attends: a chunk longer than
// the window never overwrites a row one of its own queries still needs. RoPE (NeoX, GPT-J) at absolute positions.
#include "contiguous_cache.hpp"

#include <cmath>
#include <vector>

#ifndef KVC_WIN_DOUBLE
#error "define KVC_WIN_DOUBLE to one of the behaviours below"
#endif

#define WIN_RING 0             // correct: ring buffer where evicting
#define WIN_BLOCKS 1           // correct: blocks freed as they leave the window
#define WIN_FULL 2             // correct: keeps every row, masks; declares no eviction
#define WIN_PLUS_ONE 3         // sees W + 1 keys: EQUIV
#define WIN_MINUS_ONE 4        // sees W - 1 keys (W > 1): EQUIV
#define WIN_RING_ROPE 5        // rotates a key by its ring slot, not its position: CACHE-CONTENT
#define WIN_FIRST_ROW 6        // masks a whole chunk with its first row's window: EQUIV
#define WIN_SINKS_DROPPED 7    // stops attending the sinks once the ring has wrapped: EQUIV
#define WIN_STALE_READ 8       // read_kv of an overwritten position returns the slot's newer row: APPEND-ONLY
#define WIN_NO_FREE 9          // declares eviction, says EVICTED, but keeps and reports every row: MEMORY

namespace {

// The masking bugs keep every row (a ring would hide a mask that reaches too far) and declare no eviction, so that
// only their arithmetic is judged.
constexpr bool kDeclaresEvict = KVC_WIN_DOUBLE != WIN_FULL && KVC_WIN_DOUBLE != WIN_PLUS_ONE &&
                                KVC_WIN_DOUBLE != WIN_MINUS_ONE && KVC_WIN_DOUBLE != WIN_FIRST_ROW;
constexpr bool kRing = KVC_WIN_DOUBLE == WIN_RING || KVC_WIN_DOUBLE == WIN_RING_ROPE ||
                       KVC_WIN_DOUBLE == WIN_SINKS_DROPPED || KVC_WIN_DOUBLE == WIN_STALE_READ;
constexpr bool kBlocks = KVC_WIN_DOUBLE == WIN_BLOCKS;
constexpr uint32_t kBlock = 4;

struct Stream {
    uint32_t len = 0;
    std::vector<uint8_t> k, v;              // full and ring storage: rows back to back
    std::vector<std::vector<uint8_t>> kb, vb; // blocks: [block] rows of kBlock positions, empty when freed
};

struct Cache {
    kvc_config cfg{};
    std::vector<uint32_t> windows;
    std::vector<std::vector<Stream>> streams; // [seq][layer]
    std::string error;

    size_t row() const { return size_t{cfg.n_kv_heads} * cfg.head_dim; }
    size_t es() const { return cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2; }
    size_t row_bytes() const { return row() * es(); }
    uint32_t window(uint32_t layer) const { return windows.empty() ? 0 : windows[layer]; }
    bool evicting(uint32_t layer) const { return cfg.evict && window(layer) > 0; }
    bool ring(uint32_t layer) const { return kRing && evicting(layer); }
    bool blocks(uint32_t layer) const { return kBlocks && evicting(layer); }
    kvc_status fail(kvc_status s, const std::string& m) {
        error = m;
        return s;
    }
};

Cache* self(kvc_cache* h) { return reinterpret_cast<Cache*>(h); }

// The first position the next query of a stream of `len` rows sees besides the sinks (0: every row is alive).
uint32_t dead_end(const Cache& c, uint32_t layer, uint32_t len) {
    const uint32_t w = c.window(layer);
    if (w == 0 || len < w) return 0;
    return len - w + 1 > c.cfg.n_sinks ? len - w + 1 : 0;
}

// The stored bytes of position p, or null where the cache no longer holds it.
uint8_t* row_at(Cache& c, Stream& s, uint32_t layer, uint32_t p, bool which_v) {
    std::vector<uint8_t>& flat = which_v ? s.v : s.k;
    if (c.blocks(layer)) {
        std::vector<uint8_t>& b = (which_v ? s.vb : s.kb)[p / kBlock];
        return b.empty() ? nullptr : b.data() + (p % kBlock) * c.row_bytes();
    }
    if (!c.ring(layer)) return flat.data() + size_t{p} * c.row_bytes();
    const uint32_t S = c.cfg.n_sinks, W = c.window(layer);
    const bool held = p < S || p + W >= s.len;
    if (!held && KVC_WIN_DOUBLE != WIN_STALE_READ) return nullptr;
    return flat.data() + size_t{p < S ? p : S + (p - S) % W} * c.row_bytes();
}

bool holds(Cache& c, Stream& s, uint32_t layer, uint32_t p) {
    if (KVC_WIN_DOUBLE == WIN_NO_FREE && c.cfg.evict && p >= c.cfg.n_sinks && p < dead_end(c, layer, s.len))
        return false; // says so, though it keeps the row
    return row_at(c, s, layer, p, false) != nullptr;
}

void rope(const Cache& c, float* x, uint32_t pos) { // one head, in double, rounded once
    const uint32_t d = c.cfg.head_dim;
    if (c.cfg.rope == KVC_ROPE_NONE) return;
    for (uint32_t j = 0; j < d / 2; ++j) {
        const double a = pos * std::pow(static_cast<double>(c.cfg.rope_theta), -2.0 * j / d);
        const uint32_t i0 = c.cfg.rope == KVC_ROPE_NEOX ? j : 2 * j, i1 = c.cfg.rope == KVC_ROPE_NEOX ? j + d / 2 : 2 * j + 1;
        const double x0 = x[i0], x1 = x[i1];
        x[i0] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
        x[i1] = static_cast<float>(x0 * std::sin(a) + x1 * std::cos(a));
    }
}

// Stores position p of a stream (its storage made room for it).
void put(Cache& c, Stream& s, uint32_t layer, uint32_t p, const float* k, const float* v) {
    const size_t R = c.row(), E = c.es(), d = c.cfg.head_dim;
    if (c.blocks(layer)) {
        const uint32_t b = p / kBlock;
        if (s.kb[b].empty()) {
            s.kb[b].resize(kBlock * c.row_bytes());
            s.vb[b].resize(kBlock * c.row_bytes());
        }
    } else if (!c.ring(layer)) {
        s.k.resize((size_t{p} + 1) * c.row_bytes());
        s.v.resize((size_t{p} + 1) * c.row_bytes());
    }
    s.len = p + 1; // the ring's slot of p is p's from now on
    uint8_t* kd = row_at(c, s, layer, p, false);
    uint8_t* vd = row_at(c, s, layer, p, true);
    std::vector<float> kr(k, k + R);
    const uint32_t S = c.cfg.n_sinks, W = c.window(layer);
    const uint32_t key_pos = KVC_WIN_DOUBLE == WIN_RING_ROPE && c.ring(layer) && p >= S ? S + (p - S) % W : p;
    for (uint32_t h = 0; h < c.cfg.n_kv_heads; ++h) rope(c, kr.data() + h * d, key_pos);
    for (size_t x = 0; x < R; ++x) {
        kvc::ref::store_dtype(kr[x], c.cfg.cache_dtype, kd + x * E);
        kvc::ref::store_dtype(v[x], c.cfg.cache_dtype, vd + x * E);
    }
}

// Frees the blocks whose every row is dead.
void free_dead(Cache& c, Stream& s, uint32_t layer) {
    if (!c.blocks(layer)) return;
    const uint32_t end = dead_end(c, layer, s.len);
    for (uint32_t b = (c.cfg.n_sinks + kBlock - 1) / kBlock; (b + 1) * kBlock <= end; ++b) {
        std::vector<uint8_t>().swap(s.kb[b]);
        std::vector<uint8_t>().swap(s.vb[b]);
    }
}

bool sees(const Cache& c, uint32_t layer, uint32_t i, uint32_t j, uint32_t first_row, bool wrapped) {
    const uint32_t W = c.window(layer), S = c.cfg.n_sinks;
    if (j > i) return false;
    if (W == 0) return true;
    if (j < S) return !(KVC_WIN_DOUBLE == WIN_SINKS_DROPPED && wrapped);
    const uint32_t at = KVC_WIN_DOUBLE == WIN_FIRST_ROW ? first_row : i;
    if (KVC_WIN_DOUBLE == WIN_PLUS_ONE) return at - j <= W || j > at;
    if (KVC_WIN_DOUBLE == WIN_MINUS_ONE && W > 1) return at - j + 1 < W || j > at; // W = 1 keeps the query itself
    return at - j < W || j > at;
}

void get_caps(kvc_caps* out) {
    uint32_t f = KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED | KVC_FEATURE_WINDOW |
                 KVC_FEATURE_SINKS;
    if (kDeclaresEvict) f |= KVC_FEATURE_EVICT;
    kvc_caps c = kvc::dbl::host_caps(0x7u, f);
    c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.max_head_dim = 64;
    kvc::dbl::put_caps(out, c);
}

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (kvc::dbl::refuses(cfg, out, 0x7u, true)) return KVC_ERR_UNSUPPORTED;
    if (cfg->struct_size < offsetof(kvc_config, rope_dims) + sizeof cfg->rope_dims || cfg->head_dim_v != 0 ||
        cfg->rope_dims != 0) {
        kvc::dbl::create_error = "a config before ABI 1.2's windows, or with head_dim_v / rope_dims";
        return KVC_ERR_UNSUPPORTED;
    }
    auto* c = new Cache;
    c->cfg = *cfg;
    if (cfg->windows) c->windows.assign(cfg->windows, cfg->windows + cfg->n_layers);
    c->cfg.windows = nullptr; // the harness's array is not ours to keep
    c->streams.assign(cfg->max_seqs, std::vector<Stream>(cfg->n_layers));
    const uint32_t n_blocks = (cfg->max_tokens + kBlock - 1) / kBlock;
    for (auto& seq : c->streams)
        for (uint32_t l = 0; l < cfg->n_layers; ++l) {
            if (c->blocks(l)) {
                seq[l].kb.resize(n_blocks);
                seq[l].vb.resize(n_blocks);
            }
            if (c->ring(l)) {
                seq[l].k.resize((size_t{cfg->n_sinks} + c->window(l)) * c->row_bytes());
                seq[l].v.resize(seq[l].k.size());
            }
        }
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
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    Stream& s = c->streams[seq][layer];
    if (uint64_t{s.len} + n_new > c->cfg.max_tokens) return c->fail(KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    const uint32_t d = c->cfg.head_dim, Hq = c->cfg.n_q_heads, Hkv = c->cfg.n_kv_heads, group = Hq / Hkv;
    const size_t R = c->row(), E = c->es();
    const uint32_t before = s.len;
    std::vector<float> qr(d), sc;
    for (uint32_t i = 0; i < n_new; ++i) {
        const uint32_t pos = before + i;
        put(*c, s, layer, pos, k + i * R, v + i * R);
        const bool wrapped = pos >= c->cfg.n_sinks + c->window(layer);
        for (uint32_t hq = 0; hq < Hq; ++hq) {
            const uint32_t g = hq / group;
            std::copy(q + (size_t{i} * Hq + hq) * d, q + (size_t{i} * Hq + hq + 1) * d, qr.begin());
            rope(*c, qr.data(), pos);
            std::vector<uint32_t> keys;
            for (uint32_t j = 0; j <= pos; ++j)
                if (sees(*c, layer, pos, j, before, wrapped) && row_at(*c, s, layer, j, false)) keys.push_back(j);
            sc.assign(keys.size(), 0.f);
            float m = -INFINITY;
            for (size_t t = 0; t < keys.size(); ++t) {
                const uint8_t* kr = row_at(*c, s, layer, keys[t], false) + size_t{g} * d * E;
                float dot = 0;
                for (uint32_t x = 0; x < d; ++x) dot += qr[x] * kvc::ref::load_dtype(kr + x * E, c->cfg.cache_dtype);
                sc[t] = dot * c->cfg.scale;
                m = std::max(m, sc[t]);
            }
            float l = 0;
            for (float& x : sc) l += (x = std::exp(x - m));
            float* o = out + (size_t{i} * Hq + hq) * d;
            std::fill(o, o + d, 0.f);
            for (size_t t = 0; t < keys.size(); ++t) {
                const uint8_t* vr = row_at(*c, s, layer, keys[t], true) + size_t{g} * d * E;
                for (uint32_t x = 0; x < d; ++x) o[x] += sc[t] * kvc::ref::load_dtype(vr + x * E, c->cfg.cache_dtype);
            }
            for (uint32_t x = 0; x < d; ++x) o[x] /= l;
        }
    }
    free_dead(*c, s, layer);
    return KVC_OK;
}

kvc_status read_kv(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    Cache* c = self(h);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    Stream& s = c->streams[seq][layer];
    if (uint64_t{pos} + n > s.len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "read past the end");
    for (uint32_t p = pos; p < pos + n; ++p)
        if (!holds(*c, s, layer, p))
            return c->fail(KVC_ERR_EVICTED, "position " + std::to_string(p) + " was dropped");
    const size_t rb = c->row_bytes();
    for (uint32_t i = 0; i < n; ++i) {
        std::memcpy(static_cast<uint8_t*>(k_out) + i * rb, row_at(*c, s, layer, pos + i, false), rb);
        std::memcpy(static_cast<uint8_t*>(v_out) + i * rb, row_at(*c, s, layer, pos + i, true), rb);
    }
    return KVC_OK;
}

kvc_status seq_length(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t* len) {
    Cache* c = self(h);
    if (seq >= c->cfg.max_seqs || layer >= c->cfg.n_layers || !len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad");
    *len = c->streams[seq][layer].len;
    return KVC_OK;
}

// live: the rows read_kv returns; capacity: the storage holding them (whole blocks, the ring's used slots, the full
// array); pool: the ring's slots not used yet; workspace: the block tables, sized in create.
kvc_status memory(kvc_cache* h, kvc_memory* out) {
    Cache* c = self(h);
    const uint64_t rb = 2 * c->row_bytes();
    uint64_t live = 0, capacity = 0, held = 0, workspace = 0;
    for (auto& seq : c->streams)
        for (uint32_t l = 0; l < c->cfg.n_layers; ++l) {
            Stream& s = seq[l];
            for (uint32_t p = 0; p < s.len; ++p) live += holds(*c, s, l, p) ? rb : 0;
            workspace += (s.kb.capacity() + s.vb.capacity()) * sizeof(std::vector<uint8_t>);
            if (c->blocks(l)) {
                uint64_t blocks = 0;
                for (const auto& b : s.kb) blocks += b.empty() ? 0 : 1;
                capacity += blocks * kBlock * rb;
                held += blocks * kBlock * rb;
                continue;
            }
            held += s.k.capacity() + s.v.capacity();
            capacity += c->ring(l) ? std::min<uint64_t>(s.len, c->cfg.n_sinks + c->window(l)) * rb : uint64_t{s.len} * rb;
        }
    kvc_memory m{};
    m.struct_size = sizeof m;
    m.block_size = kBlocks && c->cfg.evict ? kBlock : 1;
    m.live_bytes = live;
    m.capacity_bytes = capacity;
    m.pool_bytes = held > capacity ? held - capacity : 0;
    m.workspace_bytes = workspace;
    kvc::dbl::put_memory(out, m);
    return KVC_OK;
}

kvc_status fork(kvc_cache* h, uint32_t parent, uint32_t child) {
    Cache* c = self(h);
    if (const kvc_status st = kvc::dbl::check_fork(c, parent, child); st != KVC_OK) return st;
    c->streams[child] = c->streams[parent];
    return KVC_OK;
}

kvc_status release(kvc_cache* h, uint32_t seq) {
    Cache* c = self(h);
    if (seq >= c->cfg.max_seqs) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq");
    for (uint32_t l = 0; l < c->cfg.n_layers; ++l) {
        Stream& s = c->streams[seq][l];
        s.len = 0;
        if (c->blocks(l))
            for (size_t b = 0; b < s.kb.size(); ++b) {
                std::vector<uint8_t>().swap(s.kb[b]);
                std::vector<uint8_t>().swap(s.vb[b]);
            }
        else if (!c->ring(l)) {
            std::vector<uint8_t>().swap(s.k);
            std::vector<uint8_t>().swap(s.v);
        }
    }
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api), KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR, "window-double", "1",
    get_caps, create, destroy, last_error, append_attend, nullptr, read_kv, seq_length, memory, fork, release,
    nullptr};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major,
                                                                                            uint32_t) {
    return major == KVC_ABI_VERSION_MAJOR ? &kApi : nullptr;
}
