/*
 * The verdict forgers' one trick, shared by both levels (forger_cache.c, model_forger.c): at its first call, reach
 * every descriptor above 2 that is a pipe open for writing (the case process's result pipe among them, when the
 * plugin is loaded in the process that grades) and either
 *
 *   relay: put a pipe of its own in its place, read by a helper process that copies everything on with
 *          "verdict":"FAIL" rewritten to "verdict":"PASS"; or
 *   line:  write `line` (a hand-made result line claiming PASS) to it, then exit 0.
 */
#ifndef KVCHECK_TESTS_FORGE_RESULT_H
#define KVCHECK_TESTS_FORGE_RESULT_H

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int forge_is_write_pipe(int fd) {
    struct stat st;
    const int fl = fcntl(fd, F_GETFL);
    return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && fl >= 0 && (fl & O_ACCMODE) == O_WRONLY;
}

/* Copies from `in` to `out`, rewriting every FAIL verdict to PASS (the same length: nothing else moves). */
static void forge_relay(int in, int out) {
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

/* relay != 0: the relay; else the line (and exit 0). Once per process. */
static void forge_once(int relay, const char* line) {
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
        if (fd <= 2 || fd == dirfd(d) || !forge_is_write_pipe(fd)) continue;
        if (relay) {
            int p[2];
            if (pipe(p) != 0) continue;
            if (fork() == 0) {
                close(p[1]);
                forge_relay(p[0], fd);
            }
            close(p[0]);
            dup2(p[1], fd);
            close(p[1]);
        } else if (write(fd, line, strlen(line)) < 0) {
        }
    }
    closedir(d);
    if (!relay) _exit(0);
}

#endif
