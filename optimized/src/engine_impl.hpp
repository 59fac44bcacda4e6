// The engine's state: the block pool, one block table per (sequence, layer) stream, and the parts of a call.
// engine.cpp checks input at the boundary and runs calls; append.cpp is the only code that writes K/V.
#pragma once

#include "kvcheck/optimized/abi_checks.hpp"
#include "kvcheck/optimized/engine.hpp"
#include "kvcheck/optimized/window_rule.hpp" // kDroppedBlock, the eviction rule

#include "attention_kernel.hpp"
#include "block_pool.hpp"
#include "quantize.hpp"
#include "rope.hpp"

#include <cstdarg>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace kvc::opt {

// The geometry of the V rows of a block whose V rows have head_dim_v dims and K rows k.head_dim: rows, heads and
// the plane are head_dim_v wide, but plane_bytes stays K's, so that kvc_kv_address(&v, ..., KVC_PLANE_V, ...) finds
// the V plane right after the K plane. A block is k.plane_bytes + n_kv_heads * v.head_bytes bytes (not
// kvc_kv_block_bytes of either). When head_dim_v == k.head_dim this is k itself.
inline kvc_kv_layout kvc_kv_layout_v(const kvc_kv_layout& k, uint32_t head_dim_v, uint32_t scale_bytes_v) {
    return kvc_kv_layout_make_v(&k, head_dim_v, scale_bytes_v);
}

// One (sequence, layer): its rows live in blocks[pos / B], slot pos % B.
// Invariant: blocks.size() == ceil(length / B); every slot below length was written exactly once. With eviction,
// blocks[sink_blocks .. sink_blocks + dropped - 1] are kDroppedBlock (freed; positions stay absolute), no other.
struct Stream {
    std::vector<uint32_t> blocks;
    uint32_t length = 0;
    uint32_t dropped = 0; // blocks freed by eviction, right after the sinks' blocks
};

struct Sequence {
    std::vector<Stream> layers; // [n_layers]
};

struct Engine::Impl {
    kvc_config cfg{};
    EngineOptions opt{};
    uint32_t block_size = 0;
    uint32_t elem_bytes = 0;
    bool quantized = false;   // a quantized dtype: rows are codes and scales (quantize.hpp)
    QuantFormat quant{};      // its row format (K rows)
    QuantFormat quant_v{};    // V rows' format (head_dim_v dims)
    uint32_t head_dim_v = 0;  // the config's head_dim_v, or head_dim when that is 0
    // fp8: the scale of each (layer, KV head), [n_layers][n_kv_heads] (1 under KVC_SCALE_NONE, the layer's under
    // KVC_SCALE_TENSOR); empty for other dtypes. The config's arrays are the harness's: copied at create.
    std::vector<float> k_scales, v_scales;
    uint32_t padded = 0;     // head_dim rounded up to 8
    uint64_t max_tokens = 0; // per stream
    // Windows (ABI 1.2): W of each layer (0: none; empty: no window anywhere), the sinks, and eviction. The config's
    // array is the harness's: copied at create. sink_blocks: the leading blocks that hold sinks, never freed.
    std::vector<uint32_t> windows;
    uint32_t n_sinks = 0;
    bool evict = false;
    uint32_t sink_blocks = 0;
    kvc_kv_layout geometry{};   // K rows; V rows too when head_dim_v == head_dim
    kvc_kv_layout geometry_v{}; // V rows (kvc_kv_layout_v; == geometry when head_dim_v == head_dim)
    BlockPool pool;
    Rope rope;
    SplitKernel kernel = nullptr;
    bool simd = false;
    std::unordered_map<uint32_t, Sequence> seqs; // sequences that hold (or held) tokens; absent = empty
    char error[512] = "no error";

    Impl(const kvc_config& c, const EngineOptions& o, uint32_t b, const PoolOptions& p);

