/*
 * The one symbol a harness looks up after dlopen: KVC_ENTRY_SYMBOL, "kvcheck_plugin_entry".
 *
 * Copy this file for your own plugin. It is kept apart from the implementation on purpose: the implementation is a
 * static library with an ordinary C name (kvc_example_entry) that the kvcheck CLI links in directly, while this file
 * turns that library into a loadable module. Because everything is compiled with -fvisibility=hidden, the export
 * marker below makes this function the module's only exported symbol; nothing else leaks into the harness's
 * process, so two plugins built from the same sources never collide.
 */
#include "example_plugin.h"

#if defined(_WIN32)
#define KVC_PLUGIN_EXPORT __declspec(dllexport)
#else
#define KVC_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* The name must be spelled exactly as KVC_ENTRY_SYMBOL, and the signature must match kvc_entry_fn. */
KVC_PLUGIN_EXPORT const kvc_plugin_api* kvcheck_plugin_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);

const kvc_plugin_api* kvcheck_plugin_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
    return kvc_example_entry(harness_abi_major, harness_abi_minor);
}
