// A paged KV cache whose fork shares blocks, behind the plugin ABI: a pool of blocks of 4 tokens (K and V of every KV
// head), one block table per (sequence, layer), reference counts, and a free list that later appends take from, last
// freed first. Fork shares every full block and copies the partly filled last one, so no block is ever written
// while another sequence holds it. One correct cache and the sharing bugs, to prove that FORK, RELEASE and MEMORY
// catch them for the right reason. KVC_SHARE_DOUBLE selects the behaviour (CMakeLists.txt lists them).
#include "contiguous_cache.hpp"

#include <cmath>
#include <vector>

#ifndef KVC_SHARE_DOUBLE
#error "define KVC_SHARE_DOUBLE to one of the behaviours below"
#endif

#define SHARE_CORRECT 0       // shares full blocks, declares KVC_FEATURE_FORK_SHARES: passes everything
#define SHARE_FREES_SHARED 1  // release frees every block of the sequence, shared or not: FORK, RELEASE
#define SHARE_COUNTS_TWICE 2  // reports a shared block once per sequence holding it: FORK, MEMORY
#define SHARE_COPIES 3        // declares KVC_FEATURE_FORK_SHARES but copies every block on fork: FORK, MEMORY
#define SHARE_COPIES_HONEST 4 // copies every block on fork and declares no sharing: passes everything
#define SHARE_PAGES_128 5     // the correct cache with fixed 128-token pages (TensorRT-LLM's), longer than
                              // many sequences a case lets grow: passes everything
#define SHARE_PAGES_HUGE 6    // the correct cache with 1024-token pages, past both max_tokens and the 256 tokens a
                              // fixed page may hold: capacity reports could run far past the rows held: MEMORY

namespace {

constexpr uint32_t kBlock = KVC_SHARE_DOUBLE == SHARE_PAGES_128 ? 128 : KVC_SHARE_DOUBLE == SHARE_PAGES_HUGE ? 1024 : 4;
constexpr bool kCopiesAll = KVC_SHARE_DOUBLE == SHARE_COPIES || KVC_SHARE_DOUBLE == SHARE_COPIES_HONEST;

struct Cache {
    struct Stream {
        uint32_t len = 0;
        std::vector<uint32_t> table; // block ids, one per kBlock positions
    };
    kvc_config cfg{};
    std::vector<std::vector<Stream>> streams; // [seq][layer]
    std::vector<std::vector<uint8_t>> blocks; // [id] K rows then V rows of kBlock positions
    std::vector<uint32_t> refs;               // [id] tables holding the block; 0: on the free list
    std::vector<uint32_t> free_list;
    std::string error;

    size_t row_bytes() const { return size_t{cfg.n_kv_heads} * cfg.head_dim * (cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2); }
    bool has(uint32_t seq, uint32_t layer) const { return seq < cfg.max_seqs && layer < cfg.n_layers; }
    kvc_status fail(kvc_status s, const std::string& m) {
        error = m;
        return s;
    }
    uint32_t take() {
        if (free_list.empty()) {
            blocks.emplace_back(2 * kBlock * row_bytes());
            refs.push_back(0);
            free_list.push_back(static_cast<uint32_t>(blocks.size() - 1));
        }
        const uint32_t id = free_list.back();
        free_list.pop_back();
        refs[id] = 1;
        return id;
    }
    void drop(uint32_t id) {
        if (refs[id] > 0 && --refs[id] == 0) free_list.push_back(id);
    }
    uint8_t* row(const Stream& s, uint32_t pos, bool v) {
        return blocks[s.table[pos / kBlock]].data() + ((v ? kBlock : 0) + pos % kBlock) * row_bytes();
    }
};

Cache* self(kvc_cache* h) { return reinterpret_cast<Cache*>(h); }

void get_caps(kvc_caps* out) {
    uint32_t f = KVC_FEATURE_GQA | KVC_FEATURE_PAGED | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED;
    if (KVC_SHARE_DOUBLE != SHARE_COPIES_HONEST) f |= KVC_FEATURE_FORK_SHARES;
    kvc_caps c = kvc::dbl::host_caps(0x7u, f);
    c.max_head_dim = 64;
    kvc::dbl::put_caps(out, c);
}

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (kvc::dbl::refuses(cfg, out, 0x7u, false)) return KVC_ERR_UNSUPPORTED;
    auto* c = new Cache;
    c->cfg = *cfg;
    c->cfg.k_scales = c->cfg.v_scales = nullptr; // the harness's arrays are not ours to keep
    c->cfg.windows = nullptr;
    c->streams.assign(cfg->max_seqs, std::vector<Cache::Stream>(cfg->n_layers));
    *out = reinterpret_cast<kvc_cache*>(c);
    return KVC_OK;
}

void destroy(kvc_cache* h) { delete self(h); }
const char* last_error(const kvc_cache* h) {
    return h ? reinterpret_cast<const Cache*>(h)->error.c_str() : kvc::dbl::create_error.c_str();
}

