/*
 * Writes outside `out` at the reaches the guard zones must cover (properties/src/lent.hpp): the example plugin
 * (correct) whose append_attend, after computing `out`, writes once more where it must not. Chosen by KVC_REACH.
 * A guard only after the buffer, or one only a few hundred bytes long, lets the first two pass; without protected
 * pages the third lands in the harness's heap, where it may pass, crash anywhere later, or corrupt what is graded.
 *
 *   0 out_before     one float (zero) just before `out`: FAIL, "wrote 4 bytes before `out` in append_attend"
 *   1 out_past_320   one float 320 bytes past the end of `out`: FAIL, "wrote 324 bytes past `out`"
 *   2 out_rows_past  64 KiB of zeros from the end of `out`, as if it held max_tokens rows: the write runs through
 *                    the pattern into the protected pages, so the case process dies of SIGSEGV, and the CRASH
 *                    verdict names `out` and append_attend
 *   3 out_and_q      one float just before `out` and the first float of the const `q` zeroed, in one call: two
 *                    buffers misused at once, so served by kvcheck serve-plugin the reply carries two violations;
 *                    FAIL, the same words through either isolation
 */
#include "example_plugin.h"

#include <stdint.h>
#include <string.h>

#ifndef KVC_REACH
#error "KVC_REACH selects the double (0..3)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static const kvc_plugin_api* inner(void) { return kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

/* The row size of each live cache (query heads times head dim), for where `out` ends. */
#define MAX_CACHES 64
static struct {
    kvc_cache* cache;
    size_t row_floats;
} g_live[MAX_CACHES];

static size_t row_floats_of(const kvc_cache* c) {
    int i;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == c) return g_live[i].row_floats;
    return 0;
}

static kvc_status reach_create(const kvc_config* config, kvc_cache** out) {
    kvc_status s = inner()->create(config, out);
    int i;
    if (s != KVC_OK) return s;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == NULL) {
            g_live[i].cache = *out;
            g_live[i].row_floats = (size_t)config->n_q_heads * config->head_dim;
            return s;
        }
    inner()->destroy(*out);
    return KVC_ERR_OUT_OF_MEMORY;
}

static void reach_destroy(kvc_cache* c) {
    int i;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == c) g_live[i].cache = NULL;
    inner()->destroy(c);
}

static kvc_status reach_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                      const float* k, const float* v, float* out) {
    static const float zero = 0.0f;
    kvc_status s = inner()->append_attend(c, seq, layer, n_new, q, k, v, out);
    unsigned char* end = (unsigned char*)(out + (size_t)n_new * row_floats_of(c));
    if (s != KVC_OK || n_new == 0) return s;
    if (KVC_REACH == 0 || KVC_REACH == 3) memcpy((unsigned char*)out - sizeof zero, &zero, sizeof zero);
    if (KVC_REACH == 3) memcpy((void*)q, &zero, sizeof zero); /* after the call: the cache holds what it was given */
    if (KVC_REACH == 1) memcpy(end + 320, &zero, sizeof zero);
    if (KVC_REACH == 2) {
        /* volatile: one store at a time, in order, as a plain loop over rows would write */
        volatile unsigned char* p = end;
        size_t i;
        for (i = 0; i < ((size_t)64 << 10); ++i) p[i] = 0;
    }
    return s;
}

static kvc_plugin_api g_api;

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor);
const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor) {
    (void)minor;
    if (inner() == NULL || major != KVC_ABI_VERSION_MAJOR) return NULL;
    g_api = *inner();
    g_api.name = "reach";
    g_api.create = reach_create;
    g_api.destroy = reach_destroy;
    g_api.append_attend = reach_append_attend;
    return &g_api;
}
