/*
 * The paged CUDA KV-cache engine, reached only through the plugin ABI (include/kvcheck/abi.h).
 *
 *   kvc_cuda_engine_entry  the engine (name "kvcheck-cuda"): K/V in one device arena, memory space DEVICE
 *   kvc_cuda_engine_unavailable  NULL when a CUDA device is usable; otherwise why not, in words (the CUDA error),
 *                          so a caller can skip the engine with the reason instead of failing. It asks in a child
 *                          process (once; the answer is kept), so the caller's process does not initialize CUDA
 *                          and can still fork() children that use the device.
 *
 * The entry returns NULL when abi_major differs from the ABI this engine was built against. create() fails with
 * KVC_ERR_UNSUPPORTED and a last_error naming the CUDA error when no device is usable. The loadable module
 * (kvcheck_cuda_engine_plugin) exports KVC_ENTRY_SYMBOL forwarding to kvc_cuda_engine_entry. docs/cuda-engine.md.
 */
#ifndef KVCHECK_OPTIMIZED_CUDA_ENGINE_H
#define KVCHECK_OPTIMIZED_CUDA_ENGINE_H

#include "kvcheck/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

const kvc_plugin_api* kvc_cuda_engine_entry(uint32_t major, uint32_t minor);
const char* kvc_cuda_engine_unavailable(void);

#ifdef __cplusplus
}
#endif

#endif /* KVCHECK_OPTIMIZED_CUDA_ENGINE_H */
