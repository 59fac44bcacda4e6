// Our model engine (optimized/ ModelEngine: the reference's model over the paged CPU cache) behind the model-level
// ABI. Its own entry name; model_engine_plugin_entry.cpp exports it as KVCM_ENTRY_SYMBOL in a loadable module.
#pragma once

#include "kvcheck/model_abi.h"

extern "C" const kvcm_model_api* kvcm_model_engine_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);
