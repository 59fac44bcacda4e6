/*
 * A create() that writes into the fp8 scales its const kvc_config points to, sets every one (k_scales and v_scales)
 * to 1, then builds the cache from what it wrote: an engine that ignores the scales it is given. The CPU engine
 * plugin (KVC_INNER_PLUGIN, loaded with dlopen) behind that create(). The arrays it gets are copies, checked after
 * the call: the write is a FAIL naming `k_scales`, whatever the harness's graders kept of their own.
 */
#include "kvcheck/abi.h"

#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))

static const kvc_plugin_api* g_inner;
static kvc_plugin_api g_api;

static size_t scale_count(const kvc_config* c) {
    if (c->kv_scale_mode == KVC_SCALE_TENSOR) return c->n_layers;
    if (c->kv_scale_mode == KVC_SCALE_KV_HEAD) return (size_t)c->n_layers * c->n_kv_heads;
    return 0;
}

static kvc_status writer_create(const kvc_config* config, kvc_cache** out) {
    size_t i;
    if (config->k_scales != NULL && config->v_scales != NULL)
        for (i = 0; i < scale_count(config); ++i) {
            ((float*)config->k_scales)[i] = 1.0f;
            ((float*)config->v_scales)[i] = 1.0f;
        }
    return g_inner->create(config, out);
}

KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor);
const kvc_plugin_api* kvcheck_plugin_entry(uint32_t major, uint32_t minor) {
    void* h = dlopen(KVC_INNER_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    kvc_entry_fn entry;
    void* sym;
    if (h == NULL || (sym = dlsym(h, KVC_ENTRY_SYMBOL)) == NULL) return NULL;
    memcpy(&entry, &sym, sizeof entry);
    g_inner = entry(major, minor);
    if (g_inner == NULL) return NULL;
    memcpy(&g_api, g_inner, g_inner->struct_size < sizeof g_api ? g_inner->struct_size : sizeof g_api);
    g_api.name = "scales-writer";
    g_api.create = writer_create;
    return &g_api;
}
