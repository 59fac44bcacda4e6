// C++ view of the kvcheck plugin ABI: RAII ownership of a cache and exceptions instead of status codes.
// Header-only and dependency-free so that plugin authors and the harness can both use it.
#pragma once

#include "kvcheck/abi.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace kvc {

// A call that returned something other than KVC_OK, with the implementation's own message.
class AbiError : public std::runtime_error {
public:
    AbiError(kvc_status status, const std::string& what) : std::runtime_error(what), status_(status) {}
    kvc_status status() const { return status_; }

private:
    kvc_status status_;
};

inline const char* status_name(kvc_status s) {
    switch (s) {
    case KVC_OK: return "OK";
    case KVC_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case KVC_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case KVC_ERR_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case KVC_ERR_INTERNAL: return "INTERNAL";
    case KVC_ERR_EVICTED: return "EVICTED";
    }
    return "UNKNOWN_STATUS";
}

// Bytes of one stored element as read_kv returns it: 4 (f32), 2 (f16, bf16), 1 (the code of a quantized dtype).
inline std::size_t dtype_size(uint32_t dtype) {
    switch (dtype) {
    case KVC_DTYPE_F32: return 4;
    case KVC_DTYPE_F16:
    case KVC_DTYPE_BF16: return 2;
    default: return 1;
    }
}

// ABI 1.2: the quantized cache dtypes (codes plus scales).
inline bool dtype_is_quantized(uint32_t dtype) {
    return dtype == KVC_DTYPE_FP8_E4M3 || dtype == KVC_DTYPE_FP8_E5M2 || dtype == KVC_DTYPE_INT8_TOKEN ||
           dtype == KVC_DTYPE_Q8_0;
}
inline bool dtype_is_fp8(uint32_t dtype) { return dtype == KVC_DTYPE_FP8_E4M3 || dtype == KVC_DTYPE_FP8_E5M2; }

// Scales per head row (head_dim values of one token's K or V in one KV head) as read_kv_scales returns them.
inline uint32_t scales_per_head_row(uint32_t dtype, uint32_t head_dim) {
    if (dtype == KVC_DTYPE_Q8_0) return head_dim / 32;
    return dtype_is_quantized(dtype) ? 1u : 0u;
}
// Bytes of one scale as read_kv_scales returns it: f32 for fp8, the config's dtype for INT8_TOKEN, f16 for Q8_0.
inline std::size_t scale_size(uint32_t dtype, uint32_t int8_scale_dtype) {
    if (dtype_is_fp8(dtype)) return 4;
    if (dtype == KVC_DTYPE_INT8_TOKEN) return int8_scale_dtype == KVC_DTYPE_F16 ? 2 : 4;
    if (dtype == KVC_DTYPE_Q8_0) return 2;
    return 0;
}
// Bytes one head row costs in live_bytes: the elements plus the scales stored with the row (fp8's scales belong to
// the config, not to a row, so they are not counted here).
inline std::size_t head_row_bytes(uint32_t dtype, uint32_t head_dim, uint32_t int8_scale_dtype) {
    const std::size_t elems = std::size_t{head_dim} * dtype_size(dtype);
    if (dtype_is_fp8(dtype) || !dtype_is_quantized(dtype)) return elems;
    return elems + scales_per_head_row(dtype, head_dim) * scale_size(dtype, int8_scale_dtype);
}

// ABI 1.2: the dims of a V row and of an output row (head_dim_v, or head_dim when it is 0).
inline uint32_t value_dim(const kvc_config& c) { return c.head_dim_v != 0 ? c.head_dim_v : c.head_dim; }
// ABI 1.2: whether the query at absolute position i sees the key at absolute position j in a layer of window w
// (0: no window) with s sinks. The one visibility rule of docs/windowed-caches.md.
inline bool key_visible(uint64_t i, uint64_t j, uint32_t w, uint32_t s) {
    return j <= i && (w == 0 || j < s || i - j < w);
}

inline const char* dtype_name(uint32_t dtype) {
    switch (dtype) {
    case KVC_DTYPE_F32: return "f32";
    case KVC_DTYPE_F16: return "f16";
    case KVC_DTYPE_BF16: return "bf16";
    case KVC_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case KVC_DTYPE_FP8_E5M2: return "fp8_e5m2";
    case KVC_DTYPE_INT8_TOKEN: return "int8_token";
    case KVC_DTYPE_Q8_0: return "q8_0";
    }
    return "unknown-dtype";
}

inline const char* rope_name(uint32_t rope) {
    switch (rope) {
    case KVC_ROPE_NONE: return "none";
    case KVC_ROPE_NEOX: return "neox";
    case KVC_ROPE_GPTJ: return "gptj";
    }
    return "unknown-rope";
}

