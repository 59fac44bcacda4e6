// Attention outputs and stored rows of the example plugin against the Eigen reference, over every dtype, RoPE
// variant and head grouping it declares: prefill, decode, chunked prefill, many streams at once, long positions.
#include "rig.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace kvc_example_test {
namespace {

std::vector<Shape> all_shapes() {
    std::vector<Shape> shapes;
    const std::pair<uint32_t, uint32_t> groupings[] = {{4, 4}, {4, 2}, {6, 1}}; // MHA, GQA, MQA
    for (uint32_t dtype : {KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16})
        for (uint32_t rope : {KVC_ROPE_NONE, KVC_ROPE_NEOX, KVC_ROPE_GPTJ})
            for (auto [nq, nkv] : groupings) {
                Shape s;
                s.dtype = dtype;
                s.rope = rope;
                s.n_q_heads = nq;
                s.n_kv_heads = nkv;
                s.head_dim = 8;
                shapes.push_back(s);
            }
    // Odd and tiny head dims (odd only without RoPE), and a head_dim that is not a power of two with RoPE.
    for (uint32_t dtype : {KVC_DTYPE_F32, KVC_DTYPE_BF16}) {
        Shape s;
        s.dtype = dtype;
        s.head_dim = 5;
        s.n_q_heads = 2;
        s.n_kv_heads = 1;
        shapes.push_back(s);
        s.head_dim = 1;
        shapes.push_back(s);
        s.head_dim = 6;
        s.rope = KVC_ROPE_NEOX;
        shapes.push_back(s);
        s.head_dim = 2;
        s.rope = KVC_ROPE_GPTJ;
        shapes.push_back(s);
    }
    return shapes;
}

class AttentionVsReference : public ::testing::TestWithParam<Shape> {};

// One call holding the whole prompt: query i sees rows 0..i.
TEST_P(AttentionVsReference, Prefill) {
    Rig rig(GetParam(), 11);
    rig.append_and_check(0, 0, 9);
    rig.check_readback(0, 0);
}

// A prompt, then one token per call: the new token must be rotated to (and see) position len.
TEST_P(AttentionVsReference, Decode) {
    Rig rig(GetParam(), 12);
    rig.append_and_check(0, 0, 5);
    for (int step = 0; step < 8; ++step) rig.append_and_check(0, 0, 1);
    rig.check_readback(0, 0);
}

// Decoding from an empty stream, one token at a time from the very first.
TEST_P(AttentionVsReference, DecodeFromEmpty) {
    Rig rig(GetParam(), 13);
    for (int step = 0; step < 6; ++step) rig.append_and_check(1, 1, 1);
    rig.check_readback(1, 1);
}

// Chunks of several tokens onto a non-empty stream: the mask must be bottom-right aligned with the cached rows.
TEST_P(AttentionVsReference, ChunkedPrefill) {
    Rig rig(GetParam(), 14);
    for (uint32_t n : {3u, 1u, 4u, 2u, 7u, 1u}) rig.append_and_check(0, 1, n);
    rig.check_readback(0, 1);
}

// Streams are independent: interleaved appends to several sequences and layers never see each other's rows.
TEST_P(AttentionVsReference, InterleavedSequencesAndLayers) {
    Rig rig(GetParam(), 15);
    const uint32_t pattern[][3] = {{0, 0, 4}, {1, 0, 2}, {0, 1, 3}, {3, 1, 1}, {1, 0, 1}, {0, 0, 1},
                                   {2, 1, 5}, {3, 1, 2}, {0, 1, 1}, {1, 1, 3}, {2, 0, 1}, {0, 0, 2}};
    for (const auto& p : pattern) rig.append_and_check(p[0], p[1], p[2]);
    for (uint32_t seq = 0; seq < 4; ++seq)
        for (uint32_t layer = 0; layer < 2; ++layer) rig.check_readback(seq, layer);
    rig.check_memory();
}

// Filling a stream to exactly max_tokens works; reading back every row then is exact.
TEST_P(AttentionVsReference, FillToMaxTokens) {
    Shape s = GetParam();
    s.max_tokens = 12;
    Rig rig(s, 16);
    rig.append_and_check(2, 0, 5);
    rig.append_and_check(2, 0, 6);
    rig.append_and_check(2, 0, 1);
    EXPECT_EQ(rig.cache().seq_length(2, 0), 12u);
    rig.check_readback(2, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionVsReference, ::testing::ValuesIn(all_shapes()),
                         [](const ::testing::TestParamInfo<Shape>& info) { return info.param.name(); });

// Large positions: RoPE angles of thousands of radians, and a long softmax. A non-default scale and theta too.
TEST(AttentionLongContext, PrefillThenDecodeAtLargePositions) {
    for (uint32_t rope : {KVC_ROPE_NEOX, KVC_ROPE_GPTJ}) {
        Shape s;
        s.rope = rope;
        s.dtype = KVC_DTYPE_F16;
        s.n_layers = 1;
        s.max_seqs = 1;
        s.head_dim = 16;
        s.max_tokens = 700;
        s.scale = 0.3f;
        s.theta = 500000.0f;
        SCOPED_TRACE(s.name());
        Rig rig(s, 17);
        rig.append_and_check(0, 0, 600);
        for (int i = 0; i < 4; ++i) rig.append_and_check(0, 0, 1);
        rig.append_and_check(0, 0, 30);
        rig.check_readback(0, 0);
    }
}

// Partial read-back: any window pos .. pos+n-1 equals the same rows of a full read.
TEST(ReadKv, WindowsMatchTheFullRead) {
    Shape s;
    s.dtype = KVC_DTYPE_BF16;
    s.rope = KVC_ROPE_NEOX;
    Rig rig(s, 18);
    rig.append_and_check(1, 1, 10);
    const std::size_t row = rig.model().row_elems() * rig.model().elem_bytes();
    std::vector<unsigned char> k_all(10 * row), v_all(10 * row);
    rig.cache().read_kv(1, 1, 0, 10, k_all.data(), v_all.data());
    for (uint32_t pos = 0; pos <= 10; ++pos)
        for (uint32_t n = 0; pos + n <= 10; ++n) {
            std::vector<unsigned char> k(n * row + 1), v(n * row + 1);
            rig.cache().read_kv(1, 1, pos, n, k.data(), v.data());
            ASSERT_TRUE(std::equal(k.begin(), k.begin() + long(n * row), k_all.begin() + long(pos * row)));
            ASSERT_TRUE(std::equal(v.begin(), v.begin() + long(n * row), v_all.begin() + long(pos * row)));
        }
}

// An f32 cache stores exactly what it was given when there is no rotation (no silent rounding anywhere).
TEST(ReadKv, F32WithoutRopeStoresInputsVerbatim) {
    Shape s;
    s.dtype = KVC_DTYPE_F32;
    kvc::Cache cache(example_api(), s.config());
    const std::size_t qn = 3 * 4 * 8, kn = 3 * 2 * 8;
    std::vector<float> q(qn, 0.5f), k(kn), v(kn), out(qn);
    for (std::size_t i = 0; i < kn; ++i) {
        k[i] = 1.0f / float(i + 3);
        v[i] = -float(i) * 1.0e-3f;
    }
    cache.append_attend(0, 0, 3, q.data(), k.data(), v.data(), out.data());
    std::vector<float> k_back(kn), v_back(kn);
    cache.read_kv(0, 0, 0, 3, k_back.data(), v_back.data());
    EXPECT_EQ(std::memcmp(k_back.data(), k.data(), kn * 4), 0);
    EXPECT_EQ(std::memcmp(v_back.data(), v.data(), kn * 4), 0);
}

// The first token attends only to itself, so its output is exactly its own V row (rounded), whatever q and k are.
TEST(AttentionVsReference, FirstTokenOutputIsItsOwnValue) {
    for (uint32_t dtype : {KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16}) {
        Shape s;
        s.dtype = dtype;
        s.rope = KVC_ROPE_GPTJ;
        kvc::Cache cache(example_api(), s.config());
        std::vector<float> q(4 * 8, 3.0f), k(2 * 8, -7.0f), v(2 * 8), out(4 * 8);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * float(i) - 0.77f;
        cache.append_attend(0, 0, 1, q.data(), k.data(), v.data(), out.data());
        for (uint32_t h = 0; h < 4; ++h)
            for (uint32_t i = 0; i < 8; ++i)
                EXPECT_EQ(out[h * 8 + i], kvc::ref::round_to_dtype(v[(h / 2) * 8 + i], dtype))
                    << kvc::dtype_name(dtype) << " head " << h << " dim " << i;
    }
}

} // namespace
} // namespace kvc_example_test
