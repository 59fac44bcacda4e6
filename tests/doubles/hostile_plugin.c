/* Hostile plugins: the example plugin (a correct cache) with one behaviour that attacks the harness instead of
 * caching badly. Each is built as its own module with KVC_HOSTILE set to one of the numbers below
 * (tests/doubles/CMakeLists.txt); tests/cli/test_hostile_plugins.cpp runs kvcheck against each and checks that the
 * harness survives it with the documented exit code or verdict (docs/bad-input.md). */
#include "example_plugin.h"
#include "fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define H_CTOR_EXIT0 0    /* exit(0) in a shared-library constructor */
#define H_ENTRY_EXIT0 1   /* exit(0) in the entry function */
#define H_CAPS_EXIT0 2    /* exit(0) in get_caps */
#define H_DATA_ENTRY 3    /* the entry symbol is a data object */
#define H_ENTRY_ABORT 4   /* abort() in the entry function */
#define H_CAPS_SEGV 5     /* get_caps dereferences NULL */
#define H_CAPS_OVERRUN 6  /* get_caps writes 64 bytes past the kvc_caps it was given */
#define H_CAPS_BLOCK 7    /* get_caps never returns */
#define H_FORKER 8        /* every create() forks a grandchild that sleeps for a day */
#define H_CASE_EXIT0 9    /* exit(0) in append_attend: inside a case */
#define H_CTRL_NAME 10    /* name and version with terminal control sequences */
#define H_FAKE_DEVICE 11  /* declares memory_space DEVICE, stores on the host, and refuses to run in a fork()ed copy
                             of a process that loaded it (what a CUDA context does) */
#define H_HOG 12          /* create() asks malloc for 4 GiB (untouched) and reports OUT_OF_MEMORY when refused */
#define H_CHATTER 13      /* append_attend writes to stdout without end */
#define H_FD_SCRIBBLER 14 /* its constructor writes garbage to every descriptor from 3 to 63 */

#ifndef KVC_HOSTILE
#error "KVC_HOSTILE must name one behaviour"
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAYBE_UNUSED __attribute__((unused)) /* the data-entry variant calls none of it */

MAYBE_UNUSED static kvc_plugin_api g_table;
MAYBE_UNUSED static const kvc_plugin_api* g_example;

#if KVC_HOSTILE == H_CTOR_EXIT0
__attribute__((constructor)) static void leave_early(void) { exit(0); }
#endif

#if KVC_HOSTILE == H_FD_SCRIBBLER
__attribute__((constructor)) static void scribble(void) {
    static const char garbage[] = "F {\"verdict\": \"PASS\"\nP not json at all\n\x01\x02\x03";
    for (int fd = 3; fd < 64; ++fd)
        if (write(fd, garbage, sizeof garbage - 1) < 0) continue;
}
#endif

#if KVC_HOSTILE == H_FAKE_DEVICE
static pid_t g_loaded_in; /* the process whose "context" this is */
__attribute__((constructor)) static void open_context(void) { g_loaded_in = getpid(); }
#endif

MAYBE_UNUSED static void hostile_get_caps(kvc_caps* out) {
#if KVC_HOSTILE == H_CAPS_EXIT0
    exit(0);
#elif KVC_HOSTILE == H_CAPS_SEGV
    kvc_double_fault();
#elif KVC_HOSTILE == H_CAPS_BLOCK
    for (;;) pause();
#endif
    g_example->get_caps(out);
#if KVC_HOSTILE == H_CAPS_OVERRUN
    memset((unsigned char*)out + out->struct_size, 0x5a, 64);
#elif KVC_HOSTILE == H_FAKE_DEVICE
    out->memory_space = KVC_MEMORY_DEVICE;
#endif
}

#if KVC_HOSTILE == H_HOG
static int g_hog_refused;
/* Says what went wrong, as a plugin should: the status by name and the size asked for. */
static const char* hog_last_error(const kvc_cache* c) {
    return !c && g_hog_refused ? "KVC_ERR_OUT_OF_MEMORY: malloc of 4 GiB refused" : g_example->last_error(c);
}
#endif

MAYBE_UNUSED static kvc_status hostile_create(const kvc_config* config, kvc_cache** out) {
#if KVC_HOSTILE == H_FORKER
    /* The grandchild records its pid in the working directory, so that the test can look for it afterwards. */
    const pid_t pid = fork();
    if (pid == 0) {
        FILE* f = fopen("hostile_forker_pids.txt", "a");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
        sleep(86400);
        _exit(0);
    }
#elif KVC_HOSTILE == H_FAKE_DEVICE
    if (getpid() != g_loaded_in) {
        *out = NULL;
        return KVC_ERR_INTERNAL; /* a fork()ed copy of a process with a device context cannot use it */
    }
#elif KVC_HOSTILE == H_HOG
    void* big = malloc((size_t)4 << 30);
    if (!big) {
        *out = NULL;
        g_hog_refused = 1;
        return KVC_ERR_OUT_OF_MEMORY;
    }
    free(big);
#endif
    return g_example->create(config, out);
}

MAYBE_UNUSED static kvc_status hostile_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new,
                                                     const float* q, const float* k, const float* v, float* out) {
#if KVC_HOSTILE == H_CASE_EXIT0
    exit(0);
#elif KVC_HOSTILE == H_CHATTER
    static char line[65536];
    memset(line, 'x', sizeof line);
    for (;;)
        if (write(STDOUT_FILENO, line, sizeof line) < 0) _exit(1);
#endif
    return g_example->append_attend(c, seq, layer, n_new, q, k, v, out);
}

#if KVC_HOSTILE == H_DATA_ENTRY
/* Not a function: calling it would jump into data. */
EXPORT const char kvcheck_plugin_entry[64] = "this is data, not code";
#else
EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);

const kvc_plugin_api* kvcheck_plugin_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
#if KVC_HOSTILE == H_ENTRY_EXIT0
    exit(0);
#elif KVC_HOSTILE == H_ENTRY_ABORT
    abort();
#endif
    g_example = kvc_example_entry(harness_abi_major, harness_abi_minor);
    if (!g_example) return NULL;
    g_table = *g_example;
    g_table.get_caps = hostile_get_caps;
    g_table.create = hostile_create;
    g_table.append_attend = hostile_append_attend;
#if KVC_HOSTILE == H_HOG
    g_table.last_error = hog_last_error;
#endif
#if KVC_HOSTILE == H_CTRL_NAME
    g_table.name = "evil\x1b[2J\x1b]0;pwned\x07name\r\n";
    g_table.version = "1.0\x1b[31m";
#endif
    return &g_table;
}
#endif