// True when the table's struct_size covers `member`: how a newer harness tells an older plugin's table apart.
#define KVC_API_HAS(api, member)                                                                                       \
    ((api) != nullptr && offsetof(kvc_plugin_api, member) + sizeof(((kvc_plugin_api*)nullptr)->member) <=               \
                             (api)->struct_size &&                                                                     \
     (api)->member != nullptr)

namespace detail {
// Destroys a cache through the table that created it. (Outside Cache: a nested type with default member
// initializers is not default-constructible until the enclosing class is complete.)
struct CacheDeleter {
    const kvc_plugin_api* api = nullptr;
    void operator()(kvc_cache* c) const {
        if (api && c) api->destroy(c);
    }
};
} // namespace detail

// One cache instance of one implementation. Move-only; destroys the instance on scope exit.
class Cache {
public:
    Cache(const kvc_plugin_api* api, const kvc_config& config) : api_(api) {
        kvc_cache* raw = nullptr;
        kvc_status s = api_->create(&config, &raw);
        if (s != KVC_OK || raw == nullptr) {
            const char* msg = api_->last_error(nullptr);
            throw AbiError(s == KVC_OK ? KVC_ERR_INTERNAL : s,
                           std::string("create: ") + (msg ? msg : "(no message)"));
        }
        cache_.reset(raw);
        cache_.get_deleter().api = api_;
    }

    const kvc_plugin_api* api() const { return api_; }
    kvc_cache* get() const { return cache_.get(); }

    void append_attend(uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k, const float* v,
                       float* out) {
        check(api_->append_attend(get(), seq, layer, n_new, q, k, v, out), "append_attend");
    }
    void append_attend_batch(uint32_t layer, const kvc_batch& batch) {
        if (!KVC_API_HAS(api_, append_attend_batch))
            throw AbiError(KVC_ERR_UNSUPPORTED, "append_attend_batch: not provided");
        check(api_->append_attend_batch(get(), layer, &batch), "append_attend_batch");
    }
    void read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
        check(api_->read_kv(get(), seq, layer, pos, n, k_out, v_out), "read_kv");
    }
    void read_kv_scales(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
        if (!KVC_API_HAS(api_, read_kv_scales))
            throw AbiError(KVC_ERR_UNSUPPORTED, "read_kv_scales: not provided");
        check(api_->read_kv_scales(get(), seq, layer, pos, n, k_out, v_out), "read_kv_scales");
    }
    uint32_t seq_length(uint32_t seq, uint32_t layer) {
        uint32_t len = 0;
        check(api_->seq_length(get(), seq, layer, &len), "seq_length");
        return len;
    }
    kvc_memory memory() {
        kvc_memory m{};
        m.struct_size = sizeof m;
        check(api_->memory(get(), &m), "memory");
        return m;
    }
    void fork(uint32_t parent, uint32_t child) {
        if (!KVC_API_HAS(api_, fork)) throw AbiError(KVC_ERR_UNSUPPORTED, "fork: not provided");
        check(api_->fork(get(), parent, child), "fork");
    }
    void release(uint32_t seq) {
        if (!KVC_API_HAS(api_, release)) throw AbiError(KVC_ERR_UNSUPPORTED, "release: not provided");
        check(api_->release(get(), seq), "release");
    }

private:
    void check(kvc_status s, const char* op) const {
        if (s == KVC_OK) return;
        const char* msg = api_->last_error(get());
        throw AbiError(s, std::string(op) + " failed (" + status_name(s) + "): " + (msg ? msg : "(no message)"));
    }

    const kvc_plugin_api* api_;
    std::unique_ptr<kvc_cache, detail::CacheDeleter> cache_;
};

// A filled kvc_config: struct_size set, every field named once. scale 0 means 1/sqrt(head_dim) (computed in float).
inline kvc_config make_config(uint32_t n_layers, uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim,
                              uint32_t cache_dtype, uint32_t max_seqs, uint32_t max_tokens,
                              uint32_t rope = KVC_ROPE_NONE, uint32_t block_size_hint = 0, float scale = 0.0f,
                              float rope_theta = 10000.0f) {
    kvc_config c{};
    c.struct_size = sizeof c;
    c.n_layers = n_layers;
    c.n_q_heads = n_q_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = head_dim;
    c.cache_dtype = cache_dtype;
    c.max_seqs = max_seqs;
    c.max_tokens = max_tokens;
    c.scale = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
    c.rope = rope;
    c.rope_theta = rope_theta;
    c.block_size_hint = block_size_hint;
    return c;
}

inline kvc_caps query_caps(const kvc_plugin_api* api) {
    kvc_caps caps{};
    caps.struct_size = sizeof caps;
    api->get_caps(&caps);
    return caps;
}

} // namespace kvc
