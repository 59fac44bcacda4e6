/*
 * Hostile plugins aimed at NO-Q's memory watches (issue 42 item 2): the example cache (correct outputs, K/V on the
 * host, reported honestly) that keeps every call's queries where it hopes the watch does not look. Both declare
 * KVC_MEMORY_DEVICE. Variants (KVC_HOSTILE_MEMORY):
 *
 *   0 device_hoarder   keeps a copy of every query on the host heap (never read again): a DEVICE declaration must
 *                      not take the host heap out of the watch. Fails NO-Q ("hidden storage", the host heap).
 *   1 cudart_swapper   a constructor sets KVCHECK_CUDART to this very file, which exports a cudaMemGetInfo that never
 *                      changes; the queries are kept in "device memory" of the CUDA runtime KVCHECK_CUDART named
 *                      before (the fake one of fake_cudart.c in the tests). kvcheck must read the runtime it
 *                      resolved itself, before any plugin code ran: fails NO-Q ("device memory in use grew"). With
 *                      KVCHECK_CUDART naming this file from the start, kvcheck refuses to run it (exit 2).
 */
#define _GNU_SOURCE
#include "example_plugin.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVC_HOSTILE_MEMORY
#error "KVC_HOSTILE_MEMORY selects the double (0..1)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static const kvc_plugin_api* inner(void) { return kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

/* ---- where the queries go ---- */

typedef void* (*malloc_fn)(size_t);
static malloc_fn g_dmalloc; /* the runtime's fake_cuda_malloc (cudart_swapper) */

static void* keep_bytes(size_t bytes) {
    if (KVC_HOSTILE_MEMORY == 0) return malloc(bytes);
    return g_dmalloc ? g_dmalloc(bytes) : NULL;
}

#if KVC_HOSTILE_MEMORY == 1
/* The runtime the harness was told to read, opened before this file takes its place in the environment. */
__attribute__((constructor)) static void swap_runtime(void) {
    const char* before = getenv("KVCHECK_CUDART");
    Dl_info self;
    if (before != NULL && *before != '\0') {
        void* h = dlopen(before, RTLD_NOW | RTLD_LOCAL);
        void* sym = h ? dlsym(h, "fake_cuda_malloc") : NULL;
        if (sym != NULL) memcpy(&g_dmalloc, &sym, sizeof sym);
    }
    if (dladdr((const void*)&g_dmalloc, &self) != 0 && self.dli_fname != NULL) setenv("KVCHECK_CUDART", self.dli_fname, 1);
}

/* The runtime this file pretends to be: a device whose memory never changes. */
KVC_PLUGIN_EXPORT int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *free_bytes = (size_t)100 << 30;
    *total_bytes = (size_t)141 << 30;
    return 0;
}
KVC_PLUGIN_EXPORT const char* cudaGetErrorString(int error);
const char* cudaGetErrorString(int error) { return error == 0 ? "no error" : "unrecognized error code"; }
#endif

/* ---- the cache ---- */

#define MAX_CACHES 64
static struct {
    kvc_cache* cache;
    size_t q_row; /* n_q_heads * head_dim floats */
} g_live[MAX_CACHES];

static size_t q_row_of(const kvc_cache* c) {
    int i;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == c) return g_live[i].q_row;
    return 0;
}

/* What is kept, reachable from here (an allocation nothing points to may be removed by the compiler). */
#define MAX_KEPT 65536
static void* g_kept[MAX_KEPT];
static size_t g_n_kept;

static void hoard(const kvc_cache* c, const float* q, uint64_t tokens) {
    const size_t bytes = (size_t)tokens * q_row_of(c) * sizeof(float);
    void* p;
    if (bytes == 0 || q == NULL || g_n_kept == MAX_KEPT) return;
    p = keep_bytes(bytes); /* never freed, never read: hidden storage */
    if (p == NULL) return;
    if (KVC_HOSTILE_MEMORY == 0) memcpy(p, q, bytes);
    g_kept[g_n_kept++] = p;
}

static void hm_get_caps(kvc_caps* out) {
    inner()->get_caps(out);
    if (out->struct_size >= offsetof(kvc_caps, memory_space) + sizeof out->memory_space)
        out->memory_space = KVC_MEMORY_DEVICE;
}

static kvc_status hm_create(const kvc_config* config, kvc_cache** out) {
    const kvc_status s = inner()->create(config, out);
    int i;
    if (s != KVC_OK) return s;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == NULL) {
            g_live[i].cache = *out;
            g_live[i].q_row = (size_t)config->n_q_heads * config->head_dim;
            break;
        }
    return s;
}

static void hm_destroy(kvc_cache* c) {
    int i;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == c) g_live[i].cache = NULL;
    inner()->destroy(c);
}

static kvc_status hm_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                   const float* k, const float* v, float* out) {
    const kvc_status s = inner()->append_attend(c, seq, layer, n_new, q, k, v, out);
    if (s == KVC_OK) hoard(c, q, n_new);
    return s;
}

static kvc_status hm_append_attend_batch(kvc_cache* c, uint32_t layer, const kvc_batch* b) {
    const kvc_status s = inner()->append_attend_batch(c, layer, b);
    if (s == KVC_OK && b != NULL && b->n_seqs > 0) hoard(c, b->q, b->token_offsets[b->n_seqs]);
    return s;
}

static kvc_plugin_api g_api;

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor);
const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor) {
    (void)minor;
    if (inner() == NULL || major != KVC_ABI_VERSION_MAJOR) return NULL;
    g_api = *inner();
    g_api.name = KVC_HOSTILE_MEMORY == 0 ? "device_hoarder" : "cudart_swapper";
    g_api.get_caps = hm_get_caps;
    g_api.create = hm_create;
    g_api.destroy = hm_destroy;
    g_api.append_attend = hm_append_attend;
    if (inner()->append_attend_batch != NULL) g_api.append_attend_batch = hm_append_attend_batch;
    return &g_api;
}
