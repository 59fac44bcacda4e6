/*
 * The paged CPU KV-cache engine, reached only through the plugin ABI (include/kvcheck/abi.h).
 *
 *   kvc_cpu_engine_entry         the engine as shipped
 *   kvc_cpu_engine_sealed_entry  the same engine in test mode: every full block is sealed read-only with mprotect
 *                                (a stray write into the past faults) and every unused slot holds NaN (a kernel
 *                                that reads past a sequence's end produces NaN)
 *
 * Both return NULL when abi_major differs from the ABI this engine was built against. The loadable module
 * (kvcheck_cpu_engine_plugin) exports KVC_ENTRY_SYMBOL forwarding to kvc_cpu_engine_entry.
 */
#ifndef KVCHECK_OPTIMIZED_CPU_ENGINE_H
#define KVCHECK_OPTIMIZED_CPU_ENGINE_H

#include "kvcheck/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

const kvc_plugin_api* kvc_cpu_engine_entry(uint32_t abi_major, uint32_t abi_minor);
const kvc_plugin_api* kvc_cpu_engine_sealed_entry(uint32_t abi_major, uint32_t abi_minor);

#ifdef __cplusplus
}
#endif

#endif /* KVCHECK_OPTIMIZED_CPU_ENGINE_H */
