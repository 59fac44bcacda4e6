#include "attention.hpp"

#include "split_view.hpp"
#include "thread_pool.hpp"

#include <algorithm>

namespace kvc::opt {
namespace {

constexpr uint32_t kDecodeMaxNew = 4;                      // a stream of at most this many new tokens: a decode (spread)
constexpr size_t kSpreadMaxScratchFloats = size_t(64) << 20; // 256 MiB of segment states at most, else tiled
constexpr uint64_t kParallelMinBytes = 2 << 20;           // below this much K/V to read (~0.15 ms on one core),
                                                          // waking a worker costs more than it saves

uint32_t ceil_div(uint64_t a, uint64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

// The first key the query at position i sees apart from the sinks (its window's start; 0 without a window).
uint32_t window_from(uint64_t i, uint32_t window) {
    return window != 0 && i + 1 > window ? static_cast<uint32_t>(i + 1 - window) : 0;
}

} // namespace

void AttentionPlan::build(const AttentionShape& shape, const StreamCall* streams, size_t n_streams) {
    shape_ = shape;
    streams_ = streams;
    n_streams_ = n_streams;
    group_ = shape.n_q_heads / shape.n_kv_heads;
    dq_ = padded_dim(shape.layout->head_dim);
    dv_ = shape.v_layout ? shape.v_layout->head_dim : shape.layout->head_dim;
    dvq_ = padded_dim(dv_);
    plans_.assign(n_streams, StreamPlan{});
    items_.clear();

    size_t states = 0;
    uint64_t bytes_to_read = 0;
    for (size_t s = 0; s < n_streams; ++s) {
        const StreamCall& sc = streams[s];
        StreamPlan& p = plans_[s];
        p.rows = sc.n_new * group_;
        // The keys some row sees: [0, sink_end) and [from, len) (the first row's window reaches back the least).
        const uint64_t len = static_cast<uint64_t>(sc.len_before) + sc.n_new;
        const uint32_t from = window_from(sc.len_before, shape.window);
        const uint64_t sink_end = shape.window ? std::min<uint64_t>(shape.sinks, len) : 0;
        const uint32_t all = ceil_div(len, kSegmentKeys);
        p.sink_segments = ceil_div(sink_end, kSegmentKeys);
        p.window_segment = from / kSegmentKeys;
        if (p.sink_segments >= p.window_segment) p.sink_segments = p.window_segment = 0; // one run: all of them
        p.segments = p.sink_segments + (all - p.window_segment);
        const uint64_t keys = std::min<uint64_t>(len, sink_end + (len - from));
        const size_t need = static_cast<size_t>(shape.n_kv_heads) * p.rows * p.segments;
        p.spread = sc.n_new <= kDecodeMaxNew && (states + need) * (dvq_ + 2) <= kSpreadMaxScratchFloats;
        const uint64_t v_row_bytes = shape.v_layout ? shape.v_layout->row_bytes : shape.layout->row_bytes;
        bytes_to_read += keys * (shape.layout->row_bytes + v_row_bytes) * shape.n_kv_heads *
                         (p.spread ? 1 : ceil_div(p.rows, kTileRows));
        if (p.spread) {
            p.state_base = states;
            states += need;
        }
    }
    ml_.resize(states * 2);
    o_.resize(states * dvq_);

    threads_ = bytes_to_read < kParallelMinBytes ? 1 : shape.max_threads;
    // Spread items take groups of KV heads: as many as fit in one kernel call, halved while there would be fewer
    // than 4 items per thread (a single short sequence still spreads over every core). Results do not depend on
    // the grouping: a row's operations are the same in any group.
    const unsigned threads = threads_ == 1 ? 1 : ThreadPool::instance().concurrency();
    uint32_t widest = 1; // the widest tile of any spread stream bounds the heads of one kernel call
    uint64_t segments = 0;
    for (const StreamPlan& p : plans_)
        if (p.spread) {
            widest = std::max(widest, std::min<uint32_t>(p.rows, kTileRows));
            segments += p.segments;
        }
    uint32_t group_heads = shape.group_heads ? std::min(shape.n_kv_heads, max_call_heads(static_cast<int>(widest))) : 1;
    while (group_heads > 1 && segments * ceil_div(shape.n_kv_heads, group_heads) < 4ull * threads)
        group_heads = (group_heads + 1) / 2;
    size_t fold_groups = 0;
    for (const StreamPlan& p : plans_)
        if (p.spread) fold_groups += ceil_div(shape.n_kv_heads, group_heads);
    pending_ = std::make_unique<std::atomic<uint32_t>[]>(fold_groups);
    uint32_t fold_group = 0;
    for (size_t s = 0; s < n_streams; ++s) {
        const StreamPlan& p = plans_[s];
        if (p.spread) {
            for (uint32_t h = 0; h < shape.n_kv_heads; h += group_heads) {
                const uint32_t nh = std::min(group_heads, shape.n_kv_heads - h);
                pending_[fold_group].store(p.segments, std::memory_order_relaxed);
                for (uint32_t g = 0; g < p.segments; ++g)
                    items_.push_back({static_cast<uint32_t>(s), h, nh, g, true, fold_group});
                ++fold_group;
            }
        } else {
            // last tiles first: under the causal mask they see the most keys, so big items start early
            for (uint32_t h = 0; h < shape.n_kv_heads; ++h)
                for (uint32_t t = ceil_div(p.rows, kTileRows); t-- > 0;)
                    items_.push_back({static_cast<uint32_t>(s), h, 1, t, false, 0});
        }
    }
}

void AttentionPlan::run() {
    // the pool's dispatch publishes the fold counts to the workers
    ThreadPool::instance().run(items_.size(), &AttentionPlan::run_item, this, threads_);
}

void AttentionPlan::run_item(void* self, size_t i) {
    auto* plan = static_cast<AttentionPlan*>(self);
    const Item& it = plan->items_[i];
    if (!it.spread) {
        plan->tiled_item(it);
        return;
    }
    plan->spread_item(it);
    // The last of the group's items folds it. Which thread that is varies; the fold reads the same states in the
    // same order whoever runs it, so the result does not.
    std::atomic<uint32_t>& pending = plan->pending_[it.fold_group];
    if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    for (uint32_t h = it.kv_head; h < it.kv_head + it.n_heads; ++h) plan->fold_rows(it.stream, h);
    pending.store(plan->plans_[it.stream].segments, std::memory_order_relaxed); // ready for another run()
}

// Row rho of (stream, KV head) is query token rho / group, query head kv_head * group + rho % group: the query
// heads of one GQA group sit next to each other, so a tile shares one read of the KV head among them.
RowTile AttentionPlan::tile_of(uint32_t stream, uint32_t kv_head, uint32_t first_row, uint32_t n_rows) const {
    const StreamCall& sc = streams_[stream];
    RowTile t;
    t.n = static_cast<int>(n_rows);
    for (uint32_t r = 0; r < n_rows; ++r) {
        const uint32_t rho = first_row + r, token = rho / group_, head = kv_head * group_ + rho % group_;
        t.q[r] = sc.q + (static_cast<size_t>(token) * shape_.n_q_heads + head) * dq_;
        t.limit[r] = sc.len_before + token + 1; // causal, bottom-right aligned: itself and everything before
        t.from[r] = window_from(uint64_t{sc.len_before} + token, shape_.window); // each row its own window
    }
    t.sinks = shape_.window ? shape_.sinks : 0;
    return t;
}

// spread: the states of one segment for every row of (stream, KV heads of the item), into the scratch. Splits
// outside, tiles inside: with more than 8 query heads per KV head, the second tile finds the split's K/V in cache.
void AttentionPlan::spread_item(const Item& it) {
    const StreamCall& sc = streams_[it.stream];
    const StreamPlan& p = plans_[it.stream];
    alignas(32) float split_o[kMaxCallRows][kMaxHeadDim];
    SoftmaxState split[kMaxCallRows * kTileRows]; // [head][row]: only the first max_call_heads(n) heads are used
    auto state_index = [&](uint32_t kv_head, uint32_t rho) {
        return p.state_base + (static_cast<size_t>(kv_head) * p.rows + rho) * p.segments + it.index;
    };
    for (uint32_t h = it.kv_head; h < it.kv_head + it.n_heads; ++h)
        for (uint32_t rho = 0; rho < p.rows; ++rho) { // every row's segment state starts empty
            SoftmaxState seg{0.0f, 0.0f, o_.data() + state_index(h, rho) * dvq_};
            state_clear(seg, static_cast<int>(dvq_));
            ml_[2 * state_index(h, rho)] = seg.m;
            ml_[2 * state_index(h, rho) + 1] = seg.l;
        }
    const uint32_t max_limit = sc.len_before + sc.n_new; // the stream's last row sees every key
    const uint32_t segment = p.segment(it.index);
    RowTile tiles[kMaxCallRows];
    for (uint32_t sp = 0; sp < kSegmentSplits; ++sp) {
        const uint32_t k0 = segment * kSegmentKeys + sp * kSplitKeys;
        if (k0 >= max_limit) break; // every later split is empty for every row
        for (uint32_t first = 0; first < p.rows; first += kTileRows) {
            const uint32_t n = std::min<uint32_t>(kTileRows, p.rows - first);
            const uint32_t per_call = max_call_heads(static_cast<int>(n));
            for (uint32_t h0 = it.kv_head; h0 < it.kv_head + it.n_heads; h0 += per_call) {
                const uint32_t nh = std::min(per_call, it.kv_head + it.n_heads - h0);
                for (uint32_t h = 0; h < nh; ++h) tiles[h] = tile_of(it.stream, h0 + h, first, n);
                if (!tile_sees(tiles[0], k0, uint64_t{k0} + kSplitKeys)) continue; // an empty split for every row
                for (uint32_t h = 0; h < nh; ++h)
                    for (uint32_t r = 0; r < n; ++r) split[h * kTileRows + r].o = split_o[h * n + r];
                const SplitArgs args{shape_.layout, sc.table,        h0, shape_.scale, shape_.k_scales, shape_.v_scales,
                                     shape_.v_layout};
                shape_.kernel(args, nh, tiles, k0, split);
                for (uint32_t h = 0; h < nh; ++h)
                    for (uint32_t r = 0; r < n; ++r) {
                        const size_t idx = state_index(h0 + h, first + r);
                        SoftmaxState seg{ml_[2 * idx], ml_[2 * idx + 1], o_.data() + idx * dvq_};
                        state_merge(seg, split[h * kTileRows + r], static_cast<int>(dvq_));
                        ml_[2 * idx] = seg.m;
                        ml_[2 * idx + 1] = seg.l;
                    }
            }
        }
    }
}

// spread, once every segment of (stream, KV head) is in: fold each row's segment states left to right, normalize
// into out.
void AttentionPlan::fold_rows(uint32_t stream, uint32_t kv_head) {
    const StreamCall& sc = streams_[stream];
    const StreamPlan& p = plans_[stream];
    const uint32_t d = dv_;
    alignas(32) float acc_o[kMaxHeadDim];
    for (uint32_t rho = 0; rho < p.rows; ++rho) {
        SoftmaxState acc{0.0f, 0.0f, acc_o};
        state_clear(acc, static_cast<int>(dvq_));
        const size_t first = p.state_base + (static_cast<size_t>(kv_head) * p.rows + rho) * p.segments;
        for (uint32_t g = 0; g < p.segments; ++g) {
            const SoftmaxState seg{ml_[2 * (first + g)], ml_[2 * (first + g) + 1], o_.data() + (first + g) * dvq_};
            state_merge(acc, seg, static_cast<int>(dvq_));
        }
        const uint32_t token = rho / group_, head = kv_head * group_ + rho % group_;
        state_normalize(acc, sc.out + (static_cast<size_t>(token) * shape_.n_q_heads + head) * d, static_cast<int>(d));
    }
}

// tiled: one tile of rows folds every segment itself, then normalizes into out.
void AttentionPlan::tiled_item(const Item& it) {
    const StreamCall& sc = streams_[it.stream];
    const StreamPlan& p = plans_[it.stream];
    const uint32_t d = dv_;
    const SplitArgs args{shape_.layout,   sc.table,        it.kv_head, shape_.scale, shape_.k_scales,
                         shape_.v_scales, shape_.v_layout};
    const uint32_t first = it.index * kTileRows, n = std::min<uint32_t>(kTileRows, p.rows - first);
    const RowTile tile = tile_of(it.stream, it.kv_head, first, n);

    alignas(32) float split_o[kTileRows][kMaxHeadDim], seg_o[kTileRows][kMaxHeadDim], acc_o[kTileRows][kMaxHeadDim];
    SoftmaxState split[kTileRows], seg[kTileRows], acc[kTileRows];
    for (uint32_t r = 0; r < n; ++r) {
        split[r].o = split_o[r];
        seg[r].o = seg_o[r];
        acc[r].o = acc_o[r];
        state_clear(acc[r], static_cast<int>(dvq_));
    }
    const uint32_t max_limit = tile.limit[n - 1];
    // Segments and splits no row of the tile sees are skipped: their states would be empty, and merging an empty
    // state changes nothing, so the bits are those of the full fold.
    for (uint32_t g = 0; g * kSegmentKeys < max_limit; ++g) {
        if (!tile_sees(tile, g * kSegmentKeys, uint64_t{g} * kSegmentKeys + kSegmentKeys)) continue;
        for (uint32_t r = 0; r < n; ++r) state_clear(seg[r], static_cast<int>(dvq_));
        for (uint32_t sp = 0; sp < kSegmentSplits; ++sp) {
            const uint32_t k0 = g * kSegmentKeys + sp * kSplitKeys;
            if (k0 >= max_limit) break;
            if (!tile_sees(tile, k0, uint64_t{k0} + kSplitKeys)) continue;
            shape_.kernel(args, 1, &tile, k0, split);
            for (uint32_t r = 0; r < n; ++r) state_merge(seg[r], split[r], static_cast<int>(dvq_));
        }
        for (uint32_t r = 0; r < n; ++r) state_merge(acc[r], seg[r], static_cast<int>(dvq_));
    }
    for (uint32_t r = 0; r < n; ++r) {
        const uint32_t rho = first + r, token = rho / group_, head = it.kv_head * group_ + rho % group_;
        state_normalize(acc[r], sc.out + (static_cast<size_t>(token) * shape_.n_q_heads + head) * d,
                        static_cast<int>(d));
    }
}

} // namespace kvc::opt
