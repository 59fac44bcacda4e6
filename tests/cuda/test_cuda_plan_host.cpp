// The CUDA engine's host-side plan for windowed and latent caches, run on the CPU: the visibility rule as the
// attention kernel computes it (window_rule.hpp, tile_plan.hpp) against the reference's mask, which splits and
// segments a tile may skip, which blocks eviction frees (the rule the CPU engine shares), and the V plane of a block
// whose V rows have their own width. Built with g++ only, so CI runs it without a GPU.
#include "kvcheck/abi.h"
#include "kvcheck/optimized/kv_layout.h"
#include "kvcheck/optimized/quant_math.hpp"
#include "kvcheck/optimized/window_rule.hpp"
#include "tile_plan.hpp" // optimized/cuda

#include "kvcheck/reference/attention.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

using kvc::cuda::kSegmentKeys;
namespace o = kvc::opt;

const uint32_t kWindows[] = {0, 1, 2, 3, 7, 8, 9, 16, 17, 64};
const uint32_t kSinks[] = {0, 1, 2, 4, 16, 17};

TEST(CudaWindowRule, KeyVisibleIsTheReferenceMask) {
    for (uint32_t w : kWindows)
        for (uint32_t s : kSinks) {
            const kvc::ref::Visibility vis{static_cast<long>(w), static_cast<long>(s)};
            for (uint64_t i = 0; i < 120; ++i)
                for (uint64_t j = 0; j < 130; ++j)
                    ASSERT_EQ(o::key_visible(i, j, w, s), vis.sees(static_cast<long>(i), static_cast<long>(j)))
                        << "W " << w << " S " << s << " query " << i << " key " << j;
        }
}

// The worked example of docs/windowed-caches.md: the query at 5 with W = 2 and one sink sees 0, 4 and 5.
TEST(CudaWindowRule, TheWorkedExampleSeesTheSinkAndTheLastTwoKeys) {
    std::vector<uint64_t> seen;
    for (uint64_t j = 0; j < 8; ++j)
        if (o::key_visible(5, j, 2, 1)) seen.push_back(j);
    EXPECT_EQ(seen, (std::vector<uint64_t>{0, 4, 5}));
    EXPECT_EQ(o::window_begin(5, 2), 4u);
    EXPECT_EQ(o::window_begin(0, 16), 0u);
    EXPECT_EQ(o::window_begin(100, 0), 0u);
}

// range_seen is what a tile skips on: it must say "seen" exactly when some query of the run sees some key of the
// range (a false "unseen" drops keys from a row's softmax; a false "seen" loads evicted blocks).
TEST(CudaWindowRule, RangeSeenIsTheUnionOfTheQueriesMasks) {
    for (uint32_t w : kWindows)
        for (uint32_t s : kSinks)
            for (uint64_t first = 0; first < 40; first += 3)
                for (uint64_t last = first; last < first + 20; last += 4)
                    for (uint64_t a = 0; a < 64; a += 2)
                        for (uint64_t b = a; b < a + 24; b += 5) {
                            bool any = false;
                            for (uint64_t i = first; i <= last && !any; ++i)
                                for (uint64_t j = a; j < b && !any; ++j) any = o::key_visible(i, j, w, s);
                            ASSERT_EQ(o::range_seen(a, b, first, last, w, s), any)
                                << "W " << w << " S " << s << " queries " << first << ".." << last << " keys [" << a
                                << ", " << b << ")";
                        }
}

