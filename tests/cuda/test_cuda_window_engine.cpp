// The CUDA engine's windowed and latent caches (ABI 1.2) through the ABI, against the CPU engine, whose windows,
// sinks, eviction, head_dim_v and RoPE ranges are verified against the reference (tests/engine/test_window.cpp,
// test_latent.cpp): the same outputs within twice the promise, the same rows held and dropped (read_kv's statuses
// range by range), the same stored bytes, the same memory report after every call, with fork and release. Part of
// test_cuda_engine (one program, so that its own CUDA runtime meets the device first: test_cuda_engine.cpp). Without a
// usable device every test that needs one skips with the CUDA error as its reason; the caps and the configs' checks
// run everywhere. Random inputs print their seed (KVCHECK_SEED=N replays).
#include "kvcheck/abi.hpp"
#include "kvcheck/optimized/cpu_engine.h"
#include "kvcheck/optimized/cuda_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace {

#define SKIP_WITHOUT_DEVICE()                                                                                          \
    do {                                                                                                               \
        if (const char* why = kvc_cuda_engine_unavailable()) GTEST_SKIP() << why;                                      \
    } while (0)

const kvc_plugin_api* cuda_api() { return kvc_cuda_engine_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }
const kvc_plugin_api* cpu_api() { return kvc_cpu_engine_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

uint64_t test_seed(uint64_t fallback) {
    uint64_t seed = fallback;
    if (const char* env = std::getenv("KVCHECK_SEED")) seed = std::strtoull(env, nullptr, 0);
    std::cout << "[ seed     ] KVCHECK_SEED=" << seed << "\n";
    ::testing::Test::RecordProperty("seed", std::to_string(seed));
    return seed;
}

// A windowed or latent cache: layer 0 has window W (0: none), layer 1 full attention (Gemma's interleaving).
struct Shape {
    const char* name;
    uint32_t nq, nkv, dk, dv, dtype, rope, rope_begin, rope_dims, block, window, sinks, evict;
};

struct Config {
    kvc_config cfg{};
    uint32_t windows[2] = {0, 0};
    explicit Config(const Shape& s) {
        cfg.struct_size = sizeof cfg;
        cfg.n_layers = 2;
        cfg.n_q_heads = s.nq;
        cfg.n_kv_heads = s.nkv;
        cfg.head_dim = s.dk;
        cfg.head_dim_v = s.dv == s.dk ? 0 : s.dv;
        cfg.cache_dtype = s.dtype;
        cfg.max_seqs = 4;
        cfg.scale = 1.0f / std::sqrt(static_cast<float>(s.dk));
        cfg.rope = s.rope;
        cfg.rope_theta = 10000.0f;
        cfg.rope_dim_begin = s.rope_begin;
        cfg.rope_dims = s.rope_dims;
        cfg.block_size_hint = s.block;
        cfg.int8_scale_dtype = KVC_DTYPE_F32;
        windows[0] = s.window;
        cfg.windows = s.window != 0 ? windows : nullptr;
        cfg.n_sinks = s.sinks;
        cfg.evict = s.evict;
    }
    Config(const Config&) = delete;
};

// One stream's inputs: q, k [T][heads][dk], v [T][n_kv_heads][dv].
struct Inputs {
    uint32_t nq, nkv, dk, dv;
    std::vector<float> q, k, v;
    Inputs(const Shape& s, uint32_t tokens, std::mt19937_64& gen) : nq(s.nq), nkv(s.nkv), dk(s.dk), dv(s.dv) {
        std::normal_distribution<float> dist(0.0f, 1.0f);
        auto fill = [&](std::vector<float>& x, size_t n) {
            x.resize(n);
            for (float& e : x) e = dist(gen);
        };
        fill(q, static_cast<size_t>(tokens) * nq * dk);
        fill(k, static_cast<size_t>(tokens) * nkv * dk);
        fill(v, static_cast<size_t>(tokens) * nkv * dv);
    }
    // tokens [t0, t1) to seq as one call; the outputs [t1 - t0][nq][dv]
    std::vector<float> feed(kvc::Cache& c, uint32_t seq, uint32_t layer, uint32_t t0, uint32_t t1) const {
        std::vector<float> out(static_cast<size_t>(t1 - t0) * nq * dv);
        c.append_attend(seq, layer, t1 - t0, q.data() + static_cast<size_t>(t0) * nq * dk,
                        k.data() + static_cast<size_t>(t0) * nkv * dk, v.data() + static_cast<size_t>(t0) * nkv * dv,
                        out.data());
        return out;
    }
};

// The engine's accuracy promise (docs/engine.md, "Accuracy"), twice over between two engines.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), 2.0 * (5e-6 + 1e-5 * std::fabs(want[i])))
            << what << " element " << i << ": " << got[i] << " vs " << want[i];
}

