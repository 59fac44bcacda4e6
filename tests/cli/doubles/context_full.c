/* An engine whose context is always full: the example plugin, except that create() reports KVC_ERR_OUT_OF_MEMORY
 * with a message of its own, without asking the allocator for anything. tests/cli/test_hostile_plugins.cpp checks
 * that kvcheck quotes that message instead of blaming --memory-limit (issue 43 item 14). */
#include "example_plugin.h"

#define EXPORT __attribute__((visibility("default")))

static kvc_plugin_api g_table;
static const kvc_plugin_api* g_example;

static kvc_status full_create(const kvc_config* config, kvc_cache** out) {
    (void)config;
    *out = 0;
    return KVC_ERR_OUT_OF_MEMORY;
}

static const char* full_last_error(const kvc_cache* c) {
    return c ? g_example->last_error(c) : "context full: all 4096 blocks are taken";
}

EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);

const kvc_plugin_api* kvcheck_plugin_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
    g_example = kvc_example_entry(harness_abi_major, harness_abi_minor);
    if (!g_example) return 0;
    g_table = *g_example;
    g_table.create = full_create;
    g_table.last_error = full_last_error;
    return &g_table;
}