// A decode with a window visits the sinks' segment and the segments its window reaches, whatever the length.
TEST(CudaTilePlan, SegmentsSeenAreThoseWithAVisibleKeyAndFollowSinksPlusWindow) {
    std::vector<uint32_t> seen;
    const struct {
        uint64_t len;
        uint32_t window, sinks;
    } cases[] = {{0, 0, 0}, {5000, 0, 0}, {5000, 16, 0}, {5000, 16, 4}, {5000, 1024, 4}, {5000, 1025, 0},
                 {5000, 3000, 1030}, {100000, 64, 2}, {1023, 1, 0}, {1024, 1, 1}, {4095, 2048, 1}};
    for (const auto& c : cases)
        for (uint32_t group : {1u, 4u})
            for (uint32_t rows : {1u, 3u, 8u, 16u}) {
                kvc::cuda::segments_seen(c.len, 0, rows, group, c.window, c.sinks, seen);
                const uint64_t first = c.len, last = c.len + (rows - 1) / group;
                std::vector<uint32_t> want;
                for (uint64_t sg = 0; sg * kSegmentKeys <= last; ++sg) {
                    bool any = false;
                    for (uint64_t i = first; i <= last && !any; ++i)
                        for (uint64_t j = sg * kSegmentKeys; j < (sg + 1) * kSegmentKeys && j <= last && !any; ++j)
                            any = o::key_visible(i, j, c.window, c.sinks);
                    if (any) want.push_back(static_cast<uint32_t>(sg));
                }
                ASSERT_EQ(seen, want) << "len " << c.len << " W " << c.window << " S " << c.sinks << " rows " << rows
                                      << " group " << group;
                ASSERT_FALSE(seen.empty());
                if (c.window != 0 && c.window + c.sinks < kSegmentKeys) { // sinks' segment and at most two more
                    EXPECT_LE(seen.size(), 3u) << "len " << c.len << " W " << c.window;
                }
            }
}

// Every head size the engine accepts, K and V apart (MLA: 576 and 512), fits the tile it is planned with.
TEST(CudaTilePlan, EveryAcceptedHeadSizeFitsSharedMemory) {
    using namespace kvc::cuda;
    for (uint32_t dk = 1; dk <= kMaxHeadDim; ++dk)
        for (uint32_t dv = 1; dv <= kMaxHeadDim; ++dv) {
            const uint64_t bytes = attention_shared_bytes(dk, dv, tile_rows(dk, dv));
            ASSERT_LE(bytes, attention_shared_bytes_max()) << dk << " " << dv;
            ASSERT_LE(bytes, kSharedLimit) << dk << " " << dv;
        }
    EXPECT_EQ(tile_rows(128, 128), kTileRows);
    EXPECT_EQ(tile_rows(576, 512), kWideTileRows);
    // 16 rows of 576-dim heads would not fit: the reason wide heads take 8
    EXPECT_GT(attention_shared_bytes(kMaxHeadDim, kMaxHeadDim, kTileRows), kSharedLimit);
}

// A stream that grows by random chunks, evicting after each call as both engines do: every freed block holds only
// rows no later query sees (none of the sinks), every block that does is freed (the MEMORY bound), and
// range_holds_dropped answers read_kv exactly.
TEST(CudaEviction, FreesExactlyTheBlocksNoLaterQuerySees) {
    std::mt19937_64 rng(20261207);
    for (uint32_t w : {1u, 2u, 7u, 8u, 16u, 33u})
        for (uint32_t s : {0u, 1u, 4u, 17u})
            for (uint32_t bs : {1u, 4u, 8u, 16u}) {
                std::vector<uint32_t> table;
                std::vector<uint32_t> freed_ids;
                uint32_t dropped = 0, next_id = 0;
                uint64_t length = 0;
                const uint32_t first = o::sink_blocks(s, bs);
                while (length < 300) {
                    const uint64_t n = 1 + rng() % 40;
                    length += n;
                    while (table.size() * bs < length) table.push_back(next_id++);
                    o::evict_dead_blocks(table.data(), &dropped, length, w, bs, first,
                                         [&](uint32_t id) { freed_ids.push_back(id); });
                    ASSERT_EQ(freed_ids.size(), dropped);
                    for (uint64_t b = 0; b < table.size(); ++b) {
                        const bool is_dropped = table[b] == o::kDroppedBlock;
                        ASSERT_EQ(is_dropped, b >= first && b < first + dropped) << "block " << b;
                        // dead: no row of the block is seen by any later query (the next W + B ones decide it)
                        bool dead = true;
                        for (uint64_t j = b * bs; j < std::min<uint64_t>((b + 1) * bs, length) && dead; ++j)
                            for (uint64_t i = length; i < length + w + bs && dead; ++i)
                                dead = !o::key_visible(i, j, w, s);
                        const bool full = (b + 1) * bs <= length;
                        if (is_dropped) {
                            ASSERT_TRUE(dead && full) << "a row a later query sees was freed: block " << b;
                        } else {
                            ASSERT_FALSE(dead && full && b >= first) << "a dead block was kept: block " << b;
                        }
                    }
                    for (uint64_t pos = 0; pos < length; pos += 1 + rng() % 5) {
                        const uint64_t cnt = rng() % (length - pos + 1);
                        bool any = false;
                        for (uint64_t r = pos; r < pos + cnt; ++r) any = any || table[r / bs] == o::kDroppedBlock;
                        ASSERT_EQ(o::range_holds_dropped(pos, cnt, bs, first, dropped), any) << pos << " " << cnt;
                    }
                }
                for (size_t i = 0; i < freed_ids.size(); ++i) ASSERT_EQ(freed_ids[i], first + i); // in order, once
            }
}

