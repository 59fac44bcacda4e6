/*
 * Verdict forgers at the model level: the C model example (tools/model_example) with a wrong output (the first logit
 * of every forward is NaN), plus forge_result.h's attempt to make kvcheck read a PASS anyway, at the first forward.
 * Chosen by KVC_MODEL_FORGER; tests/pipe/test_pipe.cpp (ModelServerIsolation) runs kvcheck against each.
 *
 *   0 model_relay_forger   the relay: every FAIL verdict on the pipes it can write to becomes PASS
 *   1 model_line_forger    a hand-made MODEL-LOGITS PASS line on each of them, then exit 0
 *   2 both_line_forger     the line forger's model table, and the correct example cache as the operation-level table
 *                          (a library that exports both tables)
 *   3 both_abi12_forger    the same with an operation-level table of ABI 1.2, one minor before this header's: an
 *                          older table beside a model table must not take a library out of the server
 *
 * Loaded in the process that grades (--isolation fork), each ends CONFORMANT; served (the default), its NaN logits are
 * judged in a process it cannot reach, or its garbage breaks the connection.
 */
#define KVX_ENTRY kvcm_double_model_forger_inner_entry
#define KVX_NAME "double-model-forger"
#include "model_example.c"

#include "forge_result.h"

#ifndef KVC_MODEL_FORGER
#error "KVC_MODEL_FORGER selects the double (0..3)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static kvcm_model_api forger_api;
static const kvcm_model_api* inner_api;

static kvc_status forger_forward(kvcm_model* m, uint32_t seq, uint32_t n, const int32_t* tokens, float* logits) {
    const kvc_status s = inner_api->forward(m, seq, n, tokens, logits);
    forge_once(KVC_MODEL_FORGER == 0, "F {\"id\":\"MODEL-LOGITS/0\",\"property\":\"MODEL-LOGITS\",\"verdict\":\"PASS\","
                                      "\"reason\":\"\",\"seed\":1}\n");
    if (s == KVC_OK && n > 0) {
        const unsigned int nan_bits = 0x7fc00000u;
        memcpy(logits, &nan_bits, sizeof nan_bits);
    }
    return s;
}

KVC_PLUGIN_EXPORT const kvcm_model_api* kvcheck_model_entry(uint32_t abi_major, uint32_t abi_minor);
KVC_PLUGIN_EXPORT const kvcm_model_api* kvcheck_model_entry(uint32_t abi_major, uint32_t abi_minor) {
    inner_api = KVX_ENTRY(abi_major, abi_minor);
    if (inner_api == NULL) return NULL;
    forger_api = *inner_api;
    forger_api.name = KVC_MODEL_FORGER == 0 ? "model_relay_forger" : "model_line_forger";
    forger_api.forward = forger_forward;
    return &forger_api;
}

#if KVC_MODEL_FORGER >= 2
#include "example_plugin.h"

static kvc_plugin_api operation_api;

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t abi_major, uint32_t abi_minor);
KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t abi_major, uint32_t abi_minor) {
    const kvc_plugin_api* base = kvc_example_entry(abi_major, abi_minor);
    if (base == NULL) return NULL;
    operation_api = *base;
    if (KVC_MODEL_FORGER == 3) operation_api.abi_minor = 2;
    return &operation_api;
}
#endif
