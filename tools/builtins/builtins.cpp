#include "kvcheck/builtins.hpp"

extern "C" const kvc_plugin_api* kvc_example_entry(uint32_t major, uint32_t minor);
extern "C" const kvc_plugin_api* kvc_cpu_engine_entry(uint32_t major, uint32_t minor);
extern "C" const kvc_plugin_api* kvc_cpu_engine_sealed_entry(uint32_t major, uint32_t minor);

namespace kvc {

const std::vector<Builtin>& builtins() {
    static const std::vector<Builtin> list = {
        {"example", "tools/example_plugin: textbook contiguous cache in C, loop attention", kvc_example_entry},
        {"cpu", "optimized/: paged CPU engine, f32/f16/bf16, GQA, RoPE, fork, batching", kvc_cpu_engine_entry},
        {"cpu-sealed", "the CPU engine in test mode: full blocks mprotect-sealed, unused slots NaN-poisoned",
         kvc_cpu_engine_sealed_entry},
    };
    return list;
}

const Builtin* find_builtin(const std::string& name) {
    for (const Builtin& b : builtins())
        if (b.name == name) return &b;
    return nullptr;
}

} // namespace kvc
