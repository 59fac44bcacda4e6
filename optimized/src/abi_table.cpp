// The engine behind the plugin ABI: two function tables (shipped and test mode) over kvc::opt::Engine.
#include "kvcheck/optimized/abi_table_common.hpp"
#include "kvcheck/optimized/cpu_engine.h"
#include "kvcheck/optimized/engine.hpp"

#include "attention_kernel.hpp"

namespace {

using kvc::opt::Engine;
using kvc::opt::EngineOptions;

struct CpuOps {
    using Engine = kvc::opt::Engine;
    static constexpr uint32_t kMemorySpace = KVC_MEMORY_HOST;
    static constexpr uint32_t kMaxHeadDim = kvc::opt::kMaxHeadDim;
    static constexpr bool kQuantized = true;
    static constexpr bool kWindows = true; // sliding windows per layer, sinks and eviction
    static constexpr bool kLatent = true; // head_dim_v != head_dim (up to max_head_dim) and RoPE on a range of dims
    static constexpr bool kForkShares = true; // fork retains every block, the partial last one too (copy on write)
    static constexpr const char* kCreateFailed = "create: allocation failed";

    // The engine's methods never throw (engine.hpp): a call goes straight through.
    template <class F>
    static kvc_status guard(Engine& e, F&& call) {
        return call(e);
    }
    static kvc_status append_attend(Engine& e, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                    const float* k, const float* v, float* out) {
        return e.append_attend(seq, layer, n_new, q, k, v, out);
    }
    static kvc_status append_attend_batch(Engine& e, uint32_t layer, const kvc_batch* batch) {
        return e.append_attend_batch(layer, batch);
    }
};
using Table = kvc::opt::AbiTable<CpuOps>;

kvc_status create_with(const kvc_config* config, kvc_cache** out, const EngineOptions& opt) {
    return Table::create_with(config, out, [&](const kvc_config& c, kvc_status* status, std::string* error) {
        return Engine::create(c, opt, status, error);
    });
}

kvc_status create_shipped(const kvc_config* config, kvc_cache** out) { return create_with(config, out, EngineOptions{}); }

kvc_status create_sealed(const kvc_config* config, kvc_cache** out) {
    EngineOptions opt;
    opt.seal_full_blocks = true;
    opt.poison_unused = true;
    return create_with(config, out, opt);
}

} // namespace

// Tables are built on first use (function-local statics), so a caller's own static initializer may ask for them.
extern "C" const kvc_plugin_api* kvc_cpu_engine_entry(uint32_t abi_major, uint32_t /*abi_minor*/) {
    static const kvc_plugin_api table = Table::make("kvcheck-cpu", create_shipped);
    return Table::entry(table, abi_major);
}

extern "C" const kvc_plugin_api* kvc_cpu_engine_sealed_entry(uint32_t abi_major, uint32_t /*abi_minor*/) {
    static const kvc_plugin_api table = Table::make("kvcheck-cpu-sealed", create_sealed);
    return Table::entry(table, abi_major);
}
