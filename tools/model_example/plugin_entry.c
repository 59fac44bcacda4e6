/* The .so form of the example model: exports the one symbol the harness looks up (KVCM_ENTRY_SYMBOL). */
#include "kvcheck/model_abi.h"

const kvcm_model_api* kvcm_model_example_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);

__attribute__((visibility("default"))) const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major,
                                                                                 uint32_t harness_abi_minor) {
    return kvcm_model_example_entry(harness_abi_major, harness_abi_minor);
}
