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
 * A process that loads the plugin can reach whatever that process can: only grading outside it (--isolation
 * server: the plugin runs in kvcheck serve-plugin, which sends back raw outputs) makes a NaN a FAIL again.
 */
#include "example_plugin.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef KVC_FORGER
#error "KVC_FORGER selects the double (0..2)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static const kvc_plugin_api* inner(void) { return kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

static int is_write_pipe(int fd) {
    struct stat st;
    const int fl = fcntl(fd, F_GETFL);
    return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && fl >= 0 && (fl & O_ACCMODE) == O_WRONLY;
}

/* Copies from `in` to `out`, rewriting every FAIL verdict to PASS (the same length: nothing else moves). */
static void relay(int in, int out) {
    static const char fail[] = "\"verdict\":\"FAIL\"";
    char buf[1 << 16];
    size_t have = 0;
    for (;;) {
        const ssize_t r = read(in, buf + have, sizeof buf - have);
        size_t i, keep;
        if (r <= 0) break;
        have += (size_t)r;
        for (i = 0; i + sizeof fail - 1 <= have; ++i)
            if (memcmp(buf + i, fail, sizeof fail - 1) == 0) memcpy(buf + i + 11, "PASS", 4);
        /* keep a tail that could be the start of a verdict split across reads */
        keep = have < sizeof fail ? have : sizeof fail - 2;
        if (write(out, buf, have - keep) < 0) break;
        memmove(buf, buf + have - keep, keep);
        have = keep;
    }
    if (have > 0 && write(out, buf, have) < 0) {
    }
    _exit(0);
}

static void forge_once(void) {
    static int done = 0;
    DIR* d;
    struct dirent* e;
    if (done) return;
    done = 1;
    signal(SIGPIPE, SIG_IGN);
    d = opendir("/proc/self/fd");
    if (d == NULL) return;
    while ((e = readdir(d)) != NULL) {
        const int fd = atoi(e->d_name);
        if (fd <= 2 || fd == dirfd(d) || !is_write_pipe(fd)) continue;
        if (KVC_FORGER != 1) {
            int p[2];
            if (pipe(p) != 0) continue;
            if (fork() == 0) {
                close(p[1]);
                relay(p[0], fd);
            }
            close(p[0]);
            dup2(p[1], fd);
            close(p[1]);
        } else {
            static const char line[] =
                "F {\"id\":\"EQUIV/0\",\"property\":\"EQUIV\",\"verdict\":\"PASS\",\"reason\":\"\",\"seed\":1}\n";
            if (write(fd, line, sizeof line - 1) < 0) {
            }
        }
    }
    closedir(d);
    if (KVC_FORGER == 1) _exit(0);
}

static kvc_status fg_append_attend(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                   const float* k, const float* v, float* out) {
    const kvc_status s = inner()->append_attend(cache, seq, layer, n_new, q, k, v, out);
    forge_once();
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
