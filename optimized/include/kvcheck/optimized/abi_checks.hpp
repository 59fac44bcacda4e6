// The argument checks of the ABI's calls, shared by the CPU and the CUDA engine: both refuse the same configs and
// the same calls, with the same status and the same words (docs/engine.md, "Calls and bad input"). Host code only.
//
// Every check runs before its call changes anything and returns a Refusal; status KVC_OK means "go on". What a check
// needs to know of an engine comes through a CacheView: the config, the token limit per stream, and two questions
// about the sequences it holds.
#pragma once

#include "kvcheck/abi.h"

#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

namespace kvc::opt {

// No heap: checks run outside the engines' exception guards, and no exception may cross the ABI.
struct Refusal {
    kvc_status status = KVC_OK;
    char message[512] = ""; // empty when status is KVC_OK

    bool refused() const { return status != KVC_OK; }
};

inline Refusal refuse(kvc_status status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
inline Refusal refuse(kvc_status status, const char* fmt, ...) {
    Refusal r;
    r.status = status;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(r.message, sizeof r.message, fmt, ap);
    va_end(ap);
    return r;
}

// What the checks read of an engine. Each engine passes lambdas that capture one pointer: std::function keeps
// those in place (no allocation).
struct CacheView {
    const kvc_config* cfg = nullptr;
    uint64_t max_tokens = 0;                                // per stream (sequence, layer)
    std::function<uint64_t(uint32_t seq, uint32_t layer)> length; // tokens the stream holds; 0 when none
    std::function<bool(uint32_t seq)> started;                // the sequence holds tokens (appended, not released)
};

inline bool is_quantized_dtype(uint32_t dtype) { return dtype >= KVC_DTYPE_FP8_E4M3 && dtype <= KVC_DTYPE_Q8_0; }

// create() of a quantized cache (ABI 1.2): the fields that describe its scales (docs/quantized.md).
inline Refusal check_quant_config(const kvc_config& c) {
    const size_t need = offsetof(kvc_config, int8_scale_dtype) + sizeof c.int8_scale_dtype;
    if (c.struct_size < need)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "a quantized cache_dtype needs the ABI 1.2 config (struct_size %u < %zu)",
                      c.struct_size, need);
    if (c.cache_dtype == KVC_DTYPE_FP8_E4M3 || c.cache_dtype == KVC_DTYPE_FP8_E5M2) {
        if (c.kv_scale_mode > KVC_SCALE_KV_HEAD)
            return refuse(KVC_ERR_INVALID_ARGUMENT, "kv_scale_mode %u is unknown", c.kv_scale_mode);
        if (c.kv_scale_mode == KVC_SCALE_NONE) return {};
        if (c.k_scales == nullptr || c.v_scales == nullptr)
            return refuse(KVC_ERR_INVALID_ARGUMENT, "kv_scale_mode %u needs k_scales and v_scales", c.kv_scale_mode);
        const uint64_t n = uint64_t{c.n_layers} * (c.kv_scale_mode == KVC_SCALE_KV_HEAD ? c.n_kv_heads : 1u);
        for (uint64_t i = 0; i < n; ++i)
            if (!(std::isfinite(c.k_scales[i]) && c.k_scales[i] > 0.0f) ||
                !(std::isfinite(c.v_scales[i]) && c.v_scales[i] > 0.0f))
                return refuse(KVC_ERR_INVALID_ARGUMENT, "fp8 scale %llu is not finite and > 0 (k %g, v %g)",
                              static_cast<unsigned long long>(i), static_cast<double>(c.k_scales[i]),
                              static_cast<double>(c.v_scales[i]));
    }
    if (c.cache_dtype == KVC_DTYPE_INT8_TOKEN && c.int8_scale_dtype != KVC_DTYPE_F32 &&
        c.int8_scale_dtype != KVC_DTYPE_F16)
        return refuse(KVC_ERR_UNSUPPORTED, "int8_scale_dtype %u is not f32 or f16", c.int8_scale_dtype);
    if (c.cache_dtype == KVC_DTYPE_Q8_0 && c.head_dim % 32 != 0)
        return refuse(KVC_ERR_UNSUPPORTED, "q8_0 needs a head_dim that is a multiple of 32 (got %u)", c.head_dim);
    return {};
}

// Whether some layer of the config has a sliding window (windows given, some W > 0).
inline bool any_window(const kvc_config& c) {
    if (c.windows == nullptr) return false;
    for (uint32_t l = 0; l < c.n_layers; ++l)
        if (c.windows[l] != 0) return true;
    return false;
}

// create() (ABI 1.2): the windowed and latent fields (check_config has made sure the struct holds them). windows:
// the engine implements sliding windows, sinks and eviction (both engines do).
// n_sinks without any window is accepted and has no effect: every key is visible anyway.
inline Refusal check_window_config(const kvc_config& c, bool windows) {
    if (c.evict > 1) return refuse(KVC_ERR_INVALID_ARGUMENT, "evict must be 0 or 1 (got %u)", c.evict);
    const bool any = any_window(c);
    if (c.evict != 0 && !any)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "evict needs a sliding window (config.windows with some W > 0)");
    if (any && !windows)
        return refuse(KVC_ERR_UNSUPPORTED, "sliding windows (config.windows), sinks and eviction are not supported");
    return {};
}

