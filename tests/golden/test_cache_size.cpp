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

// The documents' caches stored quantized, the byte counts worked out by hand: fp8 halves fp16; int8 per token adds
// 4 bytes to each 128-number row (132/128 of fp8); q8_0 adds 2 bytes per 32 numbers (136/128 of fp8).
TEST(CacheSize, QuantizedCachesOfTheDocuments) {
    const CacheShape c3{"c3", 1, 32, 8192, 32, 128, 2};
    EXPECT_EQ(kvc::golden::kv_cache_bytes_fp8(c3), 2 * GiB);
    EXPECT_EQ(kvc::golden::kv_cache_bytes_int8_token(c3), 2'214'592'512u);
    EXPECT_EQ(kvc::golden::kv_cache_bytes_q8_0(c3), 2'281'701'376u);
    const CacheShape l2{"l2", 1, 40, 1, 40, 128, 2};
    EXPECT_EQ(kvc::golden::kv_cache_bytes_fp8(l2), 409'600u); // 0.4 MB per token instead of 0.8
    const CacheShape l3{"l3", 1, 80, 8192, 8, 128, 2};
    EXPECT_EQ(kvc::golden::kv_cache_bytes_fp8(l3), 1'342'177'280u); // 1.25 GiB instead of 2.5
    EXPECT_EQ(kvc::golden::kv_cache_bytes_q8_0(l3), 1'426'063'360u);
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
