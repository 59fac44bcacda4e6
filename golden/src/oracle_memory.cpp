// Cache and weight sizes of 000, 001 and 003, from the formula in integers. The inputs each document does not
// print (the Llama architectures, what "4k" and "8k" mean) are marked "assumed" in the golden files.
#include "kvcheck/golden/cache_size.hpp"

#include "quantities.hpp"

#include <set>

namespace kvc::golden {

const std::vector<CacheShape>& document_caches() {
    static const std::vector<CacheShape> caches = {
        //  name                      B   L   T     H_kv d_h  s
        {"llama2_13b.per_token",      1,  40, 1,    40,  128, 2}, // 000: "~0.8 MB per token"
        {"llama2_13b.batch32_4k",     32, 40, 4096, 40,  128, 2}, // 000: "a batch of 32 and 4k context"
        {"llama3_70b.8k",             1,  80, 8192, 8,   128, 2}, // 001: "roughly 2.5 GB ... per sequence"
        {"example003.8k",             1,  32, 8192, 32,  128, 2}, // 003: "= 4 GiB"
    };
    return caches;
}

const std::vector<WeightsSize>& document_weights() {
    static const std::vector<WeightsSize> weights = {
        {"llama2_13b.weights", 13'000'000'000ull, 2}, // 000: "larger than the weights themselves"
        {"llama3_70b.weights", 70'000'000'000ull, 2}, // 001: "weights are 140 GB"
    };
    return weights;
}

void add_memory(Quantities& q) {
    using LD = long double;
    std::set<std::string> models; // the architecture numbers are registered once per model
    for (const CacheShape& c : document_caches()) {
        const std::string n = c.name, model = n.substr(0, n.find('.'));
        if (models.insert(model).second) {
            q.scalar(model + ".layers", static_cast<LD>(c.layers));
            q.scalar(model + ".kv_heads", static_cast<LD>(c.kv_heads));
            q.scalar(model + ".head_dim", static_cast<LD>(c.head_dim));
            q.scalar(model + ".bytes_per_elem", static_cast<LD>(c.bytes_per_elem));
        }
        q.scalar(n + ".batch", static_cast<LD>(c.batch));
        q.scalar(n + ".tokens", static_cast<LD>(c.tokens));
        // the formula written out, in the order 003 prints it: 2 × B × L × T × H_kv × d_h × s
        q.vector(n + ".factors", {2, static_cast<LD>(c.batch), static_cast<LD>(c.layers), static_cast<LD>(c.tokens),
                                  static_cast<LD>(c.kv_heads), static_cast<LD>(c.head_dim),
                                  static_cast<LD>(c.bytes_per_elem)});
        q.scalar(n + ".bytes", static_cast<LD>(kv_cache_bytes(c)));
        // the same cache quantized: what the documents' "quantising K/V" trick buys
        q.scalar(n + ".fp8.bytes", static_cast<LD>(kv_cache_bytes_fp8(c)));
        q.scalar(n + ".int8_token.bytes", static_cast<LD>(kv_cache_bytes_int8_token(c)));
        q.scalar(n + ".q8_0.bytes", static_cast<LD>(kv_cache_bytes_q8_0(c)));
    }
    for (const WeightsSize& w : document_weights()) {
        q.scalar(std::string(w.name) + ".params", static_cast<LD>(w.params));
        q.scalar(std::string(w.name) + ".bytes", static_cast<LD>(w.params * w.bytes_per_param));
    }
    const auto& caches = document_caches();
    const auto& weights = document_weights();
    // 000: "at a batch of 32 and 4k context, that block is larger than the weights themselves"
    q.scalar("llama2_13b.batch32_4k.over_weights",
             static_cast<LD>(kv_cache_bytes(caches[1])) / static_cast<LD>(weights[0].params * weights[0].bytes_per_param));
    // 001: "cache becomes dominant only at high batch": the smallest batch whose cache outweighs the weights
    const uint64_t per_seq = kv_cache_bytes(caches[2]), w70 = weights[1].params * weights[1].bytes_per_param;
    q.scalar("llama3_70b.batch_exceeding_weights", static_cast<LD>(w70 / per_seq + 1));
}

} // namespace kvc::golden
