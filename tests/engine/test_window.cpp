// Sliding windows per layer, attention sinks and eviction in the CPU engine: outputs against
// kvc::ref::attend_heads<long double> with the reference's Visibility{window, sinks}, for every dtype (the quantized
// ones over the rows as stored), decode, prefill and chunks straddling W - 1, W, W + 1 and S + W - 1, sequences many
// times longer than W; eviction: read_kv of a dropped row is KVC_ERR_EVICTED, retained rows are bitwise those of a
// cache that keeps everything, memory stays bounded and freed blocks are reused, fork and release of streams with
// dropped rows; determinism (chunking, threads and eviction do not change a bit); the config checks.
#include "engine_test_util.hpp"

#include "kvcheck/optimized/cpu_engine.h"
#include "quantize.hpp"

#include <tuple>

namespace kvc::test {
namespace {

// What the cache holds of one (rotated) f32 row: rounded to f32/f16/bf16, or quantized and dequantized by the
// engine's own quantizers (test_quant_cache.cpp proves them bitwise equal to the reference's); fp8 scales are 1.
std::vector<long double> stored(const kvc_config& c, const float* x) {
    const uint32_t d = c.head_dim;
    std::vector<long double> out(d);
    if (kvc::dtype_is_quantized(c.cache_dtype)) {
        const opt::QuantFormat f{c.cache_dtype, d, c.int8_scale_dtype == KVC_DTYPE_F16};
        std::vector<uint8_t> buf(d + opt::row_scale_bytes(f));
        std::vector<float> deq(d);
        opt::quantize_row(x, f, 1.0f, buf.data());
        opt::dequantize_row(buf.data(), f, 1.0f, deq.data());
        for (uint32_t i = 0; i < d; ++i) out[i] = deq[i];
    } else {
        for (uint32_t i = 0; i < d; ++i) out[i] = ref::round_to_dtype(x[i], c.cache_dtype);
    }
    return out;
}

// One (sequence, layer) as the reference sees it, for any dtype: K rotated by its absolute position.
struct WHistory {
    explicit WHistory(const kvc_config& config) : h(config) {}
    void add(const std::vector<float>& k, const std::vector<float>& v) {
        const kvc_config& c = h.c;
        const size_t d = c.head_dim, row = size_t{c.n_kv_heads} * d, n = k.size() / row;
        std::vector<long double> kr(d);
        std::vector<float> kf(d);
        for (size_t t = 0; t < n; ++t, ++h.len)
            for (size_t hh = 0; hh < c.n_kv_heads; ++hh) {
                for (size_t i = 0; i < d; ++i) kr[i] = k[t * row + hh * d + i];
                ref::apply_rope(kr.data(), static_cast<int>(d), h.len, static_cast<ref::Rope>(c.rope), c.rope_theta);
                for (size_t i = 0; i < d; ++i) kf[i] = static_cast<float>(kr[i]);
                const auto ks = stored(c, kf.data()), vs = stored(c, v.data() + t * row + hh * d);
                h.K.insert(h.K.end(), ks.begin(), ks.end());
                h.V.insert(h.V.end(), vs.begin(), vs.end());
            }
    }
    History h;
};

// The reference's outputs of the last n_q tokens of h under the visibility rule of window w and s sinks.
std::vector<double> window_oracle(const History& h, const std::vector<float>& q, uint32_t w, uint32_t s) {
    using LD = long double;
    const kvc_config& c = h.c;
    const int d = static_cast<int>(c.head_dim), Hq = static_cast<int>(c.n_q_heads), Hkv = static_cast<int>(c.n_kv_heads);
    const long n_q = static_cast<long>(q.size() / (static_cast<size_t>(Hq) * d));
    ref::Mat<LD> K(h.len, Hkv * d), V(h.len, Hkv * d), Q(n_q, Hq * d);
    std::copy(h.K.begin(), h.K.end(), K.data());
    std::copy(h.V.begin(), h.V.end(), V.data());
    for (long t = 0; t < n_q; ++t)
        for (int hh = 0; hh < Hq; ++hh) {
            LD* row = &Q(t, hh * d);
            for (int i = 0; i < d; ++i) row[i] = q[(static_cast<size_t>(t) * Hq + hh) * d + i];
            ref::apply_rope(row, d, h.len - n_q + t, static_cast<ref::Rope>(c.rope), c.rope_theta);
        }
    const ref::Mat<LD> out =
        ref::attend_heads<LD>(Q, K, V, Hq, Hkv, d, static_cast<LD>(c.scale), ref::Visibility{long(w), long(s)});
    return std::vector<double>(out.data(), out.data() + out.size());
}

// A config with windows[layer] (the array kept alive by the caller until create).
kvc_config windowed(kvc_config c, const std::vector<uint32_t>& windows, uint32_t sinks, bool evict) {
    c.windows = windows.data();
    c.n_sinks = sinks;
    c.evict = evict ? 1u : 0u;
    return c;
}

// Rows of the first block of each block of a stream of length len that eviction has dropped.
bool dropped(uint64_t pos, uint64_t len, uint32_t w, uint32_t s, uint32_t B) {
    if (w == 0 || len < w) return false;
    const uint64_t b = pos / B, sink_blocks = (s + B - 1) / B;
    return b >= sink_blocks && (b + 1) * B <= len - w + 1;
}

// Chunks whose running length passes W - 1, W, W + 1, S + W - 1 +- 1, a long chunk (tiled), decode steps, short
// chunks (spread), and up to `total` tokens.
std::vector<uint32_t> window_chunks(uint32_t w, uint32_t s, uint32_t total) {
    std::vector<uint32_t> marks = {w > 2 ? w - 2 : 1, w - 1, w, w + 1, w + 2, s + w - 2, s + w - 1, s + w, s + w + 1,
                                   s + w + 4, 2 * w + 3, 2 * w + 4};
    std::sort(marks.begin(), marks.end());
    std::vector<uint32_t> chunks;
    uint32_t len = 0;
    for (uint32_t m : marks)
        if (m > len) {
            chunks.push_back(m - len);
            len = m;
        }
    uint32_t i = 0;
    while (len < total) {
        const uint32_t steps[] = {1, 1, 3, 37, 1, 4, 300, 2, 1};
        const uint32_t n = std::min(total - len, steps[i++ % 9]);
        chunks.push_back(n);
        len += n;
    }
    return chunks;
}

struct WCase {
    const char* name;
    uint32_t dtype;
    uint32_t window, sinks, total;
};

const WCase kCases[] = {
    {"f32_w50_s3", KVC_DTYPE_F32, 50, 3, 700},        {"f16_w50_s3", KVC_DTYPE_F16, 50, 3, 700},
    {"bf16_w50_s0", KVC_DTYPE_BF16, 50, 0, 600},      {"f16_w300_s5", KVC_DTYPE_F16, 300, 5, 2600},
    {"f32_w1_s2", KVC_DTYPE_F32, 1, 2, 120},          {"f16_w1100_s20", KVC_DTYPE_F16, 1100, 20, 3000},
    {"e4m3_w60_s4", KVC_DTYPE_FP8_E4M3, 60, 4, 500},  {"e5m2_w60_s0", KVC_DTYPE_FP8_E5M2, 60, 0, 500},
    {"int8_w70_s2", KVC_DTYPE_INT8_TOKEN, 70, 2, 500}, {"q8_0_w40_s1", KVC_DTYPE_Q8_0, 40, 1, 400},
};

using WParam = std::tuple<WCase, bool /*evict*/>;
class Window : public ::testing::TestWithParam<WParam> {};

// Two layers: layer 0 windowed, layer 1 without a window (it never drops a row). GQA 6:2, RoPE, 7-token blocks.
// Every output is checked against the reference; with eviction, every row's read_kv is EVICTED exactly when its
// block is all dead, and otherwise the row equals the non-evicting twin's bitwise; outputs of the two are bitwise
// equal (eviction changes no arithmetic).
void drive(const WCase& wc, bool evict, const opt::EngineOptions& o, uint64_t seed) {
    const uint32_t d = 32, B = 7;
    std::vector<uint32_t> windows = {wc.window, 0};
    const kvc_config base = make_config(6, 2, d, wc.dtype, B, KVC_ROPE_NEOX, 2);
    const kvc_config c = windowed(base, windows, wc.sinks, evict);
    auto e = make_engine(c, o);
    ASSERT_TRUE(e);
    windows.assign(2, 12345); // the caller's array: the engine must have copied it
    std::vector<uint32_t> keep_windows = {wc.window, 0};
    auto twin = make_engine(windowed(base, keep_windows, wc.sinks, false), o); // keeps every row
    ASSERT_TRUE(twin);
    Rng rng(seed);
    std::vector<WHistory> hist{WHistory(base), WHistory(base)};
    const size_t qrow = size_t{6} * d, kvrow = size_t{2} * d;
    for (uint32_t n : window_chunks(wc.window, wc.sinks, wc.total)) {
        for (uint32_t layer = 0; layer < 2; ++layer) {
            const auto q = rng.normal(n * qrow), k = rng.normal(n * kvrow), v = rng.normal(n * kvrow);
            std::vector<float> out(n * qrow, -7.0f), out_twin(n * qrow, -9.0f);
            ASSERT_EQ(e->append_attend(0, layer, n, q.data(), k.data(), v.data(), out.data()), KVC_OK) << e->last_error();
            ASSERT_EQ(twin->append_attend(0, layer, n, q.data(), k.data(), v.data(), out_twin.data()), KVC_OK);
            hist[layer].add(k, v);
            const uint32_t w = layer == 0 ? wc.window : 0;
            const uint64_t len = static_cast<uint64_t>(hist[layer].h.len);
            const std::string what = std::string(wc.name) + (evict ? ", evicting" : "") + ", layer " +
                                     std::to_string(layer) + ", " + std::to_string(len) + " tokens (chunk of " +
                                     std::to_string(n) + ")";
            expect_close(out, window_oracle(hist[layer].h, q, w, w ? wc.sinks : 0), what);
            EXPECT_TRUE(bitwise_equal(out, out_twin)) << what << ": eviction changed an output bit";
            uint32_t got_len = 0;
            ASSERT_EQ(e->seq_length(0, layer, &got_len), KVC_OK);
            EXPECT_EQ(got_len, len) << what << ": the length counts every row ever appended";
            if (::testing::Test::HasFailure()) return;
        }
    }
    // every row: EVICTED where its block was dropped, else bitwise the twin's
    const size_t row = size_t{2} * d * kvc::dtype_size(wc.dtype);
    for (uint32_t layer = 0; layer < 2; ++layer) {
        const uint64_t len = static_cast<uint64_t>(hist[layer].h.len);
        const uint32_t w = layer == 0 ? wc.window : 0;
        uint64_t live = 0;
        for (uint32_t pos = 0; pos < len; ++pos) {
            std::vector<uint8_t> k(row), v(row), kt(row), vt(row);
            const kvc_status s = e->read_kv(0, layer, pos, 1, k.data(), v.data());
            ASSERT_EQ(twin->read_kv(0, layer, pos, 1, kt.data(), vt.data()), KVC_OK);
            if (evict && dropped(pos, len, w, wc.sinks, B)) {
                ASSERT_EQ(s, KVC_ERR_EVICTED) << "row " << pos << " of layer " << layer;
                EXPECT_NE(std::string(e->last_error()).find("evicted"), std::string::npos) << e->last_error();
                continue;
            }
            ASSERT_EQ(s, KVC_OK) << "row " << pos << " of layer " << layer << ": " << e->last_error();
            EXPECT_TRUE(k == kt && v == vt) << "row " << pos << " of layer " << layer << " changed";
            ++live;
        }
        if (evict && w != 0 && len > w + 2 * B + wc.sinks) { // a range over a dropped row is EVICTED as a whole
            std::vector<uint8_t> k(row * len), v(row * len);
            EXPECT_EQ(e->read_kv(0, layer, 0, static_cast<uint32_t>(len), k.data(), v.data()), KVC_ERR_EVICTED);
        }
        (void)live;
    }
}

TEST_P(Window, MatchesReferenceSimd) {
    const auto [wc, evict] = GetParam();
    drive(wc, evict, {}, test_seed(4100));
}

TEST_P(Window, MatchesReferencePortable) {
    const auto [wc, evict] = GetParam();
    if (wc.total > 1000) GTEST_SKIP() << "the short cases cover this path (the reference is slow at long lengths)";
    opt::EngineOptions o;
    o.simd = false;
    drive(wc, evict, o, test_seed(4101));
}

TEST_P(Window, SealedPoisonedSingleThreaded) {
    const auto [wc, evict] = GetParam();
    if (wc.total > 1000) GTEST_SKIP() << "the short cases cover this path (the reference is slow at long lengths)";
    opt::EngineOptions o;
    o.seal_full_blocks = true;
    o.poison_unused = true;
    o.threads = 1;
    drive(wc, evict, o, test_seed(4102));
}

INSTANTIATE_TEST_SUITE_P(Windows, Window, ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Bool()),
                         [](const auto& info) {
                             return std::string(std::get<0>(info.param).name) +
                                    (std::get<1>(info.param) ? "_evict" : "_keep");
                         });

// The memory an evicting stream holds, and what memory() says of it.
struct MemoryCheck {
    uint64_t live = 0, capacity = 0, held = 0;
};
MemoryCheck memory_of(opt::Engine& e) {
    kvc_memory m{};
    m.struct_size = sizeof m;
    EXPECT_EQ(e.memory(&m), KVC_OK);
    return {m.live_bytes, m.capacity_bytes, m.capacity_bytes + m.pool_bytes};
}

// Decode far past the window (30 W): capacity stays within sinks + window + the partly filled block, live_bytes is
// exactly the rows read_kv can return, the pool stops growing, and the blocks the stream writes come back again:
// it goes through far more blocks than it ever holds.
TEST(Eviction, MemoryStaysBoundedAndFreedBlocksAreReused) {
    const uint32_t d = 16, B = 16, W = 64, S = 4;
    std::vector<uint32_t> windows = {W};
    const kvc_config c = windowed(make_config(4, 2, d, KVC_DTYPE_F16, B), windows, S, true);
    auto e = make_engine(c);
    ASSERT_TRUE(e);
    Rng rng(test_seed(4110));
    const uint64_t block_bytes = 2ull * 2 * B * d * 2, row_bytes = 2ull * 2 * d * 2;
    const uint64_t bound_blocks = (S + B - 1) / B + (W + B - 1) / B + 2;
    uint64_t held_mid = 0;
    const uint32_t total = 30 * W;
    std::vector<const uint8_t*> seen; // the distinct blocks the stream has written into
    for (uint32_t len = 0; len < total;) {
        const uint32_t n = len < 100 ? 100 : 1 + rng.below(3);
        const auto q = rng.normal(size_t{n} * 4 * d), k = rng.normal(size_t{n} * 2 * d), v = rng.normal(size_t{n} * 2 * d);
        std::vector<float> out(size_t{n} * 4 * d);
        ASSERT_EQ(e->append_attend(0, 0, n, q.data(), k.data(), v.data(), out.data()), KVC_OK) << e->last_error();
        const uint64_t before = len;
        len += n;
        for (uint64_t p = before; p < len; ++p) {
            if (dropped(p, len, W, S, B)) continue; // written and already freed (W < n in the first call)
            const uint8_t* at = e->slot_address(0, 0, p / B * B, KVC_PLANE_K, 0);
            ASSERT_NE(at, nullptr) << p;
            if (std::find(seen.begin(), seen.end(), at) == seen.end()) seen.push_back(at);
        }
        const MemoryCheck m = memory_of(*e);
        uint64_t readable = 0;
        for (uint64_t p = 0; p < len; ++p) readable += dropped(p, len, W, S, B) ? 0 : 1;
        ASSERT_EQ(m.live, readable * row_bytes) << "at " << len << " tokens";
        ASSERT_LE(m.capacity, bound_blocks * block_bytes) << "at " << len << " tokens";
        if (len >= total / 2 && held_mid == 0) held_mid = m.held;
        if (held_mid != 0) {
            ASSERT_LE(m.held, held_mid) << "the pool grew at " << len << " tokens";
        }
    }
    EXPECT_LE(seen.size(), 2 * bound_blocks) << "freed blocks are not taken again (" << total / B << " blocks written)";
}

// Fork of a stream with dropped rows: the child has the same dropped rows and shares the held blocks; both go on
// (each drops blocks the other may still hold); outputs follow the reference; release frees everything.
TEST(Eviction, ForkAndReleaseOfEvictedStreams) {
    const uint32_t d = 16, B = 5, W = 23, S = 3;
    std::vector<uint32_t> windows = {W};
    const kvc_config c = windowed(make_config(4, 2, d, KVC_DTYPE_F32, B, KVC_ROPE_GPTJ), windows, S, true);
    opt::EngineOptions o;
    o.seal_full_blocks = true;
    o.poison_unused = true;
    auto e = make_engine(c, o);
    ASSERT_TRUE(e);
    Rng rng(test_seed(4120));
    WHistory parent(c);
    const size_t qrow = size_t{4} * d, kvrow = size_t{2} * d;
    auto step = [&](uint32_t seq, WHistory& h, uint32_t n) {
        const auto q = rng.normal(n * qrow), k = rng.normal(n * kvrow), v = rng.normal(n * kvrow);
        std::vector<float> out(n * qrow);
        ASSERT_EQ(e->append_attend(seq, 0, n, q.data(), k.data(), v.data(), out.data()), KVC_OK) << e->last_error();
        h.add(k, v);
        expect_close(out, window_oracle(h.h, q, W, S), "sequence " + std::to_string(seq) + " at " + std::to_string(h.h.len));
    };
    step(0, parent, 60);
    step(0, parent, 2); // 62 rows: a partly filled last block, dropped blocks behind
    std::vector<float> kp(kvrow), vp(kvrow);
    EXPECT_EQ(e->read_kv(0, 0, 10, 1, kp.data(), vp.data()), KVC_ERR_EVICTED);
    const MemoryCheck before = memory_of(*e);
    ASSERT_EQ(e->fork(0, 1), KVC_OK) << e->last_error();
    const MemoryCheck shared = memory_of(*e);
    EXPECT_EQ(shared.capacity, before.capacity) << "fork copies no block";
    EXPECT_EQ(shared.live, 2 * before.live);
    std::vector<float> kc(kvrow), vc(kvrow);
    EXPECT_EQ(e->read_kv(1, 0, 10, 1, kc.data(), vc.data()), KVC_ERR_EVICTED) << "the child has the same dropped rows";
    for (uint32_t pos : {0u, 1u, 2u, 45u, 61u}) {
        ASSERT_EQ(e->read_kv(0, 0, pos, 1, kp.data(), vp.data()), KVC_OK) << pos;
        ASSERT_EQ(e->read_kv(1, 0, pos, 1, kc.data(), vc.data()), KVC_OK) << pos;
        EXPECT_TRUE(bitwise_equal(kp, kc) && bitwise_equal(vp, vc)) << pos;
    }
    WHistory child = parent;
    for (int i = 0; i < 30 && !::testing::Test::HasFailure(); ++i) {
        step(1, child, 1 + rng.below(3));
        if (i % 3 == 0) step(0, parent, 1 + rng.below(6));
    }
    ASSERT_EQ(e->release(0), KVC_OK);
    for (int i = 0; i < 10 && !::testing::Test::HasFailure(); ++i) step(1, child, 1);
    ASSERT_EQ(e->release(1), KVC_OK);
    const MemoryCheck empty = memory_of(*e);
    EXPECT_EQ(empty.live, 0u);
    EXPECT_EQ(empty.capacity, 0u);
}

// A prefill, decode step by step, random chunkings, one thread and every core, heads grouped or not: the same bits,
// with windows, sinks and eviction (one call sees rows that the previous call's eviction would have dropped only
// when they are still visible to it).
TEST(WindowDeterminism, ChunkingThreadsAndEvictionDoNotChangeABit) {
    for (uint32_t dtype : {KVC_DTYPE_F16, KVC_DTYPE_INT8_TOKEN}) {
        for (bool simd : {true, false}) {
            const uint32_t d = 32, W = 333, S = 5, len = 1500;
            std::vector<uint32_t> windows = {W};
            const kvc_config c = windowed(make_config(8, 2, d, dtype, 16, KVC_ROPE_NEOX), windows, S, true);
            Rng rng(test_seed(4130));
            const auto q = rng.normal(size_t{len} * 8 * d), k = rng.normal(size_t{len} * 2 * d),
                       v = rng.normal(size_t{len} * 2 * d);
            auto run = [&](const std::vector<uint32_t>& chunks, unsigned threads, bool group) {
                opt::EngineOptions o;
                o.simd = simd;
                o.threads = threads;
                o.group_heads = group;
                auto e = make_engine(c, o);
                std::vector<float> out(size_t{len} * 8 * d);
                uint32_t at = 0;
                for (uint32_t n : chunks) {
                    EXPECT_EQ(e->append_attend(0, 0, n, q.data() + size_t{at} * 8 * d, k.data() + size_t{at} * 2 * d,
                                               v.data() + size_t{at} * 2 * d, out.data() + size_t{at} * 8 * d),
                              KVC_OK)
                        << e->last_error();
                    at += n;
                }
                return out;
            };
            const auto prefill = run({len}, 0, true);
            std::vector<uint32_t> steps(len, 1);
            EXPECT_TRUE(bitwise_equal(prefill, run(steps, 0, true))) << "decode step by step, dtype " << dtype;
            EXPECT_TRUE(bitwise_equal(prefill, run(steps, 1, false))) << "one thread, one head per call";
            for (int trial = 0; trial < 3; ++trial) {
                std::vector<uint32_t> chunks;
                for (uint32_t at = 0; at < len;) {
                    const uint32_t n = std::min(len - at, 1 + rng.below(trial == 0 ? 5 : 400));
                    chunks.push_back(n);
                    at += n;
                }
                EXPECT_TRUE(bitwise_equal(prefill, run(chunks, trial == 1 ? 1 : 0, trial != 2)))
                    << "chunking " << trial << ", dtype " << dtype << ", simd " << simd;
            }
            // without eviction: the same bits again
            std::vector<uint32_t> keep = {W};
            const kvc_config kc = windowed(make_config(8, 2, d, dtype, 16, KVC_ROPE_NEOX), keep, S, false);
            opt::EngineOptions o;
            o.simd = simd;
            auto e = make_engine(kc, o);
            std::vector<float> out(size_t{len} * 8 * d);
            ASSERT_EQ(e->append_attend(0, 0, len, q.data(), k.data(), v.data(), out.data()), KVC_OK);
            EXPECT_TRUE(bitwise_equal(prefill, out)) << "eviction changed a bit";
        }
    }
}

// Sinks without a window have no effect; windows of 0 everywhere are no window.
TEST(WindowConfig, SinksWithoutAWindowAndZeroWindowsChangeNothing) {
    Rng rng(test_seed(4140));
    const uint32_t d = 16, len = 300;
    const auto q = rng.normal(size_t{len} * 4 * d), k = rng.normal(size_t{len} * 2 * d), v = rng.normal(size_t{len} * 2 * d);
    auto run = [&](const kvc_config& c) {
        auto e = make_engine(c);
        std::vector<float> out(size_t{len} * 4 * d);
        EXPECT_EQ(e->append_attend(0, 0, len, q.data(), k.data(), v.data(), out.data()), KVC_OK);
        return out;
    };
    const kvc_config plain = make_config(4, 2, d, KVC_DTYPE_F32, 16);
    const auto want = run(plain);
    kvc_config sinks_only = plain;
    sinks_only.n_sinks = 7;
    EXPECT_TRUE(bitwise_equal(want, run(sinks_only)));
    std::vector<uint32_t> zeros = {0};
    EXPECT_TRUE(bitwise_equal(want, run(windowed(plain, zeros, 3, false))));
}

// Through the ABI table: the refusals of the new fields, and KVC_ERR_EVICTED with a message.
TEST(WindowConfig, RefusalsThroughTheTable) {
    const kvc_plugin_api* api = kvc_cpu_engine_entry(1, 2);
    const kvc_config plain = make_config(4, 2, 16, KVC_DTYPE_F16, 16);
    std::vector<uint32_t> w = {8}, zeros = {0};
    struct Bad {
        const char* what;
        kvc_status status;
        kvc_config cfg;
    };
    std::vector<Bad> bad;
    kvc_config c = plain;
    c.evict = 1;
    bad.push_back({"evict without windows", KVC_ERR_INVALID_ARGUMENT, c});
    bad.push_back({"evict with windows of 0", KVC_ERR_INVALID_ARGUMENT, windowed(plain, zeros, 0, true)});
    c = windowed(plain, w, 0, false);
    c.evict = 2;
    bad.push_back({"evict 2", KVC_ERR_INVALID_ARGUMENT, c});
    c = plain; // head_dim_v and rope_dims themselves are supported (test_latent.cpp), beyond the limits they are not
    c.head_dim_v = 580;
    bad.push_back({"head_dim_v beyond max_head_dim_v", KVC_ERR_UNSUPPORTED, c});
    c = plain;
    c.rope_dims = 18;
    bad.push_back({"rope_dims beyond head_dim", KVC_ERR_INVALID_ARGUMENT, c});
    c = plain;
    c.rope_dim_begin = 4;
    bad.push_back({"rope_dim_begin without rope_dims", KVC_ERR_INVALID_ARGUMENT, c});
    for (const Bad& b : bad) {
        kvc_cache* cache = nullptr;
        EXPECT_EQ(api->create(&b.cfg, &cache), b.status) << b.what << ": " << api->last_error(nullptr);
        EXPECT_EQ(cache, nullptr) << b.what;
        EXPECT_STRNE(api->last_error(nullptr), "") << b.what;
    }
    c = plain;
    c.head_dim_v = 16; // equal to head_dim: the default
    kvc::Cache same(api, c);

    kvc::Cache cache(api, windowed(plain, w, 2, true));
    Rng rng(test_seed(4141));
    const auto q = rng.normal(40 * 4 * 16), k = rng.normal(40 * 2 * 16), v = rng.normal(40 * 2 * 16);
    std::vector<float> out(40 * 4 * 16);
    cache.append_attend(0, 0, 40, q.data(), k.data(), v.data(), out.data());
    std::vector<uint16_t> kr(2 * 16 * 40), vr(2 * 16 * 40);
    EXPECT_EQ(api->read_kv(cache.get(), 0, 0, 0, 2, kr.data(), vr.data()), KVC_OK) << "the sinks stay";
    EXPECT_EQ(api->read_kv(cache.get(), 0, 0, 16, 1, kr.data(), vr.data()), KVC_ERR_EVICTED);
    EXPECT_NE(std::string(api->last_error(cache.get())).find("evicted"), std::string::npos);
    EXPECT_EQ(api->read_kv(cache.get(), 0, 0, 32, 8, kr.data(), vr.data()), KVC_OK) << "the window stays";
    EXPECT_EQ(api->read_kv(cache.get(), 0, 0, 0, 40, kr.data(), vr.data()), KVC_ERR_EVICTED);
    EXPECT_EQ(cache.seq_length(0, 0), 40u);
}

} // namespace
} // namespace kvc::test
