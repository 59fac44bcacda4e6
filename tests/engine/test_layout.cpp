// The paged layout: its strides, its one addressing function, 64-bit offsets, and (in C) that it is plain C.
#include "kvcheck/optimized/kv_layout.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

extern "C" int kvc_layout_c_check(void);

namespace {

TEST(Layout, StridesOfHeadMajorPlanes) {
    const kvc_kv_layout l = kvc_kv_layout_make(7, 3, 12, 2);
    EXPECT_EQ(l.row_bytes, 12u * 2);
    EXPECT_EQ(l.head_bytes, 7u * 12 * 2);
    EXPECT_EQ(l.plane_bytes, 3u * 7 * 12 * 2);
    EXPECT_EQ(kvc_kv_block_bytes(&l), 2u * 3 * 7 * 12 * 2);
}

// Every (pos, plane, head, dim) of a stream maps to its own byte inside the block its table names, and nothing
// maps outside: a bijection onto the blocks' bytes, for block sizes that are 1, prime and a power of two.
TEST(Layout, AddressesAreABijectionOntoTheTableBlocks) {
    for (uint32_t B : {1u, 3u, 7u, 16u}) {
        const uint32_t H = 2, d = 5, es = 4, n_blocks = 4;
        kvc_kv_layout l = kvc_kv_layout_make(B, H, d, es);
        std::vector<std::vector<uint8_t>> storage(6, std::vector<uint8_t>(kvc_kv_block_bytes(&l)));
        std::vector<uint8_t*> bases;
        for (auto& s : storage) bases.push_back(s.data());
        l.block_base = bases.data();
        const uint32_t table[n_blocks] = {4, 0, 5, 2}; // any ids, in any order
        std::set<const uint8_t*> seen;
        for (uint64_t pos = 0; pos < uint64_t(n_blocks) * B; ++pos)
            for (uint32_t plane = 0; plane < 2; ++plane)
                for (uint32_t h = 0; h < H; ++h)
                    for (uint32_t i = 0; i < d; ++i) {
                        const uint8_t* a = kvc_kv_address(&l, table, pos, plane, h, i);
                        const uint8_t* block = bases[table[pos / B]];
                        ASSERT_GE(a, block) << "B " << B << " pos " << pos;
                        ASSERT_LT(a + es - 1, block + kvc_kv_block_bytes(&l)) << "B " << B << " pos " << pos;
                        ASSERT_TRUE(seen.insert(a).second) << "two elements at one address, B " << B;
                    }
        EXPECT_EQ(seen.size(), size_t(n_blocks) * kvc_kv_block_bytes(&l) / es);
    }
}

// Bug class 15: offsets past 4 GiB inside one block (large heads, large blocks) are computed in 64 bits.
TEST(Layout, OffsetsAreSixtyFourBit) {
    const kvc_kv_layout l = kvc_kv_layout_make(65536, 1024, 256, 4); // one plane: 64 GiB
    EXPECT_EQ(l.plane_bytes, 65536ull * 1024 * 256 * 4);
    const uint64_t off = kvc_kv_block_offset(&l, 65535, KVC_PLANE_V, 1023, 255);
    EXPECT_EQ(off, 2 * l.plane_bytes - 4);
    EXPECT_GT(off, 0xffffffffull);
}

TEST(Layout, CompilesAsPlainC) { EXPECT_EQ(kvc_layout_c_check(), 0); }

} // namespace