TEST(CudaEviction, NothingIsFreedWithoutAWindowOrBeforeTheWindowFills) {
    std::vector<uint32_t> table(10);
    for (uint32_t i = 0; i < 10; ++i) table[i] = i;
    uint32_t dropped = 0;
    o::evict_dead_blocks(table.data(), &dropped, 160, 0, 16, 0, [](uint32_t) { FAIL() << "no window: nothing dies"; });
    o::evict_dead_blocks(table.data(), &dropped, 15, 16, 16, 0, [](uint32_t) { FAIL() << "the window is not full"; });
    EXPECT_EQ(dropped, 0u);
    // at 32 rows with W 16 the next query (32) sees 17..32: rows 0..16 are dead, so block 0 (rows 0..15) goes
    o::evict_dead_blocks(table.data(), &dropped, 32, 16, 16, 0, [](uint32_t id) { EXPECT_EQ(id, 0u); });
    EXPECT_EQ(dropped, 1u);
    EXPECT_EQ(table[0], o::kDroppedBlock);
    EXPECT_EQ(table[1], 1u);
}

// Every byte of a block whose V rows have their own width belongs to exactly one element (or scale) of one K or V
// row, the V plane right after the K plane: MLA's 576 / 512, with and without row scales.
TEST(CudaLayout, SeparateVRowsTileTheBlockExactly) {
    namespace m = kvc::opt::math;
    const struct {
        uint32_t dk, dv, heads, bs, dtype;
    } cases[] = {{576, 512, 1, 4, KVC_DTYPE_F16}, {576, 512, 1, 3, KVC_DTYPE_Q8_0}, {64, 32, 2, 5, KVC_DTYPE_F32},
                 {96, 128, 3, 2, KVC_DTYPE_INT8_TOKEN}, {40, 40, 2, 3, KVC_DTYPE_BF16}};
    for (const auto& c : cases) {
        const uint32_t es = c.dtype == KVC_DTYPE_F32 ? 4 : c.dtype <= KVC_DTYPE_BF16 ? 2 : 1;
        const kvc_kv_layout k = kvc_kv_layout_make_scaled(c.bs, c.heads, c.dk, es, m::row_scale_bytes(c.dtype, c.dk, false));
        const kvc_kv_layout v = kvc_kv_layout_make_v(&k, c.dv, m::row_scale_bytes(c.dtype, c.dv, false));
        const uint64_t bytes = kvc_kv_block_bytes_kv(&k, &v);
        EXPECT_EQ(bytes, uint64_t{c.heads} * c.bs * (k.row_bytes + v.row_bytes));
        if (c.dk == c.dv) {
            EXPECT_EQ(bytes, kvc_kv_block_bytes(&k));
        }
        std::vector<int> owner(bytes, 0);
        for (uint32_t p = 0; p < 2; ++p) {
            const kvc_kv_layout& l = p == 0 ? k : v;
            for (uint32_t slot = 0; slot < c.bs; ++slot)
                for (uint32_t h = 0; h < c.heads; ++h) {
                    const uint64_t row = kvc_kv_block_offset(&l, slot, p, h, 0);
                    ASSERT_EQ(kvc_kv_block_offset(&l, slot, p, h, 1) - row, es);
                    for (uint64_t x = 0; x < l.row_bytes; ++x) ++owner.at(row + x);
                    if (p == 1) {
                        ASSERT_GE(row, k.plane_bytes) << "a V row inside the K plane";
                    }
                }
        }
        for (uint64_t x = 0; x < bytes; ++x) ASSERT_EQ(owner[x], 1) << "byte " << x << " of dk " << c.dk;
    }
}

} // namespace
