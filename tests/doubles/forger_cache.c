/*
 * Verdict forgers: the example plugin with a wrong output (the first element of every
 * append_attend's `out` is NaN), plus an attempt to make kvcheck read a PASS anyway. Chosen by KVC_FORGER;
 * tests/pipe/test_pipe.cpp (ServerIsolation) runs kvcheck against each.
 *
 *   0 relay_forger    at its first call it finds every descriptor above 2 that is a pipe open for writing (the case
 *                     process's result pipe among them) and puts a pipe of its own in its place, read by a helper
 *                     process that copies everything on with "verdict":"FAIL" rewritten to "verdict":"PASS".
 *   1 line_forger     at its first call it writes one hand-made result line claiming PASS (and, for a batch, one per
 *                     case id it guesses) to every such descriptor, then exits 0.
 *   2 device_forger   the relay forger declaring memory_space DEVICE: a declaration anyone can make, so it must not
 *                     take a plugin out of server isolation.
 *
 * The trick itself is forge_result.h's (model_forger.c plays it at the model level). A process that loads the plugin
 * can reach whatever that process can: only grading outside it (--isolation server: the plugin runs in kvcheck
 * serve-plugin, which sends back raw outputs) makes a NaN a FAIL again.
 */
#include "example_plugin.h"
#include "forge_result.h"

#ifndef KVC_FORGER
#error "KVC_FORGER selects the double (0..2)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static const kvc_plugin_api* inner(void) { return kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

static kvc_status fg_append_attend(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                   const float* k, const float* v, float* out) {
    const kvc_status s = inner()->append_attend(cache, seq, layer, n_new, q, k, v, out);
    forge_once(KVC_FORGER != 1,
               "F {\"id\":\"EQUIV/0\",\"property\":\"EQUIV\",\"verdict\":\"PASS\",\"reason\":\"\",\"seed\":1}\n");
    if (s == KVC_OK && n_new > 0) {
        const unsigned int nan_bits = 0x7fc00000u;
        memcpy(out, &nan_bits, sizeof nan_bits);
    }
    return s;
}

static void fg_get_caps(kvc_caps* out) {
    inner()->get_caps(out);
    if (KVC_FORGER == 2) out->memory_space = KVC_MEMORY_DEVICE;
}

static kvc_plugin_api g_api;

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t abi_major, uint32_t abi_minor) {
    const kvc_plugin_api* base = kvc_example_entry(abi_major, abi_minor);
    if (base == NULL) return NULL;
    g_api = *base;
    g_api.name = KVC_FORGER == 0 ? "relay_forger" : KVC_FORGER == 1 ? "line_forger" : "device_forger";
    g_api.get_caps = fg_get_caps;
    g_api.append_attend = fg_append_attend;
    return &g_api;
}
