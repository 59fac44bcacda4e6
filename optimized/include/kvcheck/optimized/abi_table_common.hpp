// The plugin ABI function table over an engine class, written once for both engines (optimized/src/abi_table.cpp,
// optimized/cuda/abi_table.cpp). An engine supplies an Ops struct:
//
//   using Engine = ...;                                   the engine class
//   static constexpr uint32_t kMemorySpace, kMaxHeadDim;  what its caps say beyond the common ones
//   static constexpr bool kQuantized;                     it stores the quantized dtypes (ABI 1.2) and has
//                                                         Engine::read_kv_scales; false: the table's slot is NULL
//   static constexpr bool kWindows;                       OPTIONAL, false when absent: it implements sliding
//                                                         windows, sinks and eviction (ABI 1.2; caps declare them)
//   static constexpr bool kLatent;                        OPTIONAL, false when absent: it implements head_dim_v !=
//                                                         head_dim (up to kMaxHeadDim) and RoPE on a range of the
//                                                         head dims (ABI 1.2; caps declare them)
//   static constexpr bool kForkShares;                    OPTIONAL, false when absent: fork shares every full block
//                                                         (reference counted, counted once) and copies at most the
//                                                         partly filled last one (caps declare
//                                                         KVC_FEATURE_FORK_SHARES)
//   static constexpr const char* kCreateFailed;           last_error(NULL) after create threw
//   template <class F> static kvc_status guard(Engine&, F&& call);   runs one operation (catches what it may throw)
//   static kvc_status append_attend(Engine&, seq, layer, n_new, q, k, v, out);
//   static kvc_status append_attend_batch(Engine&, layer, const kvc_batch*);
//
// Instantiate it with an Ops in an unnamed namespace: everything it makes is then private to that engine, so the
// two engines linked into one program share no symbol (and no create-error buffer).
#pragma once

#include "kvcheck/abi.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

// The opaque handle of the ABI. Each engine's handle derives from it (AbiTable<Ops>::Handle) and keeps its engine
// there: the one definition both engines see.
struct kvc_cache {};

namespace kvc::opt {

// Ops::kWindows, or false where an engine's Ops does not say.
template <class Ops, class = void>
struct OpsWindows : std::false_type {};
template <class Ops>
struct OpsWindows<Ops, std::void_t<decltype(Ops::kWindows)>> : std::bool_constant<Ops::kWindows> {};
// Ops::kLatent, or false where an engine's Ops does not say.
template <class Ops, class = void>
struct OpsLatent : std::false_type {};
template <class Ops>
struct OpsLatent<Ops, std::void_t<decltype(Ops::kLatent)>> : std::bool_constant<Ops::kLatent> {};
// Ops::kForkShares, or false where an engine's Ops does not say.
template <class Ops, class = void>
struct OpsForkShares : std::false_type {};
template <class Ops>
struct OpsForkShares<Ops, std::void_t<decltype(Ops::kForkShares)>> : std::bool_constant<Ops::kForkShares> {};

template <class Ops>
class AbiTable {
public:
    using Engine = typename Ops::Engine;
    using CreateFn = kvc_status (*)(const kvc_config*, kvc_cache**);

    // The table named `name` whose create is `create` (built from create_with).
    static kvc_plugin_api make(const char* name, CreateFn create) {
        kvc_plugin_api t{};
        t.struct_size = sizeof t;
        t.abi_major = KVC_ABI_VERSION_MAJOR;
        t.abi_minor = KVC_ABI_VERSION_MINOR;
        t.name = name;
        t.version = "0.1.0";
        t.get_caps = get_caps;
        t.create = create;
        t.destroy = destroy;
        t.last_error = last_error;
        t.append_attend = append_attend;
        t.append_attend_batch = append_attend_batch;
        t.read_kv = read_kv;
        t.seq_length = seq_length;
        t.memory = memory;
        t.fork = fork;
        t.release = release;
        if constexpr (Ops::kQuantized) t.read_kv_scales = read_kv_scales;
        return t;
    }

    // The table for an ABI version: a newer minor only appends members, which this table simply does not have.
    static const kvc_plugin_api* entry(const kvc_plugin_api& table, uint32_t abi_major) {
        return abi_major == KVC_ABI_VERSION_MAJOR ? &table : nullptr;
    }

    // create's body: make(config, &status, &error) returns the engine, or nullptr with the reason.
    template <class Make>
    static kvc_status create_with(const kvc_config* config, kvc_cache** out, Make make) {
        if (out == nullptr) {
            set_create_error("create: out is NULL");
            return KVC_ERR_INVALID_ARGUMENT;
        }
        *out = nullptr;
        if (config == nullptr) {
            set_create_error("create: config is NULL");
            return KVC_ERR_INVALID_ARGUMENT;
        }
        try {
            kvc_status status = KVC_OK;
            std::string error;
            std::unique_ptr<Engine> engine = make(*config, &status, &error);
            if (!engine) {
                set_create_error(("create: " + error).c_str());
                return status;
            }
            *out = new Handle{{}, std::move(engine)};
            return KVC_OK;
        } catch (...) {
            set_create_error(Ops::kCreateFailed);
            return KVC_ERR_OUT_OF_MEMORY;
        }
    }

private:
    struct Handle : kvc_cache {
        std::unique_ptr<Engine> engine;
    };

