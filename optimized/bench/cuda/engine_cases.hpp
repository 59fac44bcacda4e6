// The engine's side of the GPU goals, driven only through the plugin ABI (kvc_cuda_engine_entry): what a user of
// the plugin gets, the engine's own host<->device copies of q, k, v and out included. The inputs are page-locked, so
// those copies cost what the bus allows; their measured cost is reported beside every figure, and an estimate with
// it subtracted, because the ABI has no way to hand the engine device pointers.
#pragma once

#include "common.hpp"
#include "kvcheck/abi.h"

#include <cstdint>
#include <string>

namespace kvc::gpubench {

// A decode shape: `seqs` sequences of `tokens` cached tokens each, one layer, bf16 cache, no RoPE.
struct DecodeShape {
    std::string name;
    uint32_t n_q_heads, n_kv_heads, head_dim, seqs, tokens, block;
};

// Where the blocks of a sequence lie in the engine's arena. The ABI cannot place blocks, but an engine hands out
// blocks in the order tokens arrive: appending whole sequences one after another lays each sequence's blocks side
// by side (contiguous); appending one block's worth of tokens at a time to sequences drawn in random order
// scatters them (shuffled). docs/gpu.md states this assumption.
enum class FillOrder { Contiguous, Shuffled };

struct DecodeResult {
    bool ran = false;
    std::string why_not;
    std::string shape, order;
    double kv_bytes = 0;          // K/V bytes one decode step reads (every cached row of every sequence, new one too)
    Stats step;                   // one step: every sequence decodes one token (append_attend_batch when declared)
    double bytes_per_s = 0;       // kv_bytes / median step time
    double host_io_ms = 0;        // pinned copies of the step's q, k, v in and out back, measured alone
    double device_bytes_per_s = 0;// kv_bytes / (median step - host_io): an estimate
    bool batched = false;         // append_attend_batch (else one append_attend per sequence)
    uint32_t block_size = 0;      // as the engine reports it
    double fill_s = 0;            // wall seconds to fill the cache
};

struct PrefillResult {
    bool ran = false;
    std::string why_not;
    uint32_t tokens = 0, n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
    double flops = 0;             // causal: 4 * head_dim * n_q_heads * tokens (tokens + 1) / 2
    Stats call;                   // one append_attend of every token onto an empty sequence
    double tflops = 0;            // flops / median call time
    double host_io_ms = 0;        // pinned copies of q, k, v in and out back, measured alone
    double device_tflops = 0;     // flops / (median call - host_io): an estimate
};

// The engine's table, or null with `why` set.
const kvc_plugin_api* cuda_engine(std::string& why);

// Decodes of both shapes' caches: contiguous only, or contiguous and shuffled timed alternately.
DecodeResult decode(const kvc_plugin_api* api, const DecodeShape& shape, int warmup, int repeats);
std::pair<DecodeResult, DecodeResult> decode_contiguous_vs_shuffled(const kvc_plugin_api* api,
                                                                    const DecodeShape& shape, int warmup,
                                                                    int repeats);
PrefillResult prefill(const kvc_plugin_api* api, uint32_t tokens, uint32_t n_q_heads, uint32_t n_kv_heads,
                      uint32_t head_dim, int warmup, int repeats);

} // namespace kvc::gpubench
