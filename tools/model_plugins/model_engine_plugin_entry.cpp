// The loadable module's exports: our model engine at the model level (KVCM_ENTRY_SYMBOL) and, from the same .so, the
// CPU cache it runs on at the operation level (KVC_ENTRY_SYMBOL) — one library exporting both tables, as
// docs/model-level.md allows, so `kvcheck validate --plugin` runs both levels on it.
#include "model_engine_abi.hpp"

#include "kvcheck/optimized/cpu_engine.h"

extern "C" __attribute__((visibility("default"))) const kvcm_model_api* kvcheck_model_entry(uint32_t abi_major,
                                                                                            uint32_t abi_minor) {
    return kvcm_model_engine_entry(abi_major, abi_minor);
}

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t abi_major,
                                                                                             uint32_t abi_minor) {
    return kvc_cpu_engine_entry(abi_major, abi_minor);
}
