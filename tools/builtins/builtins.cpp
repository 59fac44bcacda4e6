#include "kvcheck/builtins.hpp"

extern "C" const kvc_plugin_api* kvc_example_entry(uint32_t major, uint32_t minor);
extern "C" const kvc_plugin_api* kvc_cpu_engine_entry(uint32_t major, uint32_t minor);
extern "C" const kvc_plugin_api* kvc_cpu_engine_sealed_entry(uint32_t major, uint32_t minor);
#ifdef KVCHECK_HAVE_CUDA_ENGINE
extern "C" const kvc_plugin_api* kvc_cuda_engine_entry(uint32_t major, uint32_t minor);
extern "C" const char* kvc_cuda_engine_unavailable(void);
#endif

namespace kvc {

const std::vector<Builtin>& compiled_builtins() {
    static const std::vector<Builtin> list = {
        {"example", "tools/example_plugin: textbook contiguous cache in C, loop attention", kvc_example_entry},
        {"cpu", "optimized/: paged CPU engine, f32/f16/bf16, fp8/int8/q8_0, GQA, RoPE, fork, batching, windows and eviction", kvc_cpu_engine_entry},
        {"cpu-sealed", "the CPU engine in test mode: full blocks mprotect-sealed, unused slots NaN-poisoned",
         kvc_cpu_engine_sealed_entry},
#ifdef KVCHECK_HAVE_CUDA_ENGINE
        // listed whenever compiled; skipped with the CUDA error where no device is usable
        {"cuda", "optimized/cuda: paged CUDA engine, device memory, f32/f16/bf16, fp8/int8/q8_0, GQA, RoPE, fork, "
                 "batching, windows and eviction",
         kvc_cuda_engine_entry, kvc_cuda_engine_unavailable},
#endif
    };
    return list;
}

} // namespace kvc