void expect_same_memory(kvc::Cache& gpu, kvc::Cache& cpu, const std::string& what) {
    const kvc_memory a = gpu.memory(), b = cpu.memory();
    EXPECT_EQ(a.block_size, b.block_size) << what;
    EXPECT_EQ(a.live_bytes, b.live_bytes) << what << ": the rows held (evicted ones not counted)";
    EXPECT_EQ(a.capacity_bytes, b.capacity_bytes) << what << ": the blocks held (freed ones not counted)";
}

// read_kv of every block-sized range of both layers: the same status in both engines (KVC_ERR_EVICTED for the
// dropped rows), and where read, the same bytes (K only without RoPE: the device's double angles may move a stored
// rotated element by one unit of the dtype, which test_cuda_engine's CudaVsCpu bounds).
void expect_same_rows(kvc::Cache& gpu, kvc::Cache& cpu, const Shape& s, uint32_t seq, uint32_t length) {
    const size_t es = kvc::dtype_size(s.dtype);
    const size_t krow = static_cast<size_t>(s.nkv) * s.dk * es, vrow = static_cast<size_t>(s.nkv) * s.dv * es;
    uint32_t evicted = 0;
    for (uint32_t layer = 0; layer < 2; ++layer)
        for (uint32_t pos = 0; pos < length; pos += s.block) {
            const uint32_t n = std::min(s.block, length - pos);
            std::vector<uint8_t> gk(n * krow), gv(n * vrow), ck(n * krow), cv(n * vrow);
            const kvc_status a = gpu.api()->read_kv(gpu.get(), seq, layer, pos, n, gk.data(), gv.data());
            const kvc_status b = cpu.api()->read_kv(cpu.get(), seq, layer, pos, n, ck.data(), cv.data());
            ASSERT_EQ(a, b) << "read_kv of rows " << pos << ".." << pos + n - 1 << " of layer " << layer << ": "
                            << gpu.api()->last_error(gpu.get());
            if (a == KVC_ERR_EVICTED) {
                ++evicted;
                continue;
            }
            ASSERT_EQ(a, KVC_OK);
            EXPECT_EQ(gv, cv) << "V rows " << pos << ".. of layer " << layer;
            if (s.rope == KVC_ROPE_NONE) {
                EXPECT_EQ(gk, ck) << "K rows " << pos << ".. of layer " << layer;
            }
        }
    if (s.evict) {
        EXPECT_GT(evicted, 0u) << "an evicting cache of " << length << " rows dropped nothing";
    }
}

class CudaWindow : public ::testing::TestWithParam<Shape> {};

