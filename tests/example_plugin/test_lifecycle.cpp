// The example plugin's table, capabilities, memory numbers, fork and release, and a long random run of every
// operation against the model (including the ones that must fail and leave the cache unchanged).
#include "rig.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <thread>

namespace kvc_example_test {
namespace {

TEST(ExampleEntry, ServesMajorVersionOneOnly) {
    EXPECT_EQ(kvc_example_entry(0, 0), nullptr);
    EXPECT_EQ(kvc_example_entry(KVC_ABI_VERSION_MAJOR + 1, 0), nullptr);
    const kvc_plugin_api* api = kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    ASSERT_NE(api, nullptr);
    EXPECT_EQ(kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR + 7), api); // a newer minor is fine
    EXPECT_EQ(api->struct_size, sizeof(kvc_plugin_api));
    EXPECT_EQ(api->abi_major, KVC_ABI_VERSION_MAJOR);
    EXPECT_EQ(api->abi_minor, KVC_ABI_VERSION_MINOR);
    EXPECT_STREQ(api->name, "example-c");
    EXPECT_NE(api->version, nullptr);
    EXPECT_FALSE(KVC_API_HAS(api, append_attend_batch)); // BATCH is not declared
    EXPECT_TRUE(KVC_API_HAS(api, fork));
    EXPECT_TRUE(KVC_API_HAS(api, release));
}

TEST(ExampleCaps, DeclaresWhatTheTextbookCacheDoes) {
    const kvc_caps caps = kvc::query_caps(example_api());
    EXPECT_EQ(caps.struct_size, sizeof(kvc_caps)); // left as the caller wrote it
    EXPECT_EQ(caps.dtypes, (1u << KVC_DTYPE_F32) | (1u << KVC_DTYPE_F16) | (1u << KVC_DTYPE_BF16));
    EXPECT_EQ(caps.rope_variants, (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ));
    EXPECT_EQ(caps.features, KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED);
    EXPECT_EQ(caps.precision, uint32_t(KVC_PRECISION_F32));
    EXPECT_EQ(caps.memory_space, uint32_t(KVC_MEMORY_HOST));
    EXPECT_GT(caps.max_layers, 0u);
    EXPECT_GT(caps.max_q_heads, 0u);
    EXPECT_GT(caps.max_kv_heads, 0u);
    EXPECT_GT(caps.max_head_dim, 0u);
    EXPECT_GT(caps.max_seqs, 0u);
    EXPECT_GT(caps.max_tokens, 0u);
}

// A harness built against an older, shorter kvc_caps gets only the members it has room for.
TEST(ExampleCaps, RespectsTheCallersStructSize) {
    struct {
        kvc_caps caps;
        unsigned char after[32];
    } buf;
    std::memset(&buf, 0xCD, sizeof buf);
    buf.caps.struct_size = offsetof(kvc_caps, precision);
    example_api()->get_caps(&buf.caps);
    EXPECT_EQ(buf.caps.struct_size, offsetof(kvc_caps, precision));
    EXPECT_EQ(buf.caps.features, KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED);
    const auto* raw = reinterpret_cast<const unsigned char*>(&buf);
    for (std::size_t i = offsetof(kvc_caps, precision); i < sizeof buf; ++i)
        ASSERT_EQ(raw[i], 0xCD) << "get_caps wrote byte " << i << " beyond struct_size";
    example_api()->get_caps(nullptr); // tolerated
}

// The formula by hand: K and V, 2 KV heads of 4 dims, f16 (2 bytes): one token in one layer is 2 * 8 * 2 = 32 bytes.
TEST(ExampleMemory, NumbersFollowTheFormula) {
    Shape s;
    s.dtype = KVC_DTYPE_F16;
    s.max_seqs = 3;
    s.n_layers = 2;
    s.max_tokens = 10;
    s.n_q_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 4;
    Rig rig(s);
    const uint64_t total = 3 * 2 * 10 * 32; // every row of every stream, allocated at create
    kvc_memory m = rig.cache().memory();
    EXPECT_EQ(m.block_size, 1u);
    EXPECT_EQ(m.live_bytes, 0u);
    EXPECT_EQ(m.capacity_bytes, 0u);
    EXPECT_EQ(m.pool_bytes, total);

    rig.append_and_check(0, 0, 3);
    rig.append_and_check(1, 1, 5);
    m = rig.cache().memory();
    EXPECT_EQ(m.live_bytes, 8u * 32);
    EXPECT_EQ(m.capacity_bytes, 8u * 32);
    EXPECT_EQ(m.pool_bytes, total - 8 * 32);

    rig.cache().fork(1, 2); // copies: the child's rows count in live and in capacity
    rig.model().fork(1, 2);
    m = rig.cache().memory();
    EXPECT_EQ(m.live_bytes, 13u * 32);
    EXPECT_EQ(m.capacity_bytes, 13u * 32);
    EXPECT_EQ(m.pool_bytes, total - 13 * 32);

    rig.cache().release(0);
    rig.model().release(0);
    m = rig.cache().memory();
    EXPECT_EQ(m.live_bytes, 10u * 32);
    EXPECT_EQ(m.pool_bytes, total - 10 * 32);
    rig.check_memory();
}

// A harness built against an older, shorter kvc_memory gets only what fits.
TEST(ExampleMemory, RespectsTheCallersStructSize) {
    Rig rig(Shape{});
    rig.append_and_check(0, 0, 2);
    struct {
        kvc_memory m;
        unsigned char after[16];
    } buf;
    std::memset(&buf, 0xCD, sizeof buf);
    buf.m.struct_size = offsetof(kvc_memory, capacity_bytes);
    ASSERT_EQ(example_api()->memory(rig.cache().get(), &buf.m), KVC_OK);
    EXPECT_EQ(buf.m.block_size, 1u);
    EXPECT_EQ(buf.m.live_bytes, rig.model().live_bytes());
    const auto* raw = reinterpret_cast<const unsigned char*>(&buf);
    for (std::size_t i = offsetof(kvc_memory, capacity_bytes); i < sizeof buf; ++i)
        ASSERT_EQ(raw[i], 0xCD) << "memory wrote byte " << i << " beyond struct_size";
}

// The child starts with the parent's rows in every layer, then both go their own way without touching each other.
TEST(ExampleFork, ChildCopiesEveryLayerAndDivergesIndependently) {
    for (uint32_t dtype : {KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16}) {
        Shape s;
        s.dtype = dtype;
        s.rope = KVC_ROPE_NEOX;
        SCOPED_TRACE(s.name());
        Rig rig(s, 21);
        rig.append_and_check(0, 0, 6);
        rig.append_and_check(0, 1, 4); // layers of one sequence may have different lengths
        rig.cache().fork(0, 3);
        rig.model().fork(0, 3);
        EXPECT_EQ(rig.cache().seq_length(3, 0), 6u);
        EXPECT_EQ(rig.cache().seq_length(3, 1), 4u);
        rig.check_readback(3, 0);
        rig.check_readback(3, 1);
        rig.append_and_check(3, 0, 2); // the child continues at position 6
        rig.append_and_check(0, 0, 1); // the parent continues separately
        rig.append_and_check(3, 1, 1);
        for (uint32_t seq : {0u, 3u})
            for (uint32_t layer : {0u, 1u}) rig.check_readback(seq, layer);
        rig.check_memory();
    }
}

// Release empties every layer; the sequence can start again from position 0 and sees none of its old rows.
// Releasing a sequence that holds no rows is an error (abi.h).
TEST(ExampleRelease, EmptiesTheSequenceForReuse) {
    Shape s;
    s.rope = KVC_ROPE_GPTJ;
    s.dtype = KVC_DTYPE_BF16;
    Rig rig(s, 22);
    rig.append_and_check(1, 0, 7);
    rig.append_and_check(1, 1, 3);
    rig.append_and_check(2, 0, 2);
    rig.cache().release(1);
    rig.model().release(1);
    EXPECT_EQ(rig.cache().seq_length(1, 0), 0u);
    EXPECT_EQ(rig.cache().seq_length(1, 1), 0u);
    rig.check_memory();
    rig.append_and_check(1, 0, 2); // positions 0 and 1 again, against two rows only
    rig.append_and_check(1, 0, 1);
    rig.check_readback(1, 0);
    rig.check_readback(2, 0); // the other sequence is untouched
    rig.cache().release(1);
    rig.model().release(1);
    rig.check_memory();
    // Releasing it again (it holds no rows now) is refused, as is releasing a sequence never started.
    EXPECT_EQ(example_api()->release(rig.cache().get(), 1), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(example_api()->last_error(rig.cache().get())).find("holds no rows"), std::string::npos);
    EXPECT_EQ(example_api()->release(rig.cache().get(), 3), KVC_ERR_INVALID_ARGUMENT);
    rig.check_readback(2, 0);
    rig.check_memory();
}

// Every operation, valid or not, in random order against the model. A refused call must change nothing.
class RandomOperations : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RandomOperations, MatchTheModel) {
    const uint32_t seed = 1000 + GetParam();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Shape s;
    s.dtype = GetParam() % 3;
    s.rope = (GetParam() / 3) % 3;
    s.n_layers = 2;
    s.n_q_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 6;
    s.max_seqs = 4;
    s.max_tokens = 20;
    Rig rig(s, seed);
    const kvc_plugin_api* api = example_api();
    std::mt19937& rng = rig.rng();
    auto pick = [&](uint32_t n) { return uint32_t(rng() % n); };

