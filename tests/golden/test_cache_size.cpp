// The cache-size formula 2·B·L·T·H_kv·d_h·s on the documents' examples, computed here in integers.
#include "kvcheck/golden/cache_size.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using kvc::golden::CacheShape;
using kvc::golden::kv_cache_bytes;

constexpr uint64_t GiB = 1ull << 30;

TEST(CacheSize, ToyCostsSixteenNumbersPerToken) {
    EXPECT_EQ(kv_cache_bytes({"toy", 1, 2, 1, 1, 4, 1}), 16u); // 000: 2 × 1 × 4 × 2
}

TEST(CacheSize, Llama2_13bIsAbout0_8MBPerTokenAndOutweighsItsWeightsAtBatch32) {
    const uint64_t per_token = kv_cache_bytes({"l2", 1, 40, 1, 40, 128, 2});
    EXPECT_EQ(per_token, 819'200u);
    EXPECT_LE(std::fabs(per_token / 1e6 - 0.8), 0.05);
    const uint64_t batch = kv_cache_bytes({"l2b", 32, 40, 4096, 40, 128, 2});
    EXPECT_EQ(batch, 100 * GiB);
    EXPECT_GT(batch, 13'000'000'000ull * 2); // "larger than the weights themselves"
}

TEST(CacheSize, Llama3_70bIs2_5GiBPerSequenceAt8k) {
    const uint64_t bytes = kv_cache_bytes({"l3", 1, 80, 8192, 8, 128, 2});
    EXPECT_EQ(bytes, 2'684'354'560u);
    EXPECT_EQ(bytes * 2, 5 * GiB);                          // 2.5 GiB exactly
    EXPECT_GT(std::fabs(bytes / 1e9 - 2.5), 0.05);          // not 2.5 in decimal GB: the unit inconsistency
    EXPECT_EQ(70'000'000'000ull * 2, 140'000'000'000ull);   // "weights are 140 GB"
}

TEST(CacheSize, Chapter3ExampleIsExactly4GiB) {
    EXPECT_EQ(kv_cache_bytes({"c3", 1, 32, 8192, 32, 128, 2}), 4'294'967'296u);
    EXPECT_EQ(kv_cache_bytes({"c3", 1, 32, 8192, 32, 128, 2}), 4 * GiB);
}

TEST(CacheSize, TheDocumentCachesAreTheOnesTestedHere) {
    const auto& caches = kvc::golden::document_caches();
    ASSERT_EQ(caches.size(), 4u);
    EXPECT_EQ(kv_cache_bytes(caches[0]), 819'200u);
    EXPECT_EQ(kv_cache_bytes(caches[1]), 100 * GiB);
    EXPECT_EQ(kv_cache_bytes(caches[2]), 2'684'354'560u);
    EXPECT_EQ(kv_cache_bytes(caches[3]), 4 * GiB);
}

} // namespace
