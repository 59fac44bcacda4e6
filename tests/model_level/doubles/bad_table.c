/* Model tables that must stop a run before any case: KVX_BAD_MAJOR declares model ABI 2.0 (malformed for this
   harness: exit 2, a clear message); otherwise get_caps crashes while the plugin is being probed (it misbehaved
   while loading: exit 4). Built only as plugins (tests/cli/test_model_cli.cpp). */
#define KVX_ENTRY kvcm_double_inner_entry
#define KVX_NAME "double-bad-table"
#include "model_example.c"

#include <signal.h>

static kvcm_model_api bad_api;

#ifndef KVX_BAD_MAJOR
static void crashing_get_caps(kvcm_caps* out) {
    (void)out;
    raise(SIGSEGV);
}
#endif

const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);
const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
    const kvcm_model_api* inner = kvcm_double_inner_entry(harness_abi_major, harness_abi_minor);
    if (inner == NULL) return NULL;
    bad_api = *inner;
#ifdef KVX_BAD_MAJOR
    bad_api.abi_major = KVCM_ABI_VERSION_MAJOR + 1;
    bad_api.abi_minor = 0; /* "2.0": a new major starts its minors again */
#else
    bad_api.get_caps = crashing_get_caps;
#endif
    return &bad_api;
}
