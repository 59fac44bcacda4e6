// The KV-cache size formula the documents use, in integers so that every byte count is exact:
//   bytes = 2 (K and V) · B · L · T · H_kv · d_h · s
// and the models the documents apply it to. Architecture numbers a document does not print are marked
// "assumed" in the golden files (the published configs of Llama-2-13B and Llama-3-70B).
#pragma once

#include <cstdint>
#include <vector>

namespace kvc::golden {

struct CacheShape {
    const char* name;         // quantity prefix, e.g. "llama3_70b.8k"
    uint64_t batch;           // B
    uint64_t layers;          // L
    uint64_t tokens;          // T
    uint64_t kv_heads;        // H_kv
    uint64_t head_dim;        // d_h
    uint64_t bytes_per_elem;  // s (2 for fp16; 1 to count numbers instead of bytes)
};

constexpr uint64_t kv_cache_bytes(const CacheShape& c) {
    return 2 * c.batch * c.layers * c.tokens * c.kv_heads * c.head_dim * c.bytes_per_elem;
}

// The same cache stored quantized (docs/quantized.md). Only the bytes of one head's row change:
//   fp8 (E4M3 or E5M2)  d_h bytes: s = 1. Its k/v scales belong to a layer (or a layer's KV head), not to a
//                       token, so they do not grow with T and are left out of the per-token formula.
//   int8 per token      d_h codes + one f32 scale per token and KV head: d_h + 4 bytes.
//   q8_0 (llama.cpp)    32 codes share one f16 scale: d_h + 2 * d_h / 32 bytes (d_h a multiple of 32).
constexpr uint64_t kv_cache_rows(const CacheShape& c) { return 2 * c.batch * c.layers * c.tokens * c.kv_heads; }
constexpr uint64_t kv_cache_bytes_fp8(const CacheShape& c) { return kv_cache_rows(c) * c.head_dim; }
constexpr uint64_t kv_cache_bytes_int8_token(const CacheShape& c) { return kv_cache_rows(c) * (c.head_dim + 4); }
constexpr uint64_t kv_cache_bytes_q8_0(const CacheShape& c) {
    return kv_cache_rows(c) * (c.head_dim + 2 * (c.head_dim / 32));
}

// Every cache the four documents size, in document order.
const std::vector<CacheShape>& document_caches();

// Model weights at 2 bytes per parameter (fp16/bf16), from the nominal parameter count in the model's name.
struct WeightsSize {
    const char* name;     // quantity prefix, e.g. "llama3_70b.weights"
    uint64_t params;      // 70e9 for "70B"
    uint64_t bytes_per_param;
};
const std::vector<WeightsSize>& document_weights();

} // namespace kvc::golden
