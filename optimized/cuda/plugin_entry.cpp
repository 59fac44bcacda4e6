// The loadable module's one export (KVC_ENTRY_SYMBOL): the CUDA engine, as a third party would load it.
#include "kvcheck/optimized/cuda_engine.h"

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t abi_major,
                                                                                             uint32_t abi_minor) {
    return kvc_cuda_engine_entry(abi_major, abi_minor);
}
