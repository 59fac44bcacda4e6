// The engine's outputs against kvc::ref::attend_heads<long double> on the same history (K/V rounded to the cache
// dtype first), within the tolerance of engine_test_util.hpp: every dtype and RoPE variant, GQA and MQA groups that
// are not powers of two, block sizes 1, 3, 7, 16, lengths on both sides of block, split and segment boundaries,
// decode, prefill, chunked prefill and batches.
#include "engine_test_util.hpp"

#include <tuple>

namespace kvc::test {
namespace {

// Appends chunk after chunk to sequence 0 of layer 0; every call's output is checked against the oracle. A chunk
// given as -n is appended without attention (Engine::append), to reach long lengths cheaply.
void drive(const kvc_config& c, const std::vector<int>& chunks, uint64_t seed, const opt::EngineOptions& o = {}) {
    auto e = make_engine(c, o);
    ASSERT_TRUE(e);
    Rng rng(seed);
    History h(c);
    const size_t qrow = static_cast<size_t>(c.n_q_heads) * c.head_dim, kvrow = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
    for (int chunk : chunks) {
        const auto n = static_cast<uint32_t>(std::abs(chunk));
        const auto q = rng.normal(n * qrow), k = rng.normal(n * kvrow), v = rng.normal(n * kvrow);
        if (chunk < 0) {
            ASSERT_EQ(e->append(0, 0, n, k.data(), v.data()), KVC_OK) << e->last_error();
            h.add(k, v);
            continue;
        }
        std::vector<float> out(n * qrow, -7.0f);
        ASSERT_EQ(e->append_attend(0, 0, n, q.data(), k.data(), v.data(), out.data()), KVC_OK) << e->last_error();
        h.add(k, v);
        expect_close(out, oracle(h, q), "after " + std::to_string(h.len) + " tokens (chunk of " + std::to_string(n) + ")");
        if (::testing::Test::HasFailure()) return;
    }
}

// Chunks whose running length passes k*B - 1, k*B, k*B + 1 for k = 1..rounds: a prefill to B - 1, then decode
// steps and small chunks around every boundary (bug class 1).
std::vector<int> around_blocks(uint32_t B, uint32_t rounds) {
    std::vector<int> chunks;
    uint32_t len = 0;
    for (uint32_t k = 1; k <= rounds; ++k)
        for (uint32_t target : {k * B - 1, k * B, k * B + 1})
            if (target > len) {
                chunks.push_back(static_cast<int>(target - len));
                len = target;
            }
    return chunks;
}

using GeomParam = std::tuple<uint32_t /*block*/, std::pair<uint32_t, uint32_t> /*heads*/>;
class Geometry : public ::testing::TestWithParam<GeomParam> {};

TEST_P(Geometry, MatchesReferenceAroundBlockBoundaries) {
    const auto [block, heads] = GetParam();
    const kvc_config c = make_config(heads.first, heads.second, 16, KVC_DTYPE_F16, block, KVC_ROPE_NEOX);
    drive(c, around_blocks(block, block == 1 ? 6 : 4), test_seed(1000 + block * 10 + heads.first));
}

INSTANTIATE_TEST_SUITE_P(Blocks, Geometry,
                         ::testing::Combine(::testing::Values(1u, 3u, 7u, 16u),
                                            ::testing::Values(std::make_pair(1u, 1u), std::make_pair(6u, 2u),
                                                              std::make_pair(5u, 1u), std::make_pair(8u, 8u),
                                                              std::make_pair(16u, 2u))),
                         [](const auto& info) {
                             return "B" + std::to_string(std::get<0>(info.param)) + "_q" +
                                    std::to_string(std::get<1>(info.param).first) + "kv" +
                                    std::to_string(std::get<1>(info.param).second);
                         });

using DtypeRopeParam = std::tuple<uint32_t /*dtype*/, uint32_t /*rope*/>;
class DtypeRope : public ::testing::TestWithParam<DtypeRopeParam> {};

TEST_P(DtypeRope, PrefillChunksAndDecodeMatchReference) {
    const auto [dtype, rope] = GetParam();
    const kvc_config c = make_config(6, 2, 12, dtype, 7, rope);
    // prefill, decode steps, chunks of both plans (<= 4 new tokens spread, more tiled), a length of 0 mod 7
    drive(c, {20, 1, 1, 3, 17, 1, 4, 5, 2, 300, 1}, test_seed(2000 + dtype * 10 + rope));
}

TEST_P(DtypeRope, PortableKernelsMatchReference) {
    const auto [dtype, rope] = GetParam();
    const kvc_config c = make_config(6, 2, 12, dtype, 7, rope);
    opt::EngineOptions o;
    o.simd = false;
    drive(c, {20, 1, 1, 3, 17, 1, 300, 1}, test_seed(3000 + dtype * 10 + rope), o);
}

INSTANTIATE_TEST_SUITE_P(All, DtypeRope,
                         ::testing::Combine(::testing::Values(uint32_t(KVC_DTYPE_F32), uint32_t(KVC_DTYPE_F16),
                                                              uint32_t(KVC_DTYPE_BF16)),
                                            ::testing::Values(uint32_t(KVC_ROPE_NONE), uint32_t(KVC_ROPE_NEOX),
                                                              uint32_t(KVC_ROPE_GPTJ))),
                         [](const auto& info) {
                             return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                    rope_name(std::get<1>(info.param));
                         });

class HeadDim : public ::testing::TestWithParam<uint32_t> {};

TEST_P(HeadDim, MatchesReference) {
    const uint32_t d = GetParam();
    const kvc_config c = make_config(3, 1, d, KVC_DTYPE_F32, 16, d % 2 == 0 ? KVC_ROPE_GPTJ : KVC_ROPE_NONE);
    drive(c, {9, 1, 30, 1}, test_seed(4000 + d));
}

INSTANTIATE_TEST_SUITE_P(Sizes, HeadDim, ::testing::Values(1u, 2u, 5u, 8u, 12u, 64u, 128u, 256u));

// Past the split (256 keys) and segment (1024 keys) boundaries, decode and prefill, several segments spread over
// the threads.
TEST(LongContext, SplitAndSegmentBoundaries) {
    const kvc_config c = make_config(4, 1, 32, KVC_DTYPE_F16, 16, KVC_ROPE_NEOX);
    drive(c, {255, 1, 1, 200, -500, 20, 44, 1, 1, 1, 1, -1000, 30, 1, 1, 1, 3, 9}, test_seed(5000));
}

// Several sequences of different lengths in one append_attend_batch, some with no new token: each one's outputs
// equal the oracle of its own history (bug class 11).
TEST(Batch, EachSequenceMatchesItsOwnReference) {
    const uint64_t seed = test_seed(6000);
    const kvc_config c = make_config(6, 2, 8, KVC_DTYPE_BF16, 3, KVC_ROPE_NEOX);
    auto e = make_engine(c);
    Rng rng(seed);
    const size_t qrow = 6 * 8, kvrow = 2 * 8;
    const std::vector<uint32_t> ids = {5, 0, 3, 7};
    std::vector<History> hist(4, History(c));
    const std::vector<std::vector<uint32_t>> rounds = {{7, 1, 12, 3}, {1, 0, 1, 1}, {1, 1, 0, 40}, {1, 5, 1, 1}};
    for (const auto& counts : rounds) {
        std::vector<uint32_t> offsets = {0};
        for (uint32_t n : counts) offsets.push_back(offsets.back() + n);
        const uint32_t total = offsets.back();
        const auto q = rng.normal(total * qrow), k = rng.normal(total * kvrow), v = rng.normal(total * kvrow);
        std::vector<float> out(total * qrow, -7.0f);
        kvc_batch b{};
        b.struct_size = sizeof b;
        b.n_seqs = 4;
        b.seq_ids = ids.data();
        b.token_offsets = offsets.data();
        b.q = q.data();
        b.k = k.data();
        b.v = v.data();
        b.out = out.data();
        ASSERT_EQ(e->append_attend_batch(0, &b), KVC_OK) << e->last_error();
        for (size_t i = 0; i < 4; ++i) {
            if (counts[i] == 0) continue;
            const size_t a = offsets[i], z = offsets[i + 1];
            hist[i].add(std::vector<float>(k.begin() + a * kvrow, k.begin() + z * kvrow),
                        std::vector<float>(v.begin() + a * kvrow, v.begin() + z * kvrow));
            const std::vector<float> qi(q.begin() + a * qrow, q.begin() + z * qrow);
            expect_close(std::vector<float>(out.begin() + a * qrow, out.begin() + z * qrow), oracle(hist[i], qi),
                         "sequence " + std::to_string(ids[i]));
        }
    }
}

// Layers are separate streams: the same sequence holds different lengths per layer, and RoPE positions come from
// each layer's own length (bug class 5: a position counter advanced once per layer).
TEST(Layers, EachLayerIsItsOwnStream) {
    const uint64_t seed = test_seed(7000);
    const kvc_config c = make_config(2, 2, 8, KVC_DTYPE_F32, 4, KVC_ROPE_NEOX, 3);
    auto e = make_engine(c);
    Rng rng(seed);
    std::vector<History> hist(3, History(c));
    const std::vector<std::pair<uint32_t, uint32_t>> calls = {{0, 5}, {2, 1}, {0, 1}, {1, 9}, {2, 6}, {0, 1}, {1, 1}};
    for (auto [layer, n] : calls) {
        const auto q = rng.normal(n * 16), k = rng.normal(n * 16), v = rng.normal(n * 16);
        std::vector<float> out(n * 16);
        ASSERT_EQ(e->append_attend(0, layer, n, q.data(), k.data(), v.data(), out.data()), KVC_OK);
        hist[layer].add(k, v);
        expect_close(out, oracle(hist[layer], q), "layer " + std::to_string(layer));
        uint32_t len = 0;
        ASSERT_EQ(e->seq_length(0, layer, &len), KVC_OK);
        EXPECT_EQ(len, hist[layer].len);
    }
}

} // namespace
} // namespace kvc::test
