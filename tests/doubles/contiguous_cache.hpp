// The plain contiguous KV cache behind the plugin ABI that the C++ test doubles are built on: one growing array of
// K rows and one of V rows per (sequence, layer), appended to and read back exactly. A double takes this cache (or
// one derived from it, with its own state), writes its get_caps and append_attend, and fills its function table with
// the functions below, replacing those its behaviour changes. The functions take the double's cache type C, so that
// the ones it keeps see its state: its slack rows (C::kSlackRows), its destructor.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/reference/dtype.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace kvc::dbl {

// The message of the last failed create: what last_error(NULL) says. Each double is one translation unit, so
// internal linkage gives each its own, without the guard an inline variable would add to its thread-local storage
// (the allocator watch of NO-Q sees the block that storage takes).
static thread_local std::string create_error;

// One (sequence, layer): rows [n_kv_heads * head_dim] back to back, as Elem: uint8_t holds the cache dtype's bytes,
// float the stored values widened. Storage past row `len` is not the stream's rows (slack, or stale rows).
template <class Elem>
struct Stream {
    std::vector<Elem> k, v;
    uint32_t len = 0;
};

template <class Elem>
struct Cache {
    static_assert(std::is_same_v<Elem, uint8_t> || std::is_same_v<Elem, float>, "bytes, or widened floats");
    using Element = Elem;
    using Stream = dbl::Stream<Elem>;
    static constexpr uint32_t kSlackRows = 0; // rows of storage kept past the last one (a fork copies them too)

    kvc_config cfg{};
    std::vector<std::vector<Stream>> streams; // [seq][layer]
    std::string error;

    size_t row() const { return static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim; } // elements of one row
    size_t es() const { return cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2; }              // bytes of one element
    size_t per() const { return std::is_same_v<Elem, uint8_t> ? es() : 1; }            // Elems holding one
    // element i of a stream's K or V, widened
    float at(const std::vector<Elem>& b, size_t i) const {
        if constexpr (std::is_same_v<Elem, uint8_t>)
            return ref::load_dtype(b.data() + i * es(), cfg.cache_dtype);
        else
            return b[i];
    }
    kvc_status fail(kvc_status s, const std::string& m) {
        error = m;
        return s;
    }
    bool has(uint32_t seq, uint32_t layer) const { return seq < cfg.max_seqs && layer < cfg.n_layers; }
};

template <class C>
C* self(kvc_cache* h) {
    return reinterpret_cast<C*>(h);
}

// get_caps' copy: as much of c as the caller's struct and `known` (the kvc_caps this plugin knows) hold.
inline void put_caps(kvc_caps* out, kvc_caps c, size_t known = sizeof(kvc_caps)) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(out->struct_size, known));
    c.struct_size = n;
    std::memcpy(out, &c, n);
}

// A host cache with these dtypes and features, of the f32 precision class.
inline kvc_caps host_caps(uint32_t dtypes, uint32_t features) {
    kvc_caps c{};
    c.struct_size = sizeof c;
    c.dtypes = dtypes;
    c.features = features;
    c.precision = KVC_PRECISION_F32;
    c.memory_space = KVC_MEMORY_HOST;
    return c;
}

// create's refusals (in create_error): a config outside `dtypes` (bit per kvc_dtype), with RoPE unless `rope` (then
// NEOX or GPTJ on an even head_dim), or invalid.
inline bool refuses(const kvc_config* cfg, kvc_cache** out, uint32_t dtypes, bool rope) {
    if (!cfg || !out || cfg->n_kv_heads == 0 || cfg->head_dim == 0 || cfg->n_q_heads % cfg->n_kv_heads != 0 ||
        cfg->cache_dtype > KVC_DTYPE_BF16 || !(dtypes >> cfg->cache_dtype & 1u) ||
        (rope ? cfg->rope > KVC_ROPE_GPTJ || (cfg->rope != KVC_ROPE_NONE && cfg->head_dim % 2) : cfg->rope != 0) ||
        cfg->n_layers == 0 || cfg->max_seqs == 0) {
        create_error = "unsupported or invalid config";
        return true;
    }
    return false;
}

// A new cache of type C for an accepted config, every stream empty.
template <class C>
C* make(const kvc_config& cfg) {
    auto* c = new C;
    c->cfg = cfg;
    c->streams.assign(cfg.max_seqs, std::vector<typename C::Stream>(cfg.n_layers));
    return c;
}

template <class C, uint32_t kDtypes = 0x7u, bool kRope = false>
kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (refuses(cfg, out, kDtypes, kRope)) return KVC_ERR_UNSUPPORTED;
    *out = reinterpret_cast<kvc_cache*>(make<C>(*cfg));
    return KVC_OK;
}

template <class C>
void destroy(kvc_cache* h) {
    delete self<C>(h);
}

template <class C>
const char* last_error(const kvc_cache* h) {
    return h ? reinterpret_cast<const C*>(h)->error.c_str() : create_error.c_str();
}

