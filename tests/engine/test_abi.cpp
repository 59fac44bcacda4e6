// The engine through its ABI tables, as the harness and third parties reach it: versions, capabilities, errors
// through last_error, the RAII view, and the loadable module's one exported symbol.
#include "kvcheck/abi.hpp"
#include "kvcheck/optimized/cpu_engine.h"

#include "engine_test_util.hpp"

#include <dlfcn.h>

#include <cstddef>
#include <cstring>

namespace kvc::test {
namespace {

TEST(Abi, EntriesCheckTheMajorVersion) {
    for (kvc_entry_fn entry : {kvc_cpu_engine_entry, kvc_cpu_engine_sealed_entry}) {
        const kvc_plugin_api* api = entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
        ASSERT_NE(api, nullptr);
        EXPECT_EQ(api->struct_size, sizeof(kvc_plugin_api));
        EXPECT_EQ(api->abi_major, KVC_ABI_VERSION_MAJOR);
        EXPECT_TRUE(KVC_API_HAS(api, append_attend_batch) && KVC_API_HAS(api, fork) && KVC_API_HAS(api, release));
        EXPECT_EQ(entry(KVC_ABI_VERSION_MAJOR + 1, 0), nullptr);
        EXPECT_NE(entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR + 3), nullptr); // newer minor: still served
    }
    EXPECT_STRNE(kvc_cpu_engine_entry(1, 0)->name, kvc_cpu_engine_sealed_entry(1, 0)->name);
}

TEST(Abi, DeclaresWhatItDoes) {
    const kvc_caps caps = query_caps(kvc_cpu_engine_entry(1, 0));
    EXPECT_EQ(caps.dtypes, 0x7fu); // f32, f16, bf16 and the four quantized dtypes of ABI 1.2
    EXPECT_EQ(caps.quant, KVC_QUANT_FP8_SCALE_TENSOR | KVC_QUANT_FP8_SCALE_KV_HEAD | KVC_QUANT_INT8_SCALE_F16);
    EXPECT_EQ(caps.rope_variants, (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ));
    const uint32_t all = KVC_FEATURE_GQA | KVC_FEATURE_PAGED | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE |
                         KVC_FEATURE_BATCH | KVC_FEATURE_CHUNKED | KVC_FEATURE_WINDOW | KVC_FEATURE_SINKS |
                         KVC_FEATURE_EVICT | KVC_FEATURE_FORK_SHARES | KVC_FEATURE_HEAD_DIM_V |
                         KVC_FEATURE_ROPE_RANGE;
    EXPECT_EQ(caps.features, all);
    EXPECT_EQ(caps.max_window, 0u); // any window, any number of sinks
    EXPECT_EQ(caps.max_sinks, 0u);
    EXPECT_EQ(caps.precision, uint32_t(KVC_PRECISION_F32));
    EXPECT_EQ(caps.memory_space, uint32_t(KVC_MEMORY_HOST));
    EXPECT_EQ(caps.max_head_dim, 576u); // multi-head latent attention's K rows (test_latent.cpp)
    EXPECT_EQ(caps.max_head_dim_v, 576u);
    // a shorter struct from an older harness: nothing written past it
    struct {
        kvc_caps head;
        uint32_t guard;
    } shortened{};
    shortened.head.struct_size = offsetof(kvc_caps, features);
    shortened.head.features = 0xdead;
    shortened.guard = 0xbeef;
    kvc_cpu_engine_entry(1, 0)->get_caps(&shortened.head);
    EXPECT_EQ(shortened.head.dtypes, 0x7fu);
    EXPECT_EQ(shortened.head.features, 0xdeadu);
    EXPECT_EQ(shortened.guard, 0xbeefu);
}

TEST(Abi, FailuresSpeakThroughLastError) {
    const kvc_plugin_api* api = kvc_cpu_engine_entry(1, 0);
    kvc_config c = make_config(3, 2, 8, KVC_DTYPE_F16, 4);
    kvc_cache* cache = reinterpret_cast<kvc_cache*>(&c);
    EXPECT_EQ(api->create(&c, &cache), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(cache, nullptr);
    EXPECT_NE(std::string(api->last_error(nullptr)).find("multiple"), std::string::npos) << api->last_error(nullptr);
    EXPECT_EQ(api->create(nullptr, &cache), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api->append_attend(nullptr, 0, 0, 0, nullptr, nullptr, nullptr, nullptr), KVC_ERR_INVALID_ARGUMENT);
    c = make_config(4, 2, 8, KVC_DTYPE_F16, 4);
    Cache cc(api, c);
    EXPECT_THROW(cc.seq_length(0, 5), AbiError);
    try {
        cc.fork(0, 0);
        FAIL() << "fork onto itself was accepted";
    } catch (const AbiError& e) {
        EXPECT_EQ(e.status(), KVC_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("fork"), std::string::npos);
    }
}

TEST(Abi, RoundTripThroughTheTable) {
    const uint64_t seed = test_seed(800);
    for (kvc_entry_fn entry : {kvc_cpu_engine_entry, kvc_cpu_engine_sealed_entry}) {
        const kvc_config c = make_config(4, 2, 8, KVC_DTYPE_F16, 3, KVC_ROPE_NEOX);
        Cache cache(entry(1, 0), c);
        Rng rng(seed);
        History h(c);
        for (uint32_t n : {5u, 1u, 1u, 4u}) {
            const auto q = rng.normal(n * 32), k = rng.normal(n * 16), v = rng.normal(n * 16);
            std::vector<float> out(n * 32);
            cache.append_attend(2, 0, n, q.data(), k.data(), v.data(), out.data());
            h.add(k, v);
            expect_close(out, oracle(h, q), entry(1, 0)->name);
        }
        EXPECT_EQ(cache.seq_length(2, 0), 11u);
        const kvc_memory m = cache.memory();
        EXPECT_EQ(m.live_bytes, 2u * 11 * 2 * 8 * 2);
        EXPECT_EQ(m.capacity_bytes, 2u * 12 * 2 * 8 * 2);
        cache.release(2);
        EXPECT_EQ(cache.seq_length(2, 0), 0u);
    }
}

// A harness of ABI 1.0 passes kvc_memory without workspace_bytes (ABI 1.1): it is served, and nothing is written past
// its struct. (Until 2026-12-02 the CPU engine refused it while its message said the size was that of ABI 1.0.)
TEST(Abi, MemoryServesACallerOfAbi10) {
    for (kvc_entry_fn entry : {kvc_cpu_engine_entry, kvc_cpu_engine_sealed_entry}) {
        const kvc_plugin_api* api = entry(1, 0);
        const kvc_config c = make_config(4, 2, 8, KVC_DTYPE_F16, 4);
        kvc_cache* cache = nullptr;
        ASSERT_EQ(api->create(&c, &cache), KVC_OK) << api->last_error(nullptr);
        const std::vector<float> q(3 * 32, 0.25f), k(3 * 16, 1.0f), v(3 * 16, 2.0f);
        std::vector<float> out(3 * 32);
        ASSERT_EQ(api->append_attend(cache, 1, 0, 3, q.data(), k.data(), v.data(), out.data()), KVC_OK);
        kvc_memory m;
        std::memset(&m, 0xab, sizeof m);
        m.struct_size = offsetof(kvc_memory, workspace_bytes);
        const uint64_t untouched = m.workspace_bytes;
        EXPECT_EQ(api->memory(cache, &m), KVC_OK) << api->last_error(cache);
        EXPECT_EQ(m.live_bytes, 2u * 3 * 2 * 8 * 2);
        EXPECT_EQ(m.workspace_bytes, untouched) << "written past an ABI 1.0 struct";
        m.struct_size = sizeof m; // ABI 1.1: the CPU engine declares no workspace
        EXPECT_EQ(api->memory(cache, &m), KVC_OK) << api->last_error(cache);
        EXPECT_EQ(m.workspace_bytes, 0u);
        m.struct_size = offsetof(kvc_memory, workspace_bytes) - 1; // smaller than any ABI's
        EXPECT_EQ(api->memory(cache, &m), KVC_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(api->last_error(cache)).find("struct_size"), std::string::npos);
        api->destroy(cache);
    }
}

// The MODULE build (build/lib/libkvcheck_cpu_engine_plugin.so) loads with dlopen and exports the entry symbol,
// and nothing of the engine's internals.
TEST(Abi, LoadableModuleExportsTheEntrySymbol) {
    void* so = dlopen(KVCHECK_CPU_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(so, nullptr) << dlerror();
    auto entry = reinterpret_cast<kvc_entry_fn>(dlsym(so, KVC_ENTRY_SYMBOL));
    ASSERT_NE(entry, nullptr) << dlerror();
    const kvc_plugin_api* api = entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    ASSERT_NE(api, nullptr);
    EXPECT_STREQ(api->name, "kvcheck-cpu");
    EXPECT_EQ(entry(KVC_ABI_VERSION_MAJOR + 1, 0), nullptr);
    {
        Cache cache(api, make_config(2, 1, 4, KVC_DTYPE_BF16, 0));
        const std::vector<float> q(8, 0.5f), k(4, 1.0f), v(4, 2.0f);
        std::vector<float> out(8);
        cache.append_attend(0, 0, 1, q.data(), k.data(), v.data(), out.data());
        for (float x : out) EXPECT_EQ(x, 2.0f);
    }
    EXPECT_EQ(dlsym(so, "kvc_cpu_engine_entry"), nullptr) << "internal symbols leak from the module";
    dlclose(so);
    // The call above started the module's thread pool, which outlives the cache: the module must stay mapped after
    // dlclose (linked with -z nodelete), or those threads run unmapped code and crash the process.
    void* still = dlopen(KVCHECK_CPU_PLUGIN_PATH, RTLD_NOW | RTLD_NOLOAD);
    EXPECT_NE(still, nullptr) << "the plugin was unmapped by dlclose while its worker threads live";
    if (still) dlclose(still);
}

} // namespace
} // namespace kvc::test