// create() (ABI 1.2): head_dim_v and the RoPE range. latent: the engine implements both (both engines do);
// max_head_dim_v: its limit on head_dim_v.
inline Refusal check_latent_config(const kvc_config& c, bool latent, uint32_t max_head_dim_v) {
    if (c.head_dim_v != 0 && c.head_dim_v != c.head_dim && !latent)
        return refuse(KVC_ERR_UNSUPPORTED, "head_dim_v %u differs from head_dim %u: not supported", c.head_dim_v,
                      c.head_dim);
    if (c.head_dim_v > max_head_dim_v)
        return refuse(KVC_ERR_UNSUPPORTED, "head_dim_v %u exceeds max_head_dim_v %u", c.head_dim_v, max_head_dim_v);
    if (c.rope_dims == 0 && c.rope_dim_begin != 0)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "rope_dim_begin %u without rope_dims (0 means the whole head)",
                      c.rope_dim_begin);
    if (c.rope_dims != 0 && !latent)
        return refuse(KVC_ERR_UNSUPPORTED, "RoPE on a range of the head dims (rope_dims %u) is not supported",
                      c.rope_dims);
    if (c.rope_dims != 0 && uint64_t{c.rope_dim_begin} + c.rope_dims > c.head_dim)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "RoPE range [%u, %llu) exceeds head_dim %u", c.rope_dim_begin,
                      static_cast<unsigned long long>(uint64_t{c.rope_dim_begin} + c.rope_dims), c.head_dim);
    if (c.rope != KVC_ROPE_NONE && c.rope_dims % 2 != 0)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "RoPE needs an even rope_dims (got %u)", c.rope_dims);
    if (c.cache_dtype == KVC_DTYPE_Q8_0 && c.head_dim_v % 32 != 0)
        return refuse(KVC_ERR_UNSUPPORTED, "q8_0 needs a head_dim_v that is a multiple of 32 (got %u)", c.head_dim_v);
    return {};
}

// create(): the config. max_head_dim and max_count (layers, heads) are the engine's declared limits; quantized:
// the engine stores the quantized dtypes (both engines do); windows: see check_window_config; latent: see
// check_latent_config (head_dim_v is then limited by max_head_dim too).
inline Refusal check_config(const kvc_config& c, uint32_t max_head_dim, uint32_t max_count, bool quantized = false,
                            bool windows = false, bool latent = false) {
    if (c.struct_size < sizeof(kvc_config))
        return refuse(KVC_ERR_INVALID_ARGUMENT, "config.struct_size %u is smaller than kvc_config of ABI 1.0 (%zu)",
                      c.struct_size, sizeof(kvc_config));
    if (c.n_layers == 0 || c.n_q_heads == 0 || c.n_kv_heads == 0 || c.head_dim == 0 || c.max_seqs == 0)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "n_layers, n_q_heads, n_kv_heads, head_dim and max_seqs must be >= 1");
    if (c.n_q_heads % c.n_kv_heads != 0)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "n_q_heads (%u) is not a multiple of n_kv_heads (%u)", c.n_q_heads,
                      c.n_kv_heads);
    if (c.cache_dtype > KVC_DTYPE_BF16 && !(quantized && is_quantized_dtype(c.cache_dtype)))
        return refuse(KVC_ERR_UNSUPPORTED,
                      quantized ? "cache_dtype %u is not f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8_token or q8_0"
                                : "cache_dtype %u is not f32, f16 or bf16",
                      c.cache_dtype);
    if (is_quantized_dtype(c.cache_dtype))
        if (const Refusal r = check_quant_config(c); r.refused()) return r;
    if (c.rope > KVC_ROPE_GPTJ) return refuse(KVC_ERR_UNSUPPORTED, "rope variant %u is unknown", c.rope);
    // a RoPE range is checked by check_latent_config: the head outside it may be odd
    if (c.rope != KVC_ROPE_NONE && c.head_dim % 2 != 0 && !(latent && c.rope_dims != 0))
        return refuse(KVC_ERR_INVALID_ARGUMENT, "RoPE needs an even head_dim (got %u)", c.head_dim);
    if (c.rope != KVC_ROPE_NONE && !(std::isfinite(c.rope_theta) && c.rope_theta > 0.0f))
        return refuse(KVC_ERR_INVALID_ARGUMENT, "rope_theta must be positive and finite");
    if (!std::isfinite(c.scale)) return refuse(KVC_ERR_INVALID_ARGUMENT, "scale must be finite");
    if (c.head_dim > max_head_dim)
        return refuse(KVC_ERR_UNSUPPORTED, "head_dim %u exceeds max_head_dim %u", c.head_dim, max_head_dim);
    if (c.n_layers > max_count || c.n_q_heads > max_count || c.n_kv_heads > max_count)
        return refuse(KVC_ERR_UNSUPPORTED, "more layers or heads than the declared limits (%u)", max_count);
    if (const Refusal r = check_window_config(c, windows); r.refused()) return r;
    return check_latent_config(c, latent, max_head_dim);
}

