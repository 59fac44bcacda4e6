/*
 * A fake DEVICE cache: the example plugin (correct, storing on the host) that declares KVC_MEMORY_DEVICE and "allocates
 * device memory" through the fake CUDA runtime (fake_cudart.c, found through KVCHECK_CUDART, the file the harness's
 * device-memory watch opens too). It proves NO-Q and MEMORY hold a DEVICE cache's device allocations against its
 * reports, without a GPU. Variants (KVC_FAKE_DEVICE):
 *
 *   0 honest     one arena of the reported capacity + pool, allocated in create                 passes NO-Q, MEMORY
 *   1 q_keeper   also keeps every call's queries in a new device buffer (never read again)        fails NO-Q
 *   2 misreport  also allocates a device block per 16 tokens appended, reported nowhere           fails NO-Q, MEMORY
 *
 * Without the fake runtime (KVCHECK_CUDART unset or not the fake) nothing is counted and the cache still works.
 */
#include "example_plugin.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVC_FAKE_DEVICE
#error "KVC_FAKE_DEVICE selects the variant (0..2)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

typedef void* (*malloc_fn)(size_t);
typedef void (*free_fn)(void*);
static malloc_fn g_dmalloc;
static free_fn g_dfree;

static void find_runtime(void) {
    const char* path = getenv("KVCHECK_CUDART");
    void *h, *sym_m, *sym_f;
    if (g_dmalloc != NULL || path == NULL) return;
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* the same file as the harness's: the same counter */
    if (h == NULL) return;
    sym_m = dlsym(h, "fake_cuda_malloc"); /* (memcpy: ISO C has no cast from object to function pointer) */
    sym_f = dlsym(h, "fake_cuda_free");
    if (sym_m == NULL || sym_f == NULL) return;
    memcpy(&g_dmalloc, &sym_m, sizeof sym_m);
    memcpy(&g_dfree, &sym_f, sizeof sym_f);
}

static void* dmalloc(size_t bytes) { return g_dmalloc ? g_dmalloc(bytes) : NULL; }
static void dfree(void* p) {
    if (g_dfree) g_dfree(p);
}

static const kvc_plugin_api* inner(void) { return kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

#define MAX_CACHES 64
#define MAX_KEPT 4096
static struct {
    kvc_cache* cache;
    kvc_config cfg;
    void* arena;
    void* kept[MAX_KEPT]; /* q_keeper's query buffers, misreport's blocks */
    size_t n_kept;
    uint64_t tokens; /* appended so far (misreport) */
} g_live[MAX_CACHES];

static int slot_of(const kvc_cache* c) {
    int i;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == c) return i;
    return -1;
}

static void keep(int s, size_t bytes) {
    if (g_live[s].n_kept < MAX_KEPT) g_live[s].kept[g_live[s].n_kept++] = dmalloc(bytes);
}

static void fd_get_caps(kvc_caps* out) {
    inner()->get_caps(out);
    if (out->struct_size >= offsetof(kvc_caps, memory_space) + sizeof out->memory_space)
        out->memory_space = KVC_MEMORY_DEVICE;
}

static kvc_status fd_create(const kvc_config* config, kvc_cache** out) {
    kvc_memory m;
    kvc_status s;
    int i;
    find_runtime();
    s = inner()->create(config, out);
    if (s != KVC_OK) return s;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == NULL) break;
    if (i == MAX_CACHES || inner()->memory(*out, &m) != KVC_OK) {
        inner()->destroy(*out);
        return KVC_ERR_OUT_OF_MEMORY;
    }
    memset(&g_live[i], 0, sizeof g_live[i]);
    g_live[i].cache = *out;
    g_live[i].cfg = *config;
    g_live[i].arena = dmalloc((size_t)(m.capacity_bytes + m.pool_bytes)); /* what memory() reports, on the device */
    return KVC_OK;
}

static void fd_destroy(kvc_cache* c) {
    const int s = slot_of(c);
    size_t i;
    if (s >= 0) {
        dfree(g_live[s].arena);
        for (i = 0; i < g_live[s].n_kept; ++i) dfree(g_live[s].kept[i]);
        g_live[s].cache = NULL;
    }
    inner()->destroy(c);
}

static const char* fd_last_error(const kvc_cache* c) { return inner()->last_error(c); }

static kvc_status fd_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                   const float* k, const float* v, float* out) {
    const int s = slot_of(c);
    const kvc_status st = inner()->append_attend(c, seq, layer, n_new, q, k, v, out);
    if (st != KVC_OK || s < 0 || n_new == 0) return st;
    if (KVC_FAKE_DEVICE == 1) /* the queries, kept on the device */
        keep(s, (size_t)n_new * g_live[s].cfg.n_q_heads * g_live[s].cfg.head_dim * sizeof(float));
    if (KVC_FAKE_DEVICE == 2) { /* a block of 16 rows (K and V) each time the running total crosses 16 */
        const uint64_t before = g_live[s].tokens;
        const size_t block = (size_t)16 * 2 * g_live[s].cfg.n_kv_heads * g_live[s].cfg.head_dim * sizeof(float);
        uint64_t b;
        g_live[s].tokens += n_new;
        for (b = before / 16; b < (g_live[s].tokens + 15) / 16; ++b)
            if (b * 16 >= before) keep(s, block);
    }
    return st;
}

static kvc_status fd_read_kv(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                             void* v_out) {
    return inner()->read_kv(c, seq, layer, pos, n, k_out, v_out);
}
static kvc_status fd_seq_length(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t* length) {
    return inner()->seq_length(c, seq, layer, length);
}
static kvc_status fd_memory(kvc_cache* c, kvc_memory* out) { return inner()->memory(c, out); }
static kvc_status fd_fork(kvc_cache* c, uint32_t parent, uint32_t child) { return inner()->fork(c, parent, child); }
static kvc_status fd_release(kvc_cache* c, uint32_t seq) { return inner()->release(c, seq); }

static const kvc_plugin_api g_api = {
    sizeof(kvc_plugin_api),
    KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "fake-device",
    "1.0.0",
    fd_get_caps,
    fd_create,
    fd_destroy,
    fd_last_error,
    fd_append_attend,
    NULL,
    fd_read_kv,
    fd_seq_length,
    fd_memory,
    fd_fork,
    fd_release,
    NULL, /* read_kv_scales: no quantized dtype declared */
};

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor);
const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor) {
    (void)minor;
    return inner() != NULL && major == KVC_ABI_VERSION_MAJOR ? &g_api : NULL;
}