    // Records a message and returns status.
    kvc_status fail(kvc_status status, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

    // The layout with the pool's current block addresses (valid until the pool grows).
    kvc_kv_layout layout() const {
        kvc_kv_layout l = geometry;
        l.block_base = pool.bases();
        return l;
    }
    kvc_kv_layout layout_v() const {
        kvc_kv_layout l = geometry_v;
        l.block_base = pool.bases();
        return l;
    }
    bool separate_v() const { return head_dim_v != cfg.head_dim; }
    const Stream* find(uint32_t seq, uint32_t layer) const {
        auto it = seqs.find(seq);
        return it == seqs.end() ? nullptr : &it->second.layers[layer];
    }
    uint64_t row_elems() const { return static_cast<uint64_t>(cfg.n_kv_heads) * cfg.head_dim; }
    uint64_t row_elems_v() const { return static_cast<uint64_t>(cfg.n_kv_heads) * head_dim_v; }
    // fp8: the scales of one layer's KV heads; nullptr for other dtypes.
    const float* k_scales_of(uint32_t layer) const {
        return k_scales.empty() ? nullptr : k_scales.data() + static_cast<uint64_t>(layer) * cfg.n_kv_heads;
    }
    const float* v_scales_of(uint32_t layer) const {
        return v_scales.empty() ? nullptr : v_scales.data() + static_cast<uint64_t>(layer) * cfg.n_kv_heads;
    }
    // What the shared argument checks (abi_checks.hpp) read of this engine.
    CacheView view() const {
        return CacheView{&cfg, max_tokens,
                         [this](uint32_t seq, uint32_t layer) -> uint64_t {
                             const Stream* s = find(seq, layer);
                             return s ? s->length : 0;
                         },
                         [this](uint32_t seq) { return seqs.count(seq) != 0; }};
    }
    // KVC_ERR_EVICTED for a read of rows pos .. pos + n - 1 of s that include freed ones.
    kvc_status evicted(const char* op, uint32_t seq, uint32_t layer, uint64_t pos, uint64_t n, const Stream& s);
    // fail() with a refusal's status and message.
    kvc_status fail(const Refusal& r) { return fail(r.status, "%s", r.message); }

    // One call's new tokens for one stream (append.cpp).
    struct Pending {
        Stream* stream = nullptr;
        uint32_t layer = 0;
        uint32_t n = 0;
        const float* k = nullptr; // [n][n_kv_heads][head_dim]
        const float* v = nullptr; // [n][n_kv_heads][head_dim_v]
    };
    // Blocks an append of n tokens to s takes from the pool: new blocks, plus a copy of a shared partial last block.
    uint64_t blocks_needed(const Stream& s, uint32_t n) const;
    // Makes room in s's table without taking blocks (may throw std::bad_alloc; changes nothing visible).
    void reserve_table(Stream& s, uint32_t n) const;
    // Copies a shared partial last block, takes the new blocks (after pool.reserve), writes the rows, seals every
    // block it fills and advances length. Cannot fail.
    void write(const Pending& p);

    uint32_t window_of(uint32_t layer) const { return windows.empty() ? 0 : windows[layer]; }
    // Evicting caches: frees the blocks of s whose every row is dead, i.e. outside the window of every later query
    // of the layer (rows j with n_sinks <= j <= length - W), after the sinks' blocks. Cannot fail.
    void evict_dead(Stream& s, uint32_t layer);
    // Whether rows pos .. pos + n - 1 of s include one in a freed block.
    bool holds_dropped(const Stream& s, uint64_t pos, uint64_t n) const;

    // Moves the blocks of the emptiest slabs into the others' free blocks and returns the emptied slabs to malloc,
    // when enough free blocks have piled up (compact.cpp). Cannot fail: it uses free blocks only.
    void compact();

    // The whole of append_attend / append_attend_batch / append once the call is known valid.
    kvc_status run(uint32_t layer, uint32_t n_seqs, const uint32_t* seq_ids, const uint32_t* offsets, const float* q,
                   const float* k, const float* v, float* out, bool attend);
};

} // namespace kvc::opt