// Each new row is stored (a new block at every kBlock-th position), then its queries attend rows 0 .. pos in f32.
kvc_status append_attend(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                         const float* v, float* out) {
    Cache* c = self(h);
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    Cache::Stream& s = c->streams[seq][layer];
    if (uint64_t{s.len} + n_new > c->cfg.max_tokens) return c->fail(KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    const uint32_t d = c->cfg.head_dim, Hq = c->cfg.n_q_heads, group = Hq / c->cfg.n_kv_heads;
    const size_t R = size_t{c->cfg.n_kv_heads} * d, E = c->cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2;
    std::vector<float> sc;
    for (uint32_t i = 0; i < n_new; ++i) {
        const uint32_t pos = s.len;
        if (pos % kBlock == 0) s.table.push_back(c->take());
        for (size_t x = 0; x < R; ++x) {
            kvc::ref::store_dtype(k[i * R + x], c->cfg.cache_dtype, c->row(s, pos, false) + x * E);
            kvc::ref::store_dtype(v[i * R + x], c->cfg.cache_dtype, c->row(s, pos, true) + x * E);
        }
        s.len = pos + 1;
        for (uint32_t hq = 0; hq < Hq; ++hq) {
            const float* qr = q + (size_t{i} * Hq + hq) * d;
            const size_t head = size_t{hq / group} * d * E;
            sc.assign(pos + 1, 0.f);
            float m = -INFINITY, l = 0;
            for (uint32_t j = 0; j <= pos; ++j) {
                float dot = 0;
                for (uint32_t x = 0; x < d; ++x)
                    dot += qr[x] * kvc::ref::load_dtype(c->row(s, j, false) + head + x * E, c->cfg.cache_dtype);
                m = std::max(m, sc[j] = dot * c->cfg.scale);
            }
            for (float& x : sc) l += (x = std::exp(x - m));
            float* o = out + (size_t{i} * Hq + hq) * d;
            std::fill(o, o + d, 0.f);
            for (uint32_t j = 0; j <= pos; ++j)
                for (uint32_t x = 0; x < d; ++x)
                    o[x] += sc[j] * kvc::ref::load_dtype(c->row(s, j, true) + head + x * E, c->cfg.cache_dtype);
            for (uint32_t x = 0; x < d; ++x) o[x] /= l;
        }
    }
    return KVC_OK;
}

kvc_status read_kv(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    Cache* c = self(h);
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    const Cache::Stream& s = c->streams[seq][layer];
    if (uint64_t{pos} + n > s.len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "read past the end");
    const size_t rb = c->row_bytes();
    for (uint32_t i = 0; i < n; ++i) {
        std::memcpy(static_cast<uint8_t*>(k_out) + i * rb, c->row(s, pos + i, false), rb);
        std::memcpy(static_cast<uint8_t*>(v_out) + i * rb, c->row(s, pos + i, true), rb);
    }
    return KVC_OK;
}

kvc_status seq_length(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t* len) {
    Cache* c = self(h);
    if (!c->has(seq, layer) || !len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    *len = c->streams[seq][layer].len;
    return KVC_OK;
}

// capacity: the blocks some table holds, each once (counts_twice: once per table); pool: the free blocks and the
// bookkeeping of the pool (each block's vector and allocation header, its count, the tables, the free list), which
// grows with the blocks; workspace: none.
kvc_status memory(kvc_cache* h, kvc_memory* out) {
    Cache* c = self(h);
    const uint64_t block_bytes = 2ull * kBlock * c->row_bytes();
    uint64_t live = 0, in_use = 0;
    uint64_t books = c->blocks.capacity() * (sizeof(std::vector<uint8_t>) + 16) +
                     (c->refs.capacity() + c->free_list.capacity()) * sizeof(uint32_t);
    for (const auto& seq : c->streams)
        for (const Cache::Stream& s : seq) {
            live += 2ull * s.len * c->row_bytes();
            in_use += KVC_SHARE_DOUBLE == SHARE_COUNTS_TWICE ? s.table.size() : 0;
            books += s.table.capacity() * sizeof(uint32_t);
        }
    if (KVC_SHARE_DOUBLE != SHARE_COUNTS_TWICE)
        for (uint32_t r : c->refs) in_use += r > 0;
    kvc_memory m{};
    m.struct_size = sizeof m;
    m.block_size = kBlock;
    m.live_bytes = live;
    m.capacity_bytes = in_use * block_bytes;
    m.pool_bytes = c->free_list.size() * block_bytes + books;
    kvc::dbl::put_memory(out, m);
    return KVC_OK;
}

kvc_status fork(kvc_cache* h, uint32_t parent, uint32_t child) {
    Cache* c = self(h);
    if (const kvc_status st = kvc::dbl::check_fork(c, parent, child); st != KVC_OK) return st;
    for (uint32_t l = 0; l < c->cfg.n_layers; ++l) {
        const Cache::Stream& p = c->streams[parent][l];
        Cache::Stream& s = c->streams[child][l];
        s.len = p.len;
        s.table.clear();
        for (size_t b = 0; b < p.table.size(); ++b) {
            const bool full = (b + 1) * kBlock <= p.len;
            if (full && !kCopiesAll) { // shared: never written again (appends go past the parent's length)
                ++c->refs[p.table[b]];
                s.table.push_back(p.table[b]);
                continue;
            }
            const uint32_t id = c->take(); // may grow the pool: copy from the block by id, not by reference
            c->blocks[id] = c->blocks[p.table[b]];
            s.table.push_back(id);
        }
    }
    return KVC_OK;
}

kvc_status release(kvc_cache* h, uint32_t seq) {
    Cache* c = self(h);
    if (seq >= c->cfg.max_seqs) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq");
    for (Cache::Stream& s : c->streams[seq]) {
        for (uint32_t id : s.table) {
            if (KVC_SHARE_DOUBLE == SHARE_FREES_SHARED && c->refs[id] > 1) c->refs[id] = 1; // the bug: back to the pool
            c->drop(id);
        }
        s = Cache::Stream{};
    }
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api), KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR, "shared-block-double", "1",
    get_caps, create, destroy, last_error, append_attend, nullptr, read_kv, seq_length, memory, fork, release,
    nullptr};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major,
                                                                                            uint32_t) {
    return major == KVC_ABI_VERSION_MAJOR ? &kApi : nullptr;
}