// A prompt in uneven chunks (rows of one chunk straddle the window's edge, each with its own window), then decode
// steps past the 1,024-key segment boundary (the spread decode visits the sinks' and the window's segments only),
// both layers; then a fork that goes on apart from its parent, and the releases.
TEST_P(CudaWindow, MatchesTheCpuEngineRowsMemoryAndOutputs) {
    SKIP_WITHOUT_DEVICE();
    const Shape s = GetParam();
    const Config c(s);
    std::mt19937_64 gen(test_seed(20261207));
    const uint32_t prompt = 1100, steps = 40, total = prompt + steps + 20;
    const Inputs in(s, total, gen);
    kvc::Cache gpu(cuda_api(), c.cfg), cpu(cpu_api(), c.cfg);
    auto both = [&](uint32_t seq, uint32_t t0, uint32_t t1, const std::string& what) {
        for (uint32_t layer = 0; layer < 2; ++layer)
            expect_close(in.feed(gpu, seq, layer, t0, t1), in.feed(cpu, seq, layer, t0, t1),
                         what + " layer " + std::to_string(layer) + " tokens " + std::to_string(t0) + ".." +
                             std::to_string(t1 - 1));
        expect_same_memory(gpu, cpu, what + " after tokens .." + std::to_string(t1 - 1));
    };
    for (uint32_t t0 = 0; t0 < prompt;) {
        const uint32_t t1 = std::min(prompt, t0 + 1 + (t0 * 7 + 300) % 513);
        both(0, t0, t1, s.name);
        t0 = t1;
    }
    for (uint32_t t = prompt; t < prompt + steps; ++t) both(0, t, t + 1, s.name);
    expect_same_rows(gpu, cpu, s, 0, prompt + steps);

    gpu.fork(0, 1);
    cpu.fork(0, 1);
    expect_same_memory(gpu, cpu, std::string(s.name) + " after fork");
    for (uint32_t t = prompt + steps; t < total; ++t) both(1, t, t + 1, std::string(s.name) + " child");
    expect_same_rows(gpu, cpu, s, 1, total);
    gpu.release(0);
    cpu.release(0);
    expect_same_memory(gpu, cpu, std::string(s.name) + " after the parent's release");
    gpu.release(1);
    cpu.release(1);
    EXPECT_EQ(gpu.memory().capacity_bytes, 0u) << "every block back after both releases";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaWindow,
    ::testing::Values(
        // name, nq, nkv, dk, dv, dtype, rope, rope_begin, rope_dims, block, window, sinks, evict
        Shape{"f32_w16_s4_evict", 8, 2, 64, 64, KVC_DTYPE_F32, KVC_ROPE_NEOX, 0, 0, 16, 16, 4, 1},
        Shape{"bf16_w33_s0_evict_b7", 8, 2, 64, 64, KVC_DTYPE_BF16, KVC_ROPE_GPTJ, 0, 0, 7, 33, 0, 1},
        Shape{"f16_w1_s1_evict_b1", 4, 4, 32, 32, KVC_DTYPE_F16, KVC_ROPE_NEOX, 0, 0, 1, 1, 1, 1},
        Shape{"f32_w300_s17_masked", 8, 2, 64, 64, KVC_DTYPE_F32, KVC_ROPE_NEOX, 0, 0, 16, 300, 17, 0},
        Shape{"f16_w1000_s2_evict", 8, 2, 64, 64, KVC_DTYPE_F16, KVC_ROPE_NONE, 0, 0, 16, 1000, 2, 1},
        Shape{"int8_w64_s4_evict", 8, 2, 64, 64, KVC_DTYPE_INT8_TOKEN, KVC_ROPE_NONE, 0, 0, 16, 64, 4, 1},
        Shape{"q8_0_w17_s16_evict", 8, 2, 64, 64, KVC_DTYPE_Q8_0, KVC_ROPE_NONE, 0, 0, 16, 17, 16, 1},
        Shape{"fp8_w40_s2_evict", 8, 2, 64, 64, KVC_DTYPE_FP8_E4M3, KVC_ROPE_NONE, 0, 0, 8, 40, 2, 1},
        // latent: MLA's K 576 / V 512, one KV head, RoPE on the last 64 dims; with and without a window
        Shape{"mla_bf16", 8, 1, 576, 512, KVC_DTYPE_BF16, KVC_ROPE_NEOX, 512, 64, 16, 0, 0, 0},
        Shape{"mla_f32_w64_s4_evict", 4, 1, 576, 512, KVC_DTYPE_F32, KVC_ROPE_GPTJ, 512, 64, 16, 64, 4, 1},
        Shape{"mla_q8_0", 2, 1, 576, 512, KVC_DTYPE_Q8_0, KVC_ROPE_NONE, 0, 0, 16, 0, 0, 0},
        Shape{"dv_wider_f16_range", 6, 2, 48, 80, KVC_DTYPE_F16, KVC_ROPE_NEOX, 8, 16, 16, 0, 0, 0}),
    [](const ::testing::TestParamInfo<Shape>& i) { return std::string(i.param.name); });

// The determinism rule with windows: a row's output is the same bits whether its tokens came one by one (spread
// decode), in chunks of 97 that straddle the window's edge, or in one prefill; with eviction too, and MLA-shaped.
TEST(CudaWindowEngine, ChunkingDoesNotChangeABit) {
    SKIP_WITHOUT_DEVICE();
    for (const Shape& s : {Shape{"w40_s2_evict", 8, 2, 64, 64, KVC_DTYPE_BF16, KVC_ROPE_NEOX, 0, 0, 16, 40, 2, 1},
                           Shape{"mla_w300_s4_evict", 8, 1, 576, 512, KVC_DTYPE_F16, KVC_ROPE_NEOX, 512, 64, 16, 300, 4, 1}}) {
        const Config c(s);
        std::mt19937_64 gen(test_seed(20261208));
        const uint32_t total = 1100;
        const Inputs in(s, total, gen);
        auto run = [&](uint32_t chunk) {
            kvc::Cache cache(cuda_api(), c.cfg);
            std::vector<float> out;
            for (uint32_t t0 = 0; t0 < total; t0 += chunk) {
                const std::vector<float> a = in.feed(cache, 0, 0, t0, std::min(total, t0 + chunk));
                out.insert(out.end(), a.begin(), a.end());
            }
            return out;
        };
        const std::vector<float> whole = run(total);
        for (uint32_t chunk : {1u, 97u}) {
            const std::vector<float> got = run(chunk);
            ASSERT_EQ(got.size(), whole.size());
            for (size_t i = 0; i < got.size(); ++i) {
                uint32_t a, b;
                std::memcpy(&a, &got[i], 4);
                std::memcpy(&b, &whole[i], 4);
                ASSERT_EQ(a, b) << s.name << ": chunks of " << chunk << " vs one prefill, element " << i;
            }
        }
    }
}

