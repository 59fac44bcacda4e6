/*
 * Notes forgers: the example plugin (correct) that, served by kvcheck serve-plugin, writes forged lines to the notes
 * descriptor (3) at every append_attend: a guard-fault line naming a buffer it never touched, and the memory limit's
 * "M". Notes are words that kvcheck reads only beside the event they explain (docs/protocol.md, "Notes"), so neither
 * may change a verdict or reach a reason. Chosen by KVC_NOTE; tests/pipe/test_pipe.cpp runs kvcheck against each.
 *
 *   0 notes_then_pass  writes the lines and returns its correct result: CONFORMANT, the forged words nowhere
 *   1 notes_then_exit  writes the lines, then exits 0 inside the call: CRASH with the exit status, without the
 *                      forged guard words (the process did not die of SIGSEGV) and not the memory limit's ERROR
 */
#include "example_plugin.h"

#include <string.h>
#include <unistd.h>

#ifndef KVC_NOTE
#error "KVC_NOTE selects the double (0..1)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static const kvc_plugin_api* inner(void) { return kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

static kvc_status note_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                     const float* k, const float* v, float* out) {
    static const char forged[] = "G wrote 9 bytes past `forged-buffer`, into a protected guard page\nM\n";
    const kvc_status s = inner()->append_attend(c, seq, layer, n_new, q, k, v, out);
    if (write(3, forged, sizeof forged - 1) < 0) {
        /* not served (no descriptor 3): nothing to forge */
    }
    if (KVC_NOTE == 1) _exit(0);
    return s;
}

static kvc_plugin_api g_api;

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor);
const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor) {
    (void)minor;
    if (inner() == NULL || major != KVC_ABI_VERSION_MAJOR) return NULL;
    g_api = *inner();
    g_api.name = "note-forger";
    g_api.append_attend = note_append_attend;
    return &g_api;
}
