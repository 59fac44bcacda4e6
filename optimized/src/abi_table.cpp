// The engine behind the plugin ABI: two function tables (shipped and test mode) over kvc::opt::Engine.
#include "kvcheck/optimized/cpu_engine.h"
#include "kvcheck/optimized/engine.hpp"

#include "attention_kernel.hpp"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

struct kvc_cache {
    std::unique_ptr<kvc::opt::Engine> engine;
};

namespace {

using kvc::opt::Engine;
using kvc::opt::EngineOptions;

// last_error(NULL): the last failed create on this thread (distinct threads may create caches concurrently).
thread_local char g_create_error[512] = "no error";

void set_create_error(const char* msg) { std::snprintf(g_create_error, sizeof g_create_error, "%s", msg); }

void get_caps(kvc_caps* out) {
    if (out == nullptr) return;
    kvc_caps c{};
    c.struct_size = out->struct_size;
    c.dtypes = (1u << KVC_DTYPE_F32) | (1u << KVC_DTYPE_F16) | (1u << KVC_DTYPE_BF16);
    c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.features = KVC_FEATURE_GQA | KVC_FEATURE_PAGED | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_BATCH |
                 KVC_FEATURE_CHUNKED;
    c.precision = KVC_PRECISION_F32;
    c.memory_space = KVC_MEMORY_HOST;
    c.max_layers = 1024;
    c.max_q_heads = 1024;
    c.max_kv_heads = 1024;
    c.max_head_dim = kvc::opt::kMaxHeadDim;
    c.max_seqs = 0;   // any sequence id the config allows
    c.max_tokens = 0; // any length the config allows (lengths are 32-bit)
    // Fill only what the caller's struct holds (an older harness passes a shorter one).
    const size_t n = out->struct_size < sizeof c ? out->struct_size : sizeof c;
    if (n > sizeof c.struct_size)
        std::memcpy(reinterpret_cast<char*>(out) + sizeof c.struct_size, reinterpret_cast<const char*>(&c) + sizeof c.struct_size,
                    n - sizeof c.struct_size);
}

kvc_status create_with(const kvc_config* config, kvc_cache** out, const EngineOptions& opt) {
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
        auto engine = Engine::create(*config, opt, &status, &error);
        if (!engine) {
            set_create_error(("create: " + error).c_str());
            return status;
        }
        *out = new kvc_cache{std::move(engine)};
        return KVC_OK;
    } catch (...) {
        set_create_error("create: allocation failed");
        return KVC_ERR_OUT_OF_MEMORY;
    }
}

kvc_status create_shipped(const kvc_config* config, kvc_cache** out) { return create_with(config, out, EngineOptions{}); }

kvc_status create_sealed(const kvc_config* config, kvc_cache** out) {
    EngineOptions opt;
    opt.seal_full_blocks = true;
    opt.poison_unused = true;
    return create_with(config, out, opt);
}

void destroy(kvc_cache* cache) { delete cache; }

const char* last_error(const kvc_cache* cache) { return cache ? cache->engine->last_error() : g_create_error; }

// A NULL cache is the caller's bug; it is reported like any other bad argument, through last_error(NULL).
#define KVC_CHECK_CACHE(cache)                                                                                        \
    do {                                                                                                               \
        if ((cache) == nullptr) {                                                                                      \
            set_create_error("cache is NULL");                                                                         \
            return KVC_ERR_INVALID_ARGUMENT;                                                                           \
        }                                                                                                              \
    } while (0)

kvc_status append_attend(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                         const float* k, const float* v, float* out) {
    KVC_CHECK_CACHE(cache);
    return cache->engine->append_attend(seq, layer, n_new, q, k, v, out);
}

kvc_status append_attend_batch(kvc_cache* cache, uint32_t layer, const kvc_batch* batch) {
    KVC_CHECK_CACHE(cache);
    return cache->engine->append_attend_batch(layer, batch);
}

kvc_status read_kv(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                   void* v_out) {
    KVC_CHECK_CACHE(cache);
    return cache->engine->read_kv(seq, layer, pos, n, k_out, v_out);
}

kvc_status seq_length(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t* length) {
    KVC_CHECK_CACHE(cache);
    return cache->engine->seq_length(seq, layer, length);
}

kvc_status memory(kvc_cache* cache, kvc_memory* out) {
    KVC_CHECK_CACHE(cache);
    return cache->engine->memory(out);
}

kvc_status fork(kvc_cache* cache, uint32_t parent, uint32_t child) {
    KVC_CHECK_CACHE(cache);
    return cache->engine->fork(parent, child);
}

kvc_status release(kvc_cache* cache, uint32_t seq) {
    KVC_CHECK_CACHE(cache);
    return cache->engine->release(seq);
}

kvc_plugin_api make_table(const char* name, kvc_status (*create)(const kvc_config*, kvc_cache**)) {
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
    return t;
}

} // namespace

// Tables are built on first use (function-local statics), so a caller's own static initializer may ask for them.
extern "C" const kvc_plugin_api* kvc_cpu_engine_entry(uint32_t abi_major, uint32_t abi_minor) {
    (void)abi_minor; // a newer minor only appends members, which our table simply does not have
    static const kvc_plugin_api table = make_table("kvcheck-cpu", create_shipped);
    return abi_major == KVC_ABI_VERSION_MAJOR ? &table : nullptr;
}

extern "C" const kvc_plugin_api* kvc_cpu_engine_sealed_entry(uint32_t abi_major, uint32_t abi_minor) {
    (void)abi_minor;
    static const kvc_plugin_api table = make_table("kvcheck-cpu-sealed", create_sealed);
    return abi_major == KVC_ABI_VERSION_MAJOR ? &table : nullptr;
}
