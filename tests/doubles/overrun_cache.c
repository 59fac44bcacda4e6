/*
 * Test doubles that write outside the buffers the harness lends them (issue 13, item 4): each is the example plugin
 * (correct) plus one scribble, chosen by KVC_OVERRUN at compile time. The harness's guard zones must turn each into
 * a FAIL that names the buffer, the call and the byte count; the example itself (no scribble) passes.
 *
 *   0 out_past        append_attend writes 4 bytes past `out`
 *   1 memory_past     memory writes 216 bytes past the kvc_memory struct
 *   2 k_out_before    read_kv writes 8 bytes before `k_out`
 *   3 length_past     seq_length writes 4 bytes past its uint32_t
 *   4 writes_q        append_attend overwrites the first element of `q`, a const input, after using it
 *   5 batch_out_past  declares BATCH (a loop over append_attend) and writes 4 bytes past the batch's `out`
 */
#include "example_plugin.h"

#include <string.h>

#ifndef KVC_OVERRUN
#error "KVC_OVERRUN selects the double (0..5)"
#endif

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static const kvc_plugin_api* inner(void) { return kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

static const unsigned char kScribble[256] = {0}; /* zeros: never the guard pattern */

/* The configs of live caches, for the row sizes the scribbles and the batch loop need. */
#define MAX_CACHES 64
static struct {
    kvc_cache* cache;
    kvc_config cfg;
} g_live[MAX_CACHES];

static const kvc_config* config_of(const kvc_cache* c) {
    int i;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == c) return &g_live[i].cfg;
    return NULL;
}

static void ov_get_caps(kvc_caps* out) {
    inner()->get_caps(out);
    if (KVC_OVERRUN == 5 && out->struct_size >= offsetof(kvc_caps, features) + sizeof out->features)
        out->features |= KVC_FEATURE_BATCH;
}

static kvc_status ov_create(const kvc_config* config, kvc_cache** out) {
    kvc_status s = inner()->create(config, out);
    int i;
    if (s != KVC_OK) return s;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == NULL) {
            g_live[i].cache = *out;
            g_live[i].cfg = *config;
            return s;
        }
    inner()->destroy(*out);
    return KVC_ERR_OUT_OF_MEMORY;
}

static void ov_destroy(kvc_cache* c) {
    int i;
    for (i = 0; i < MAX_CACHES; ++i)
        if (g_live[i].cache == c) g_live[i].cache = NULL;
    inner()->destroy(c);
}

static const char* ov_last_error(const kvc_cache* c) { return inner()->last_error(c); }

static kvc_status ov_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                   const float* k, const float* v, float* out) {
    const kvc_config* cfg = config_of(c);
    kvc_status s = inner()->append_attend(c, seq, layer, n_new, q, k, v, out);
    if (s != KVC_OK || cfg == NULL) return s;
    if (KVC_OVERRUN == 0) memcpy(out + (size_t)n_new * cfg->n_q_heads * cfg->head_dim, kScribble, 4);
    if (KVC_OVERRUN == 4 && n_new > 0) memcpy((float*)q, kScribble, sizeof(float));
    return s;
}

static kvc_status ov_append_attend_batch(kvc_cache* c, uint32_t layer, const kvc_batch* b) {
    const kvc_config* cfg = config_of(c);
    size_t qr, kr;
    uint32_t i;
    if (cfg == NULL || b == NULL) return KVC_ERR_INVALID_ARGUMENT;
    qr = (size_t)cfg->n_q_heads * cfg->head_dim;
    kr = (size_t)cfg->n_kv_heads * cfg->head_dim;
    for (i = 0; i < b->n_seqs; ++i) {
        const size_t t = b->token_offsets[i];
        const uint32_t n = b->token_offsets[i + 1] - b->token_offsets[i];
        kvc_status s = inner()->append_attend(c, b->seq_ids[i], layer, n, b->q + t * qr, b->k + t * kr, b->v + t * kr,
                                              b->out + t * qr);
        if (s != KVC_OK) return s;
    }
    memcpy(b->out + (size_t)b->token_offsets[b->n_seqs] * qr, kScribble, 4);
    return KVC_OK;
}

static kvc_status ov_memory(kvc_cache* c, kvc_memory* out) {
    kvc_status s = inner()->memory(c, out);
    if (s == KVC_OK && KVC_OVERRUN == 1) memcpy((unsigned char*)out + out->struct_size, kScribble, 216);
    return s;
}

static kvc_status ov_read_kv(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                             void* v_out) {
    kvc_status s = inner()->read_kv(c, seq, layer, pos, n, k_out, v_out);
    if (s == KVC_OK && KVC_OVERRUN == 2) memcpy((unsigned char*)k_out - 8, kScribble, 8);
    return s;
}

static kvc_status ov_seq_length(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t* length) {
    kvc_status s = inner()->seq_length(c, seq, layer, length);
    if (s == KVC_OK && KVC_OVERRUN == 3) memcpy(length + 1, kScribble, 4);
    return s;
}

static kvc_status ov_fork(kvc_cache* c, uint32_t parent, uint32_t child) { return inner()->fork(c, parent, child); }
static kvc_status ov_release(kvc_cache* c, uint32_t seq) { return inner()->release(c, seq); }

static const kvc_plugin_api g_api = {
    sizeof(kvc_plugin_api),
    KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "overrun",
    "1.0.0",
    ov_get_caps,
    ov_create,
    ov_destroy,
    ov_last_error,
    ov_append_attend,
    KVC_OVERRUN == 5 ? ov_append_attend_batch : NULL,
    ov_read_kv,
    ov_seq_length,
    ov_memory,
    ov_fork,
    ov_release,
    NULL, /* read_kv_scales: no quantized dtype declared */
};

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor);
const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor) {
    (void)minor;
    return inner() != NULL && major == KVC_ABI_VERSION_MAJOR ? &g_api : NULL;
}
