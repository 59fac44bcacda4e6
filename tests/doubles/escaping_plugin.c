/*
 * A hostile plugin whose forks leave the case's process group: the example plugin (a correct cache) whose every
 * create() forks a process that calls setsid() (a session and process group of its own, out of reach of a kill of
 * the case's group), forks a child of its own in that session, and both sleep for 60 s. Before create() returns, the
 * two pids are appended to the file that the environment variable KVC_ESCAPER_PIDS names, one a line, so that
 * tests/cli/test_hostile_plugins.cpp can check that neither outlives kvcheck (docs/bad-input.md).
 */
#include "example_plugin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static kvc_plugin_api g_table;
static const kvc_plugin_api* g_example;

static void record_pids(pid_t a, pid_t b) {
    const char* file = getenv("KVC_ESCAPER_PIDS");
    if (!file || !*file) return;
    const int fd = open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    dprintf(fd, "%d\n%d\n", (int)a, (int)b); /* one write: appends from several cases do not interleave */
    close(fd);
}

/* Returns once both escaped processes exist and are recorded: the case may end right after create(). */
static void escape(void) {
    int ready[2];
    if (pipe(ready) != 0) return;
    const pid_t a = fork();
    if (a == 0) {
        close(ready[0]);
        setsid();
        const pid_t b = fork();
        if (b == 0) {
            sleep(60);
            _exit(0);
        }
        record_pids(getpid(), b);
        if (write(ready[1], "x", 1) < 0) _exit(1);
        close(ready[1]);
        sleep(60);
        _exit(0);
    }
    close(ready[1]);
    char c;
    if (a > 0)
        while (read(ready[0], &c, 1) < 0 && errno == EINTR) {
        }
    close(ready[0]);
}

static kvc_status escaping_create(const kvc_config* config, kvc_cache** out) {
    escape();
    return g_example->create(config, out);
}

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);

const kvc_plugin_api* kvcheck_plugin_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
    g_example = kvc_example_entry(harness_abi_major, harness_abi_minor);
    if (!g_example) return NULL;
    g_table = *g_example;
    g_table.create = escaping_create;
    return &g_table;
}