// An fp8 cache's scales as both engines keep them: one per (layer, KV head) whatever the mode (1 under
// KVC_SCALE_NONE), copied out of the harness's arrays, which live only through create().
inline void expand_fp8_scales(const kvc_config& c, std::vector<float>& k, std::vector<float>& v) {
    const uint64_t n = static_cast<uint64_t>(c.n_layers) * c.n_kv_heads;
    k.assign(n, 1.0f);
    v.assign(n, 1.0f);
    for (uint64_t i = 0; i < n && c.kv_scale_mode != KVC_SCALE_NONE; ++i) {
        const uint64_t from = c.kv_scale_mode == KVC_SCALE_KV_HEAD ? i : i / c.n_kv_heads;
        k[i] = c.k_scales[from];
        v[i] = c.v_scales[from];
    }
}

// append_attend_batch(): the batch struct itself. *empty is set when it names no sequence (a no-op).
inline Refusal check_batch_struct(const kvc_batch* b, bool* empty) {
    *empty = false;
    if (b == nullptr) return refuse(KVC_ERR_INVALID_ARGUMENT, "append_attend_batch: batch is NULL");
    if (b->struct_size < sizeof(kvc_batch))
        return refuse(KVC_ERR_INVALID_ARGUMENT, "append_attend_batch: batch.struct_size %u is too small",
                      b->struct_size);
    if (b->n_seqs == 0) {
        *empty = true;
        return {};
    }
    if (b->seq_ids == nullptr || b->token_offsets == nullptr)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "append_attend_batch: seq_ids or token_offsets is NULL");
    return {};
}

// append / append_attend over the sequences of a batch (op names the call in the message): the layer, each
// sequence id (in range, not twice), the offsets (never decreasing), each stream's room under max_tokens.
// *total is the number of new tokens (0: a no-op, whatever the data pointers are).
inline Refusal check_streams(const char* op, uint32_t layer, uint32_t n_seqs, const uint32_t* seq_ids,
                             const uint32_t* offsets, const CacheView& v, uint64_t* total) {
    const kvc_config& c = *v.cfg;
    *total = 0;
    if (layer >= c.n_layers)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "%s: layer %u out of range (n_layers %u)", op, layer, c.n_layers);
    for (uint32_t i = 0; i < n_seqs; ++i) {
        const uint32_t seq = seq_ids[i];
        if (seq >= c.max_seqs)
            return refuse(KVC_ERR_INVALID_ARGUMENT, "%s: sequence %u out of range (max_seqs %u)", op, seq, c.max_seqs);
        if (offsets[i + 1] < offsets[i])
            return refuse(KVC_ERR_INVALID_ARGUMENT, "%s: token_offsets decrease at sequence index %u", op, i);
        for (uint32_t j = 0; j < i; ++j)
            if (seq_ids[j] == seq)
                return refuse(KVC_ERR_INVALID_ARGUMENT, "%s: sequence %u appears twice in one batch", op, seq);
        const uint32_t n = offsets[i + 1] - offsets[i];
        const uint64_t len = v.length(seq, layer);
        if (len + n > v.max_tokens)
            return refuse(KVC_ERR_OUT_OF_MEMORY,
                          "%s: %u new tokens on sequence %u layer %u (holding %llu) exceed max_tokens %llu", op, n, seq,
                          layer, static_cast<unsigned long long>(len), static_cast<unsigned long long>(v.max_tokens));
        *total += n;
    }
    return {};
}