    for (int op = 0; op < 300; ++op) {
        const uint32_t seq = pick(s.max_seqs + 1); // sometimes one past the end
        const uint32_t layer = pick(s.n_layers);
        switch (pick(6)) {
        case 0:
        case 1: { // append
            const uint32_t n = pick(6);
            if (seq >= s.max_seqs) {
                EXPECT_EQ(api->append_attend(rig.cache().get(), seq, layer, n, nullptr, nullptr, nullptr, nullptr),
                          KVC_ERR_INVALID_ARGUMENT);
            } else if (rig.model().length(seq, layer) + n > s.max_tokens) {
                std::vector<float> q(n * 24, 1.0f), kv(n * 12, 1.0f), out(n * 24);
                EXPECT_EQ(api->append_attend(rig.cache().get(), seq, layer, n, q.data(), kv.data(), kv.data(),
                                             out.data()),
                          KVC_ERR_OUT_OF_MEMORY);
            } else {
                rig.append_and_check(seq, layer, n);
            }
            break;
        }
        case 2: { // fork
            const uint32_t child = pick(s.max_seqs);
            const bool ok = seq < s.max_seqs && seq != child && !rig.model().seq_empty(seq) &&
                            rig.model().seq_empty(child);
            EXPECT_EQ(api->fork(rig.cache().get(), seq, child), ok ? KVC_OK : KVC_ERR_INVALID_ARGUMENT)
                << "fork " << seq << " -> " << child << ": " << api->last_error(rig.cache().get());
            if (ok) rig.model().fork(seq, child);
            break;
        }
        case 3: { // release: only a started sequence
            const bool ok = seq < s.max_seqs && !rig.model().seq_empty(seq);
            EXPECT_EQ(api->release(rig.cache().get(), seq), ok ? KVC_OK : KVC_ERR_INVALID_ARGUMENT);
            if (ok) rig.model().release(seq);
            break;
        }
        case 4: // read back
            if (seq < s.max_seqs) rig.check_readback(seq, layer);
            break;
        default:
            rig.check_memory();
            break;
        }
        if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) {
            ADD_FAILURE() << "stopped at operation " << op;
            return;
        }
    }
    for (uint32_t q = 0; q < s.max_seqs; ++q)
        for (uint32_t l = 0; l < s.n_layers; ++l) rig.check_readback(q, l);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomOperations, ::testing::Range(0u, 9u));

// Distinct caches may be used from distinct threads at the same time.
TEST(ExampleThreads, DistinctCachesInParallel) {
    auto work = [](uint32_t dtype, uint32_t seed) {
        Shape s;
        s.dtype = dtype;
        s.rope = KVC_ROPE_NEOX;
        Rig rig(s, seed);
        for (int i = 0; i < 20; ++i) rig.append_and_check(uint32_t(i) % 4, uint32_t(i) % 2, 1 + uint32_t(i) % 3);
        for (uint32_t q = 0; q < 4; ++q) rig.check_readback(q, 0);
    };
    std::thread a(work, uint32_t(KVC_DTYPE_F16), 31u), b(work, uint32_t(KVC_DTYPE_BF16), 32u);
    a.join();
    b.join();
}

} // namespace
} // namespace kvc_example_test
