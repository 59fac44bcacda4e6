// The loadable module's one export (KVC_ENTRY_SYMBOL): the shipped CPU engine, as a third party would load it.
#include "kvcheck/optimized/cpu_engine.h"

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t abi_major,
                                                                                             uint32_t abi_minor) {
    return kvc_cpu_engine_entry(abi_major, abi_minor);
}