// read_kv(): rows pos .. pos + n - 1 exist (in 64 bits: pos + n cannot wrap); the outputs are there when n > 0.
inline Refusal check_read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, const void* k_out,
                             const void* v_out, const CacheView& v,
                             const char* op = "read_kv") {
    const kvc_config& c = *v.cfg;
    if (seq >= c.max_seqs)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "%s: sequence %u out of range (max_seqs %u)", op, seq, c.max_seqs);
    if (layer >= c.n_layers)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "%s: layer %u out of range (n_layers %u)", op, layer, c.n_layers);
    const uint64_t len = v.length(seq, layer);
    if (static_cast<uint64_t>(pos) + n > len)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "%s: rows %u..%llu of sequence %u layer %u, which holds %llu", op, pos,
                      static_cast<unsigned long long>(static_cast<uint64_t>(pos) + n) - 1, seq, layer,
                      static_cast<unsigned long long>(len));
    if (n > 0 && (k_out == nullptr || v_out == nullptr))
        return refuse(KVC_ERR_INVALID_ARGUMENT, "%s: k_out or v_out is NULL", op);
    return {};
}

// seq_length().
inline Refusal check_seq_length(uint32_t seq, uint32_t layer, const uint32_t* length, const CacheView& v) {
    const kvc_config& c = *v.cfg;
    if (seq >= c.max_seqs)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "seq_length: sequence %u out of range (max_seqs %u)", seq, c.max_seqs);
    if (layer >= c.n_layers)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "seq_length: layer %u out of range (n_layers %u)", layer, c.n_layers);
    if (length == nullptr) return refuse(KVC_ERR_INVALID_ARGUMENT, "seq_length: length is NULL");
    return {};
}

// memory(): a caller of ABI 1.0 passes the struct without workspace_bytes, and is served (that member is then not
// written: kvc_memory_has_workspace below).
inline Refusal check_memory_out(const kvc_memory* out) {
    if (out == nullptr) return refuse(KVC_ERR_INVALID_ARGUMENT, "memory: out is NULL");
    if (out->struct_size < offsetof(kvc_memory, workspace_bytes))
        return refuse(KVC_ERR_INVALID_ARGUMENT, "memory: struct_size %u is smaller than kvc_memory of ABI 1.0",
                      out->struct_size);
    return {};
}
inline bool kvc_memory_has_workspace(const kvc_memory* out) { return out->struct_size >= sizeof(kvc_memory); }

// fork(): both ids in range and different, the child empty in every layer, the parent started.
inline Refusal check_fork(uint32_t parent, uint32_t child, const CacheView& v) {
    const kvc_config& c = *v.cfg;
    if (parent >= c.max_seqs || child >= c.max_seqs)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "fork: sequence %u or %u out of range (max_seqs %u)", parent, child,
                      c.max_seqs);
    if (parent == child) return refuse(KVC_ERR_INVALID_ARGUMENT, "fork: parent and child are both %u", parent);
    for (uint32_t l = 0; l < c.n_layers; ++l)
        if (const uint64_t len = v.length(child, l); len != 0)
            return refuse(KVC_ERR_INVALID_ARGUMENT, "fork: child %u is not empty (layer %u holds %llu tokens)", child, l,
                          static_cast<unsigned long long>(len));
    if (!v.started(parent)) // the ABI forks started sequences only
        return refuse(KVC_ERR_INVALID_ARGUMENT, "fork: parent %u holds no tokens (never started or released)", parent);
    return {};
}

// release(): the id in range, the sequence started.
inline Refusal check_release(uint32_t seq, const CacheView& v) {
    const kvc_config& c = *v.cfg;
    if (seq >= c.max_seqs)
        return refuse(KVC_ERR_INVALID_ARGUMENT, "release: sequence %u out of range (max_seqs %u)", seq, c.max_seqs);
    if (!v.started(seq)) // the ABI releases started sequences only
        return refuse(KVC_ERR_INVALID_ARGUMENT, "release: sequence %u holds no tokens (never started or released)",
                      seq);
    return {};
}

} // namespace kvc::opt
