/* A broken double as a loadable plugin for the CLI tests (tests/cli/test_model_cli.cpp): exports the one symbol the
   harness looks up and forwards it to the double's own entry (KVX_DOUBLE_ENTRY, set per target by CMake). */
#include "kvcheck/model_abi.h"

const kvcm_model_api* KVX_DOUBLE_ENTRY(uint32_t harness_abi_major, uint32_t harness_abi_minor);

const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);
const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
    return KVX_DOUBLE_ENTRY(harness_abi_major, harness_abi_minor);
}
