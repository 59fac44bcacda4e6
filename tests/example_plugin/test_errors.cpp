// Bad input: every refusal returns the right status, explains itself through last_error, and changes nothing.
#include "rig.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace kvc_example_test {
namespace {

const kvc_plugin_api* api() { return example_api(); }

// Expects create(config) to fail with `status` and a message containing `words`; last_error(NULL) carries it.
void expect_create_fails(const kvc_config& config, kvc_status status, const std::string& words) {
    kvc_cache* cache = reinterpret_cast<kvc_cache*>(0x1); // must be overwritten with NULL
    EXPECT_EQ(api()->create(&config, &cache), status);
    EXPECT_EQ(cache, nullptr);
    const char* msg = api()->last_error(nullptr);
    ASSERT_NE(msg, nullptr);
    EXPECT_NE(std::string(msg).find(words), std::string::npos) << "message: " << msg;
}

TEST(ExampleCreate, RefusesBadConfigsWithAMessage) {
    const Shape base;
    struct Case {
        const char* what;
        std::function<void(kvc_config&)> change;
        kvc_status status;
        const char* words;
    };
    const Case cases[] = {
        {"unknown dtype", [](kvc_config& c) { c.cache_dtype = 3; }, KVC_ERR_INVALID_ARGUMENT, "cache_dtype 3"},
        {"unknown rope", [](kvc_config& c) { c.rope = 9; }, KVC_ERR_INVALID_ARGUMENT, "rope 9"},
        {"head_dim 0", [](kvc_config& c) { c.head_dim = 0; }, KVC_ERR_INVALID_ARGUMENT, "positive"},
        {"no layers", [](kvc_config& c) { c.n_layers = 0; }, KVC_ERR_INVALID_ARGUMENT, "positive"},
        {"no q heads", [](kvc_config& c) { c.n_q_heads = 0; }, KVC_ERR_INVALID_ARGUMENT, "positive"},
        {"no kv heads", [](kvc_config& c) { c.n_kv_heads = 0; }, KVC_ERR_INVALID_ARGUMENT, "positive"},
        {"no seqs", [](kvc_config& c) { c.max_seqs = 0; }, KVC_ERR_INVALID_ARGUMENT, "positive"},
        {"no tokens", [](kvc_config& c) { c.max_tokens = 0; }, KVC_ERR_INVALID_ARGUMENT, "positive"},
        {"q heads not a multiple of kv heads",
         [](kvc_config& c) {
             c.n_q_heads = 6;
             c.n_kv_heads = 4;
         },
         KVC_ERR_INVALID_ARGUMENT, "not a multiple"},
        {"odd head_dim with rope",
         [](kvc_config& c) {
             c.head_dim = 7;
             c.rope = KVC_ROPE_NEOX;
         },
         KVC_ERR_INVALID_ARGUMENT, "even"},
        {"theta 0 with rope",
         [](kvc_config& c) {
             c.rope = KVC_ROPE_GPTJ;
             c.rope_theta = 0.0f;
         },
         KVC_ERR_INVALID_ARGUMENT, "rope_theta"},
        {"infinite scale", [](kvc_config& c) { c.scale = INFINITY; }, KVC_ERR_INVALID_ARGUMENT, "scale"},
        {"short struct", [](kvc_config& c) { c.struct_size = offsetof(kvc_config, block_size_hint); },
         KVC_ERR_INVALID_ARGUMENT, "struct_size"},
        {"beyond the declared limits", [](kvc_config& c) { c.max_seqs = 100000; }, KVC_ERR_UNSUPPORTED, "limits"},
        {"more than 1 GiB",
         [](kvc_config& c) {
             c.max_seqs = 64;
             c.n_layers = 32;
             c.max_tokens = 4096;
             c.n_kv_heads = 8;
             c.n_q_heads = 8;
             c.head_dim = 128;
         },
         KVC_ERR_OUT_OF_MEMORY, "bytes"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        kvc_config config = base.config();
        c.change(config);
        expect_create_fails(config, c.status, c.words);
    }
}

TEST(ExampleCreate, NullArguments) {
    kvc_cache* cache = nullptr;
    EXPECT_EQ(api()->create(nullptr, &cache), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(api()->last_error(nullptr)).find("NULL"), std::string::npos);
    const kvc_config config = Shape{}.config();
    EXPECT_EQ(api()->create(&config, nullptr), KVC_ERR_INVALID_ARGUMENT);
}

// Exactly 1 GiB of K and V is accepted (calloc maps it lazily, so this costs no real memory).
TEST(ExampleCreate, AcceptsExactlyTheByteCap) {
    Shape s;
    s.dtype = KVC_DTYPE_F32;
    s.max_seqs = 1;
    s.n_layers = 1;
    s.max_tokens = 65536;
    s.n_q_heads = 16;
    s.n_kv_heads = 16;
    s.head_dim = 128; // 2 * 65536 * 16 * 128 * 4 = 2^30
    kvc::Cache cache(api(), s.config());
    EXPECT_EQ(cache.memory().pool_bytes, uint64_t(1) << 30);
    s.max_tokens = 65535;
    s.n_kv_heads = 8;
    s.n_q_heads = 8;
    s.head_dim = 256;
    s.dtype = KVC_DTYPE_F16;
    kvc::Cache smaller(api(), s.config());
    EXPECT_EQ(smaller.memory().pool_bytes, 2ull * 65535 * 8 * 256 * 2);
}

// The failures of one cache are reported by that cache; last_error is never NULL, even before any failure.
TEST(ExampleLastError, PerCacheAndNeverNull) {
    kvc::Cache a(api(), Shape{}.config()), b(api(), Shape{}.config());
    ASSERT_NE(api()->last_error(a.get()), nullptr);
    ASSERT_NE(api()->last_error(nullptr), nullptr);
    EXPECT_EQ(api()->release(a.get(), 77), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(api()->last_error(a.get())).find("77"), std::string::npos);
    EXPECT_EQ(std::string(api()->last_error(b.get())).find("77"), std::string::npos);
}

// A cache holding a few rows, for the call-level tests below.
class ExampleCalls : public ::testing::Test {
protected:
    ExampleCalls() : rig_(shape()) { rig_.append_and_check(0, 0, 3); }
    static Shape shape() {
        Shape s;
        s.dtype = KVC_DTYPE_F16;
        s.rope = KVC_ROPE_NEOX;
        s.max_tokens = 8;
        return s; // 2 layers, 4 q heads, 2 kv heads, head_dim 8, 4 seqs
    }
    kvc_cache* cache() { return rig_.cache().get(); }
    std::string message() { return api()->last_error(cache()); }
    // After a refused call: the message names the problem and nothing changed.
    void expect_refused(kvc_status got, kvc_status want, const std::string& words) {
        EXPECT_EQ(got, want) << message();
        EXPECT_NE(message().find(words), std::string::npos) << "message: " << message();
        for (uint32_t seq = 0; seq < 4; ++seq)
            for (uint32_t layer = 0; layer < 2; ++layer) rig_.check_readback(seq, layer);
        rig_.check_memory();
    }

    Rig rig_;
    std::vector<float> q_ = std::vector<float>(8 * 32, 0.5f), kv_ = std::vector<float>(8 * 16, 0.25f),
                       out_ = std::vector<float>(8 * 32);
    std::vector<uint16_t> kb_ = std::vector<uint16_t>(8 * 16), vb_ = std::vector<uint16_t>(8 * 16);
};

TEST_F(ExampleCalls, SeqOutOfRange) {
    expect_refused(api()->append_attend(cache(), 4, 0, 1, q_.data(), kv_.data(), kv_.data(), out_.data()),
                   KVC_ERR_INVALID_ARGUMENT, "seq 4");
    expect_refused(api()->read_kv(cache(), 9, 0, 0, 0, kb_.data(), vb_.data()), KVC_ERR_INVALID_ARGUMENT, "seq 9");
    uint32_t len = 0;
    expect_refused(api()->seq_length(cache(), 4, 0, &len), KVC_ERR_INVALID_ARGUMENT, "seq 4");
    expect_refused(api()->release(cache(), 4), KVC_ERR_INVALID_ARGUMENT, "seq 4");
    expect_refused(api()->fork(cache(), 0, 4), KVC_ERR_INVALID_ARGUMENT, "out of range");
    expect_refused(api()->fork(cache(), 5, 1), KVC_ERR_INVALID_ARGUMENT, "out of range");
}

TEST_F(ExampleCalls, LayerOutOfRange) {
    expect_refused(api()->append_attend(cache(), 0, 2, 1, q_.data(), kv_.data(), kv_.data(), out_.data()),
                   KVC_ERR_INVALID_ARGUMENT, "layer 2");
    expect_refused(api()->read_kv(cache(), 0, 2, 0, 1, kb_.data(), vb_.data()), KVC_ERR_INVALID_ARGUMENT, "layer 2");
    uint32_t len = 0;
    expect_refused(api()->seq_length(cache(), 0, 5, &len), KVC_ERR_INVALID_ARGUMENT, "layer 5");
}

// max_tokens is 8 and the stream holds 3: 6 more do not fit, and nothing of them may be written.
TEST_F(ExampleCalls, AppendBeyondMaxTokens) {
    expect_refused(api()->append_attend(cache(), 0, 0, 6, q_.data(), kv_.data(), kv_.data(), out_.data()),
                   KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    rig_.append_and_check(0, 0, 5); // exactly full is fine
    expect_refused(api()->append_attend(cache(), 0, 0, 1, q_.data(), kv_.data(), kv_.data(), out_.data()),
                   KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    // a count so large that len + n_new wraps around 32 bits
    expect_refused(api()->append_attend(cache(), 0, 0, 0xFFFFFFFFu, q_.data(), kv_.data(), kv_.data(), out_.data()),
                   KVC_ERR_OUT_OF_MEMORY, "max_tokens");
}

TEST_F(ExampleCalls, ReadPastTheLength) {
    expect_refused(api()->read_kv(cache(), 0, 0, 0, 4, kb_.data(), vb_.data()), KVC_ERR_INVALID_ARGUMENT, "holds");
    expect_refused(api()->read_kv(cache(), 0, 0, 3, 1, kb_.data(), vb_.data()), KVC_ERR_INVALID_ARGUMENT, "holds");
    expect_refused(api()->read_kv(cache(), 0, 0, 4, 0, kb_.data(), vb_.data()), KVC_ERR_INVALID_ARGUMENT, "holds");
    expect_refused(api()->read_kv(cache(), 0, 0, 2, 0xFFFFFFFFu, kb_.data(), vb_.data()), KVC_ERR_INVALID_ARGUMENT,
                   "holds");
    expect_refused(api()->read_kv(cache(), 1, 0, 0, 1, kb_.data(), vb_.data()), KVC_ERR_INVALID_ARGUMENT, "holds");
    EXPECT_EQ(api()->read_kv(cache(), 0, 0, 3, 0, nullptr, nullptr), KVC_OK); // an empty window at the end is fine
}

TEST_F(ExampleCalls, ForkRules) {
    expect_refused(api()->fork(cache(), 1, 2), KVC_ERR_INVALID_ARGUMENT, "unknown"); // parent holds nothing
    rig_.append_and_check(2, 1, 1);
    expect_refused(api()->fork(cache(), 0, 2), KVC_ERR_INVALID_ARGUMENT, "not empty"); // child holds a row
    expect_refused(api()->fork(cache(), 0, 0), KVC_ERR_INVALID_ARGUMENT, "both");
}

// Only a started sequence can be released (abi.h); a second release of the same sequence is refused.
TEST_F(ExampleCalls, ReleaseOfAnEmptySequence) {
    expect_refused(api()->release(cache(), 2), KVC_ERR_INVALID_ARGUMENT, "holds no rows");
    rig_.append_and_check(2, 1, 2); // started in layer 1 only: that is enough
    EXPECT_EQ(api()->release(cache(), 2), KVC_OK) << message();
    rig_.model().release(2);
    expect_refused(api()->release(cache(), 2), KVC_ERR_INVALID_ARGUMENT, "holds no rows");
}

TEST_F(ExampleCalls, NullPointers) {
    const float* q = q_.data();
    const float* kv = kv_.data();
    float* out = out_.data();
    expect_refused(api()->append_attend(cache(), 0, 0, 1, nullptr, kv, kv, out), KVC_ERR_INVALID_ARGUMENT, "NULL");
    expect_refused(api()->append_attend(cache(), 0, 0, 1, q, nullptr, kv, out), KVC_ERR_INVALID_ARGUMENT, "NULL");
    expect_refused(api()->append_attend(cache(), 0, 0, 1, q, kv, nullptr, out), KVC_ERR_INVALID_ARGUMENT, "NULL");
    expect_refused(api()->append_attend(cache(), 0, 0, 1, q, kv, kv, nullptr), KVC_ERR_INVALID_ARGUMENT, "NULL");
    expect_refused(api()->read_kv(cache(), 0, 0, 0, 1, nullptr, vb_.data()), KVC_ERR_INVALID_ARGUMENT, "NULL");
    expect_refused(api()->read_kv(cache(), 0, 0, 0, 1, kb_.data(), nullptr), KVC_ERR_INVALID_ARGUMENT, "NULL");
    expect_refused(api()->seq_length(cache(), 0, 0, nullptr), KVC_ERR_INVALID_ARGUMENT, "NULL");
    expect_refused(api()->memory(cache(), nullptr), KVC_ERR_INVALID_ARGUMENT, "NULL");
}

// n_new == 0 is a no-op that succeeds, with any pointers, even on a full stream.
TEST_F(ExampleCalls, ZeroNewTokensIsANoOp) {
    EXPECT_EQ(api()->append_attend(cache(), 0, 0, 0, nullptr, nullptr, nullptr, nullptr), KVC_OK);
    EXPECT_EQ(api()->append_attend(cache(), 3, 1, 0, nullptr, nullptr, nullptr, nullptr), KVC_OK);
    rig_.append_and_check(0, 0, 5);
    EXPECT_EQ(api()->append_attend(cache(), 0, 0, 0, nullptr, nullptr, nullptr, nullptr), KVC_OK);
    EXPECT_EQ(rig_.cache().seq_length(0, 0), 8u);
    rig_.check_readback(0, 0);
    rig_.check_memory();
}

// Calls with no cache at all fail cleanly; their message goes where last_error(NULL) finds it.
TEST(ExampleNullCache, EveryCallRefusesIt) {
    float x[8] = {};
    uint32_t len = 0;
    kvc_memory m{};
    m.struct_size = sizeof m;
    EXPECT_EQ(api()->append_attend(nullptr, 0, 0, 1, x, x, x, x), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(api()->last_error(nullptr)).find("cache is NULL"), std::string::npos);
    EXPECT_EQ(api()->read_kv(nullptr, 0, 0, 0, 1, x, x), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api()->seq_length(nullptr, 0, 0, &len), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api()->memory(nullptr, &m), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api()->fork(nullptr, 0, 1), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api()->release(nullptr, 0), KVC_ERR_INVALID_ARGUMENT);
    api()->destroy(nullptr); // tolerated
}

} // namespace
} // namespace kvc_example_test