// Runs everywhere: the caps are the table's. Windows with any W and any number of sinks, eviction, head_dim_v and
// RoPE ranges, heads (K and V) up to MLA's 576.
TEST(CudaWindowCaps, DeclareWindowsSinksEvictionAndLatentShapesUpTo576) {
    kvc_caps caps{};
    caps.struct_size = sizeof caps;
    cuda_api()->get_caps(&caps);
    const uint32_t want = KVC_FEATURE_WINDOW | KVC_FEATURE_SINKS | KVC_FEATURE_EVICT | KVC_FEATURE_HEAD_DIM_V |
                          KVC_FEATURE_ROPE_RANGE;
    EXPECT_EQ(caps.features & want, want);
    EXPECT_EQ(caps.max_window, 0u) << "any window";
    EXPECT_EQ(caps.max_sinks, 0u) << "any number of sinks";
    EXPECT_EQ(caps.max_head_dim, 576u);
    EXPECT_EQ(caps.max_head_dim_v, 576u);
    EXPECT_NE(caps.features & KVC_FEATURE_FORK_SHARES, 0u) << "fork shares blocks (copy on write), as the CPU engine's";
}

// Runs everywhere: windowed and latent configs are judged before the device is asked for, as the CPU engine judges
// them; a good one is refused only for want of a device.
TEST(CudaWindowCaps, ConfigsAreJudgedLikeTheCpuEnginesWithOrWithoutADevice) {
    struct Case {
        const char* what;
        Shape shape;
        uint32_t evict; // overrides the shape's (2: not 0 or 1)
        bool good;
    };
    const Case cases[] = {
        {"a window with sinks and eviction", {"", 8, 2, 64, 64, KVC_DTYPE_F16, KVC_ROPE_NEOX, 0, 0, 16, 16, 4, 1}, 1, true},
        {"MLA 576 / 512", {"", 8, 1, 576, 512, KVC_DTYPE_BF16, KVC_ROPE_NEOX, 512, 64, 16, 0, 0, 0}, 0, true},
        {"eviction without a window", {"", 8, 2, 64, 64, KVC_DTYPE_F16, KVC_ROPE_NEOX, 0, 0, 16, 0, 0, 1}, 1, false},
        {"evict 2", {"", 8, 2, 64, 64, KVC_DTYPE_F16, KVC_ROPE_NEOX, 0, 0, 16, 16, 0, 0}, 2, false},
        {"a RoPE range past the head", {"", 8, 1, 64, 32, KVC_DTYPE_F32, KVC_ROPE_NEOX, 40, 32, 16, 0, 0, 0}, 0, false},
        {"head_dim_v over 576", {"", 8, 1, 64, 640, KVC_DTYPE_F32, KVC_ROPE_NONE, 0, 0, 16, 0, 0, 0}, 0, false},
        {"head_dim over 576", {"", 8, 1, 640, 64, KVC_DTYPE_F32, KVC_ROPE_NONE, 0, 0, 16, 0, 0, 0}, 0, false},
        {"q8_0 with a head_dim_v not a multiple of 32", {"", 8, 1, 64, 48, KVC_DTYPE_Q8_0, KVC_ROPE_NONE, 0, 0, 16, 0, 0, 0}, 0, false},
    };
    for (const Case& k : cases) {
        Config c(k.shape);
        c.cfg.evict = k.evict;
        kvc_cache* cache = nullptr;
        const kvc_status st = cuda_api()->create(&c.cfg, &cache);
        const std::string why = cuda_api()->last_error(nullptr);
        kvc_cache* on_cpu = nullptr;
        const kvc_status cpu_st = cpu_api()->create(&c.cfg, &on_cpu);
        if (on_cpu) cpu_api()->destroy(on_cpu);
        if (!k.good) {
            EXPECT_NE(st, KVC_OK) << k.what;
            EXPECT_EQ(st, cpu_st) << k.what << ": as the CPU engine";
            EXPECT_EQ(why.find("CUDA"), std::string::npos) << k.what << ": judged before the device: " << why;
        } else if (kvc_cuda_engine_unavailable()) {
            EXPECT_EQ(cpu_st, KVC_OK) << k.what;
            EXPECT_EQ(st, KVC_ERR_UNSUPPORTED) << k.what;
            EXPECT_NE(why.find("CUDA"), std::string::npos) << k.what << ": " << why;
        } else {
            EXPECT_EQ(st, KVC_OK) << k.what << ": " << why;
        }
        if (cache) cuda_api()->destroy(cache);
    }
}

} // namespace
