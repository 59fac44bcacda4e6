/*
 * The example plugin's own interface, for code that links it statically (the kvcheck CLI's built-in registry and
 * the tests). A harness that loads the shared module never sees this header: it finds only KVC_ENTRY_SYMBOL.
 */
#ifndef KVCHECK_EXAMPLE_PLUGIN_H
#define KVCHECK_EXAMPLE_PLUGIN_H

#include "kvcheck/abi.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The function table, or NULL when the caller speaks another major version of the ABI. */
const kvc_plugin_api* kvc_example_entry(uint32_t abi_major, uint32_t abi_minor);

/* The plugin's 16-bit storage formats (half.c). Rounding is to nearest, ties to even. A NaN becomes a quiet NaN of
   the same sign; everything else converts exactly as Eigen::half / Eigen::bfloat16 do. */
uint16_t kvc_example_f32_to_f16(float x);
float kvc_example_f16_to_f32(uint16_t h);
uint16_t kvc_example_f32_to_bf16(float x);
float kvc_example_bf16_to_f32(uint16_t b);

#ifdef __cplusplus
}
#endif

#endif /* KVCHECK_EXAMPLE_PLUGIN_H */
