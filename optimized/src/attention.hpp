// Attention over the paged cache for every new token of a call: decode (one new token per sequence), prefill and
// chunked prefill are the same computation, planned differently.
//
// The fixed reduction structure (docs/engine.md): the keys a query row sees are cut at absolute positions into
// splits of kSplitKeys and segments of kSegmentSplits splits. A row's result is
//     normalize( fold_merge over segments ( fold_merge over the segment's splits ( exact state of the split ) ) )
// with folds left to right starting from the empty state. Only positions decide this structure, never the batch,
// the chunking of the prompt or the number of threads, so a row's output is bitwise reproducible.
//
// Two plans compute exactly that:
//  - spread  (few new tokens: decode): one work item per (stream, group of KV heads, segment) writes segment states
//    to scratch; the item that finishes a (stream, group)'s segments last then folds them per row. Long contexts
//    keep every core busy even for one sequence (split-KV), a group walks each block's heads together while the
//    block is hot, and a call costs one dispatch of the thread pool, not two (one sequence x 512 tokens on two
//    cores, 0.3 ms a step: 29-30 -> 35-37 GB/s).
//  - tiled   (many new tokens: prefill): one work item per (stream, KV head, tile of 8 rows) folds its segments
//    itself. Scratch stays small however long the prompt.
#pragma once

#include "attention_kernel.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvc::opt {

// One (sequence, layer) stream's part of a call. Its new tokens are already in the cache.
struct StreamCall {
    const uint32_t* table = nullptr; // block table, covering len_before + n_new tokens
    uint32_t len_before = 0;         // tokens cached before this call
    uint32_t n_new = 0;              // new tokens (> 0)
    const float* q = nullptr;        // [n_new][n_q_heads][padded_dim]: rotated queries, zero padding
    float* out = nullptr;            // [n_new][n_q_heads][head_dim_v]
};

struct AttentionShape {
    const kvc_kv_layout* layout = nullptr;   // K rows (and V rows when v_layout is null)
    const kvc_kv_layout* v_layout = nullptr; // V rows of head_dim_v != head_dim (SplitArgs::v_layout)
    uint32_t n_q_heads = 0;
    uint32_t n_kv_heads = 0;
    float scale = 1.0f;
    const float* k_scales = nullptr; // fp8: the scale of each KV head of the layer (SplitArgs)
    const float* v_scales = nullptr;
    SplitKernel kernel = nullptr;
    unsigned max_threads = 0; // 0: every core
    bool group_heads = true;  // false: one KV head per spread item and kernel call
    // The layer's sliding window (0: none) and the sinks that stay visible beside it (ignored without a window):
    // the query at position i sees key j <= i iff window == 0, j < sinks or i - j < window.
    uint32_t window = 0;
    uint32_t sinks = 0;
};

class AttentionPlan {
public:
    // Plans the work and allocates its scratch (may throw std::bad_alloc); touches neither the cache nor out.
    void build(const AttentionShape& shape, const StreamCall* streams, size_t n_streams);
    // Computes every stream's out. Allocates nothing, cannot fail.
    void run();

private:
    struct Item {
        uint32_t stream;
        uint32_t kv_head; // the first of n_heads consecutive KV heads
        uint32_t n_heads;
        uint32_t index;   // the stream's i-th segment it sees (spread: StreamPlan::segment) or tile (tiled)
        bool spread;
        uint32_t fold_group; // spread: the (stream, KV heads) whose segments this item counts down
    };
    // The segments some row of a stream sees: [0, sink_segments) and [window_segment, window_segment + segments -
    // sink_segments), numbered 0 .. segments - 1 in key order (without a window: all of them, 0 .. segments - 1).
    // A segment no row sees would only add empty states, which change nothing: it is not planned at all.
    struct StreamPlan {
        bool spread = false;
        uint32_t rows = 0;           // n_new * group
        uint32_t segments = 0;       // segments some row sees
        uint32_t sink_segments = 0;  // of which the first ones, holding sinks before the windows
        uint32_t window_segment = 0; // the segment of the sink_segments-th
        size_t state_base = 0;       // first state of this stream in the scratch (spread)
        uint32_t segment(uint32_t i) const { return i < sink_segments ? i : window_segment + (i - sink_segments); }
    };

    static void run_item(void* self, size_t i);
    void spread_item(const Item& it);
    void tiled_item(const Item& it);
    void fold_rows(uint32_t stream, uint32_t kv_head);
    RowTile tile_of(uint32_t stream, uint32_t kv_head, uint32_t first_row, uint32_t n_rows) const;

    AttentionShape shape_{};
    const StreamCall* streams_ = nullptr;
    size_t n_streams_ = 0;
    uint32_t group_ = 1;
    uint32_t dq_ = 0;  // q rows: head_dim padded
    uint32_t dv_ = 0;  // V rows and outputs: head_dim_v
    uint32_t dvq_ = 0; // states' o: head_dim_v padded
    std::vector<StreamPlan> plans_;
    std::vector<Item> items_;
    // [fold group]: spread items of each (stream, group of KV heads) still running, set by build() to the stream's
    // segments. The item that takes its group's count to 0 folds the group (its acquire-release decrement orders
    // every other item's scratch writes before the fold), then sets the count back for the next run().
    std::unique_ptr<std::atomic<uint32_t>[]> pending_;
    std::vector<float> ml_;       // spread scratch: m, l of each state
    std::vector<float> o_;        // spread scratch: o of each state, dvq_ floats
    unsigned threads_ = 1;
};

} // namespace kvc::opt