// append_attend's refusals: a sequence or layer out of range, or more rows than max_tokens.
template <class C>
kvc_status check_append(C* c, uint32_t seq, uint32_t layer, uint32_t n_new) {
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    if (c->streams[seq][layer].len + n_new > c->cfg.max_tokens) return c->fail(KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    return KVC_OK;
}

// Appends n rows of k and v ([n][row] float32) to s, stored in the cache dtype. Storage grows to the rows plus
// C::kSlackRows, and never shrinks: what lies past the new rows stays as it was.
template <class C>
void store(const C& c, typename C::Stream& s, uint32_t n, const float* k, const float* v) {
    const size_t R = c.row(), P = c.per(), before = s.len, need = (before + n + C::kSlackRows) * R * P;
    if (s.k.size() < need) {
        s.k.resize(need);
        s.v.resize(need);
    }
    for (size_t i = 0; i < n * R; ++i) {
        if constexpr (std::is_same_v<typename C::Element, uint8_t>) {
            ref::store_dtype(k[i], c.cfg.cache_dtype, s.k.data() + (before * R + i) * P);
            ref::store_dtype(v[i], c.cfg.cache_dtype, s.v.data() + (before * R + i) * P);
        } else {
            s.k[before * R + i] = ref::round_to_dtype(k[i], c.cfg.cache_dtype);
            s.v[before * R + i] = ref::round_to_dtype(v[i], c.cfg.cache_dtype);
        }
    }
    s.len += n;
}

template <class C>
kvc_status read_kv(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    C* c = self<C>(h);
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    const auto& s = c->streams[seq][layer];
    if (static_cast<uint64_t>(pos) + n > s.len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "read past the end");
    const size_t R = c->row(), E = c->es();
    if constexpr (std::is_same_v<typename C::Element, uint8_t>) {
        std::memcpy(k_out, s.k.data() + pos * R * E, n * R * E);
        std::memcpy(v_out, s.v.data() + pos * R * E, n * R * E);
    } else {
        for (size_t x = 0; x < n * R; ++x) {
            ref::store_dtype(s.k[pos * R + x], c->cfg.cache_dtype, static_cast<uint8_t*>(k_out) + x * E);
            ref::store_dtype(s.v[pos * R + x], c->cfg.cache_dtype, static_cast<uint8_t*>(v_out) + x * E);
        }
    }
    return KVC_OK;
}

template <class C>
kvc_status seq_length(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t* len) {
    C* c = self<C>(h);
    if (!c->has(seq, layer) || !len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    *len = c->streams[seq][layer].len;
    return KVC_OK;
}

// What the streams hold: live, the bytes of the rows in the cache dtype (the ABI's formula); held, every byte of
// their storage.
struct Usage {
    uint64_t live = 0, held = 0;
};

template <class C>
Usage usage(const C& c) {
    Usage u;
    for (const auto& layers : c.streams)
        for (const auto& s : layers) {
            u.live += 2ull * s.len * c.row() * c.es();
            u.held += (s.k.capacity() + s.v.capacity()) * sizeof(typename C::Element);
        }
    return u;
}

// The report of storage exact per token: `capacity` of it in use, the rest of what is held as pool.
inline kvc_memory report(const Usage& u, uint64_t capacity, uint64_t workspace = 0) {
    kvc_memory m{};
    m.struct_size = sizeof m;
    m.block_size = 1;
    m.live_bytes = u.live;
    m.capacity_bytes = capacity;
    m.pool_bytes = u.held - std::min(u.held, capacity);
    m.workspace_bytes = workspace;
    return m;
}

// memory's copy: as much of m as the caller's struct and `known` (the kvc_memory this plugin knows) hold; the
// caller's struct_size stays.
inline void put_memory(kvc_memory* out, kvc_memory m, size_t known = sizeof(kvc_memory)) {
    m.struct_size = out->struct_size;
    std::memcpy(out, &m, std::min<size_t>(out->struct_size, known));
}

template <class C>
kvc_status memory(kvc_cache* h, kvc_memory* out) {
    const Usage u = usage(*self<C>(h));
    put_memory(out, report(u, u.live));
    return KVC_OK;
}

// What the ABI asks of a fork's arguments, for every double: ids in range and distinct, a parent holding a row in
// some layer, a child holding none in any. Any cache with cfg, streams[seq][layer].len and fail() can use it.
template <class C>
kvc_status check_fork(C* c, uint32_t parent, uint32_t child) {
    if (parent >= c->cfg.max_seqs || child >= c->cfg.max_seqs || parent == child)
        return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad fork");
    bool started = false;
    for (uint32_t l = 0; l < c->cfg.n_layers; ++l) {
        started = started || c->streams[parent][l].len > 0;
        if (c->streams[child][l].len != 0) return c->fail(KVC_ERR_INVALID_ARGUMENT, "child not empty");
    }
    return started ? KVC_OK : c->fail(KVC_ERR_INVALID_ARGUMENT, "parent not started");
}

// The child gets a copy of the parent's rows in every layer (and of its slack rows). As the ABI says, the parent must
// hold a row in some layer and the child none in any.
template <class C>
kvc_status fork(kvc_cache* h, uint32_t parent, uint32_t child) {
    C* c = self<C>(h);
    if (const kvc_status st = check_fork(c, parent, child); st != KVC_OK) return st;
    for (uint32_t l = 0; l < c->cfg.n_layers; ++l) {
        const auto& p = c->streams[parent][l];
        auto& ch = c->streams[child][l];
        const auto n = static_cast<std::ptrdiff_t>(
            std::min(p.k.size(), (p.len + C::kSlackRows) * c->row() * c->per()));
        ch.k.assign(p.k.begin(), p.k.begin() + n);
        ch.v.assign(p.v.begin(), p.v.begin() + n);
        ch.len = p.len;
    }
    return KVC_OK;
}

// Every layer of seq empty again: storage freed, or with kKeepRows reused as it is, the rows left behind.
template <class C, bool kKeepRows = false>
kvc_status release(kvc_cache* h, uint32_t seq) {
    C* c = self<C>(h);
    if (seq >= c->cfg.max_seqs) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq");
    for (auto& s : c->streams[seq]) {
        if (kKeepRows) s.len = 0;
        else s = typename C::Stream{};
    }
    return KVC_OK;
}

} // namespace kvc::dbl