    // last_error(NULL): the last failed create on this thread (distinct threads may create caches concurrently).
    static inline thread_local char create_error_[512] = "no error";

    static void set_create_error(const char* msg) { std::snprintf(create_error_, sizeof create_error_, "%s", msg); }

    static Engine& engine_of(kvc_cache* cache) { return *static_cast<Handle*>(cache)->engine; }

    // A NULL cache is the caller's bug; it is reported like any other bad argument, through last_error(NULL).
    template <class F>
    static kvc_status call(kvc_cache* cache, F&& body) {
        if (cache == nullptr) {
            set_create_error("cache is NULL");
            return KVC_ERR_INVALID_ARGUMENT;
        }
        return Ops::guard(engine_of(cache), body);
    }

    static void get_caps(kvc_caps* out) {
        if (out == nullptr) return;
        kvc_caps c{};
        c.struct_size = out->struct_size;
        c.dtypes = (1u << KVC_DTYPE_F32) | (1u << KVC_DTYPE_F16) | (1u << KVC_DTYPE_BF16);
        if constexpr (Ops::kQuantized) { // every fp8 scale form, int8 scales in f32 or f16 (q stays f32)
            c.dtypes |= (1u << KVC_DTYPE_FP8_E4M3) | (1u << KVC_DTYPE_FP8_E5M2) | (1u << KVC_DTYPE_INT8_TOKEN) |
                        (1u << KVC_DTYPE_Q8_0);
            c.quant = KVC_QUANT_FP8_SCALE_TENSOR | KVC_QUANT_FP8_SCALE_KV_HEAD | KVC_QUANT_INT8_SCALE_F16;
        }
        c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
        c.features = KVC_FEATURE_GQA | KVC_FEATURE_PAGED | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE |
                     KVC_FEATURE_BATCH | KVC_FEATURE_CHUNKED;
        if constexpr (OpsWindows<Ops>::value) { // any window, any number of sinks: max_window, max_sinks 0
            c.features |= KVC_FEATURE_WINDOW | KVC_FEATURE_SINKS | KVC_FEATURE_EVICT;
            c.max_window = 0;
            c.max_sinks = 0;
        }
        if constexpr (OpsForkShares<Ops>::value) c.features |= KVC_FEATURE_FORK_SHARES;
        if constexpr (OpsLatent<Ops>::value) { // head_dim_v up to max_head_dim, any RoPE range inside the head
            c.features |= KVC_FEATURE_HEAD_DIM_V | KVC_FEATURE_ROPE_RANGE;
            c.max_head_dim_v = Ops::kMaxHeadDim;
        }
        // Both engines: q f32 (rotated in double, rounded once), K/V widened from the cache dtype, scores, exp, sums
        // and the V accumulation in f32, split states merged in f32.
        c.precision = KVC_PRECISION_F32;
        c.memory_space = Ops::kMemorySpace;
        c.max_layers = 1024;
        c.max_q_heads = 1024;
        c.max_kv_heads = 1024;
        c.max_head_dim = Ops::kMaxHeadDim;
        c.max_seqs = 0;   // any sequence id the config allows
        c.max_tokens = 0; // any length the config allows (lengths are 32-bit)
        // Fill only what the caller's struct holds (an older harness passes a shorter one).
        const size_t n = out->struct_size < sizeof c ? out->struct_size : sizeof c;
        if (n > sizeof c.struct_size)
            std::memcpy(reinterpret_cast<char*>(out) + sizeof c.struct_size,
                        reinterpret_cast<const char*>(&c) + sizeof c.struct_size, n - sizeof c.struct_size);
    }

    static void destroy(kvc_cache* cache) { delete static_cast<Handle*>(cache); }

    static const char* last_error(const kvc_cache* cache) {
        return cache ? static_cast<const Handle*>(cache)->engine->last_error() : create_error_;
    }

    static kvc_status append_attend(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                    const float* k, const float* v, float* out) {
        return call(cache, [&](Engine& e) { return Ops::append_attend(e, seq, layer, n_new, q, k, v, out); });
    }
    static kvc_status append_attend_batch(kvc_cache* cache, uint32_t layer, const kvc_batch* batch) {
        return call(cache, [&](Engine& e) { return Ops::append_attend_batch(e, layer, batch); });
    }
    static kvc_status read_kv(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                              void* v_out) {
        return call(cache, [&](Engine& e) { return e.read_kv(seq, layer, pos, n, k_out, v_out); });
    }
    static kvc_status read_kv_scales(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n,
                                     void* k_out, void* v_out) {
        return call(cache, [&](Engine& e) { return e.read_kv_scales(seq, layer, pos, n, k_out, v_out); });
    }
    static kvc_status seq_length(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t* length) {
        return call(cache, [&](Engine& e) { return e.seq_length(seq, layer, length); });
    }
    static kvc_status memory(kvc_cache* cache, kvc_memory* out) {
        return call(cache, [&](Engine& e) { return e.memory(out); });
    }
    static kvc_status fork(kvc_cache* cache, uint32_t parent, uint32_t child) {
        return call(cache, [&](Engine& e) { return e.fork(parent, child); });
    }
    static kvc_status release(kvc_cache* cache, uint32_t seq) {
        return call(cache, [&](Engine& e) { return e.release(seq); });
    }
};

} // namespace kvc::opt
