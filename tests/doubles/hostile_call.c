/*
 * Hostile plugins, part 2: the example plugin (a correct cache) with one behaviour, during a call, aimed at what the
 * harness reads back (issue 13; docs/bad-input.md). Chosen by KVC_HOSTILE_CALL; tests/cli/test_hostile_plugins.cpp
 * runs kvcheck against each.
 *
 *   0 pipe_scribbler  every append_attend writes garbage to every descriptor above 2 that the process has open (it
 *                     lists /proc/self/fd), so the case process's result pipe to kvcheck carries bytes that are
 *                     not the protocol: a "P"/"F" line whose JSON does not parse, and no newline at the end, so that
 *                     the case process's own result line is garbled too. The verdict must be ERROR, with the reason.
 *   2 line_scribbler  the same with whole lines only (each ends in a newline), so the case process's own result
 *                     line still arrives intact after them. A result beside bytes that are not the protocol is not
 *                     trusted: the verdict must still be ERROR.
 *   1 huge_memory     memory() reports capacity_bytes and pool_bytes of 2^64 - 1 once anything is cached (honest
 *                     numbers plus 60,000 pool bytes while empty): the sum would wrap to -2 in 64-bit integers. NO-Q
 *                     and MEMORY must FAIL with a huge byte count, never a negative one.
 */
#include "example_plugin.h"

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KVC_HOSTILE_CALL
#error "KVC_HOSTILE_CALL selects the double (0..2)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static const kvc_plugin_api* inner(void) { return kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

static void scribble_on_every_descriptor(void) {
    /* "F " with JSON that does not parse (a number out of range, as the fuzzer found), then bytes without a newline
     * (pipe_scribbler), or whole lines only (line_scribbler) */
    static const char torn[] = "\x01\x02garbage\nF {\"verdict\": 1e400}\nP [\nnot the protocol \xff\xfe";
    static const char lines[] = "\x01\x02garbage\nF {\"verdict\": 1e400}\nP [\nnot the protocol \xff\xfe\n";
    const char* garbage = KVC_HOSTILE_CALL == 2 ? lines : torn;
    const size_t size = KVC_HOSTILE_CALL == 2 ? sizeof lines - 1 : sizeof torn - 1;
    DIR* d;
    struct dirent* e;
    /* Writing into a pipe nobody reads would end the process with SIGPIPE, a CRASH (its own row): this double is
     * about bytes that reach the harness, so such writes just fail. */
    signal(SIGPIPE, SIG_IGN);
    d = opendir("/proc/self/fd");
    if (d == NULL) return;
    while ((e = readdir(d)) != NULL) {
        const int fd = atoi(e->d_name);
        if (fd > 2 && fd != dirfd(d))
            if (write(fd, garbage, size) < 0) continue; /* read ends, closed ones: nothing to do */
    }
    closedir(d);
}

static kvc_status hc_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                   const float* k, const float* v, float* out) {
    if (KVC_HOSTILE_CALL != 1) scribble_on_every_descriptor();
    return inner()->append_attend(c, seq, layer, n_new, q, k, v, out);
}

static kvc_status hc_memory(kvc_cache* c, kvc_memory* out) {
    kvc_status s = inner()->memory(c, out);
    if (s != KVC_OK || KVC_HOSTILE_CALL != 1) return s;
    if (out->live_bytes == 0) {
        out->pool_bytes += 60000; /* within MEMORY's bound; makes the first reported K/V larger than NO-Q's slack */
    } else {
        out->capacity_bytes = UINT64_MAX;
        out->pool_bytes = UINT64_MAX;
    }
    return s;
}

static kvc_plugin_api g_api;

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor);
const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor) {
    (void)minor;
    if (inner() == NULL || major != KVC_ABI_VERSION_MAJOR) return NULL;
    g_api = *inner();
    g_api.name = KVC_HOSTILE_CALL == 0 ? "pipe_scribbler" : KVC_HOSTILE_CALL == 1 ? "huge_memory" : "line_scribbler";
    g_api.append_attend = hc_append_attend;
    g_api.memory = hc_memory;
    return &g_api;
}
