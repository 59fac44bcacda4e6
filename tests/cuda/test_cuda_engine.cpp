// The CUDA engine through the ABI, on a GPU: its outputs against the CPU engine's and the reference's on the same
// cases (GQA, RoPE NeoX/GPT-J, f16/bf16, block sizes 1/16/256, chunked prefill, fork with copy-on-write, release),
// read_kv round trips, the memory formula, and determinism (bitwise the same with other batch neighbours, another
// chunking, and on repetition). Without a usable device every test skips with the CUDA error as its reason.
// Random inputs print their seed (KVCHECK_SEED=N replays). Label `cuda`; tools/gpu-check.sh runs it on a GPU.
#include "kvcheck/abi.hpp"
#include "kvcheck/optimized/cpu_engine.h"
#include "kvcheck/optimized/cuda_engine.h"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/quantize.hpp"
#include "kvcheck/reference/rope.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

#define SKIP_WITHOUT_DEVICE()                                                                                          \
    do {                                                                                                               \
        if (const char* why = kvc_cuda_engine_unavailable()) GTEST_SKIP() << why;                                      \
    } while (0)

// This program holds two CUDA runtimes: its own engine's (linked in) and the plugin's (PluginModuleExportsTheEngine
// loads the module, which brings its own). On the H200 of 2026-12-04, when the plugin's runtime reached the device
// first, this program's own first call then failed with cudaErrorInitializationError, and every later test skipped
// as if there were no device. So this program's engine meets the device first, before any test, whatever the
// filter or the order.
class OwnRuntimeFirst : public ::testing::Environment {
  public:
    void SetUp() override { (void)kvc_cuda_engine_unavailable(); }
};
::testing::Environment* const own_runtime_first = ::testing::AddGlobalTestEnvironment(new OwnRuntimeFirst);

uint64_t test_seed(uint64_t fallback) {
    uint64_t seed = fallback;
    if (const char* env = std::getenv("KVCHECK_SEED")) seed = std::strtoull(env, nullptr, 0);
    std::cout << "[ seed     ] KVCHECK_SEED=" << seed << "\n";
    ::testing::Test::RecordProperty("seed", std::to_string(seed));
    return seed;
}

const kvc_plugin_api* cuda_api() { return kvc_cuda_engine_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }
const kvc_plugin_api* cpu_api() { return kvc_cpu_engine_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR); }

kvc_config make_config(uint32_t nq, uint32_t nkv, uint32_t d, uint32_t dtype, uint32_t rope, uint32_t block,
                       uint32_t layers = 1, uint32_t seqs = 4) {
    kvc_config c{};
    c.struct_size = sizeof c;
    c.n_layers = layers;
    c.n_q_heads = nq;
    c.n_kv_heads = nkv;
    c.head_dim = d;
    c.cache_dtype = dtype;
    c.max_seqs = seqs;
    c.max_tokens = 0;
    c.scale = 1.0f / std::sqrt(static_cast<float>(d));
    c.rope = rope;
    c.rope_theta = 10000.0f;
    c.block_size_hint = block;
    return c;
}

std::vector<float> normal(std::mt19937_64& gen, size_t n) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& e : x) e = dist(gen);
    return x;
}

// One stream's whole history (f32 inputs as given), and the reference output of query token t of it.
struct History {
    kvc_config cfg;
    std::vector<float> q, k, v; // [T][heads][d]
    // softmax(q_t . k_j * scale) . v over j <= t, in long double: q and k rotated by their positions in long
    // double, k rounded to float and then to the cache dtype (what the cache stores), v rounded to the dtype.
    std::vector<float> reference(uint32_t t) const {
        const uint32_t d = cfg.head_dim, nq = cfg.n_q_heads, nkv = cfg.n_kv_heads, group = nq / nkv;
        const auto variant = static_cast<kvc::ref::Rope>(cfg.rope);
        std::vector<float> out(static_cast<size_t>(nq) * d);
        for (uint32_t h = 0; h < nq; ++h) {
            const uint32_t g = h / group;
            std::vector<long double> qr(q.begin() + (static_cast<size_t>(t) * nq + h) * d,
                                        q.begin() + (static_cast<size_t>(t) * nq + h + 1) * d);
            kvc::ref::apply_rope<long double>(qr.data(), static_cast<int>(d), t, variant, cfg.rope_theta);
            std::vector<long double> s(t + 1), acc(d, 0.0L);
            long double mx = -INFINITY, l = 0.0L;
            for (uint32_t j = 0; j <= t; ++j) {
                std::vector<long double> kr(k.begin() + (static_cast<size_t>(j) * nkv + g) * d,
                                            k.begin() + (static_cast<size_t>(j) * nkv + g + 1) * d);
                kvc::ref::apply_rope<long double>(kr.data(), static_cast<int>(d), j, variant, cfg.rope_theta);
                long double dot = 0.0L;
                for (uint32_t c = 0; c < d; ++c)
                    dot += qr[c] * kvc::ref::round_to_dtype(static_cast<float>(kr[c]), cfg.cache_dtype);
                s[j] = dot * cfg.scale;
                mx = std::max(mx, s[j]);
            }
            for (uint32_t j = 0; j <= t; ++j) {
                const long double p = std::exp(s[j] - mx);
                l += p;
                for (uint32_t c = 0; c < d; ++c)
                    acc[c] += p * kvc::ref::round_to_dtype(v[(static_cast<size_t>(j) * nkv + g) * d + c], cfg.cache_dtype);
            }
            for (uint32_t c = 0; c < d; ++c) out[static_cast<size_t>(h) * d + c] = static_cast<float>(acc[c] / l);
        }
        return out;
    }
};

History make_history(const kvc_config& cfg, uint32_t tokens, std::mt19937_64& gen) {
    History h{cfg, {}, {}, {}};
    h.q = normal(gen, static_cast<size_t>(tokens) * cfg.n_q_heads * cfg.head_dim);
    h.k = normal(gen, static_cast<size_t>(tokens) * cfg.n_kv_heads * cfg.head_dim);
    h.v = normal(gen, static_cast<size_t>(tokens) * cfg.n_kv_heads * cfg.head_dim);
    return h;
}

// Feeds tokens [t0, t1) of h to seq as one call; returns the outputs.
std::vector<float> feed(kvc::Cache& c, uint32_t seq, const History& h, uint32_t t0, uint32_t t1, uint32_t layer = 0) {
    const size_t qn = static_cast<size_t>(h.cfg.n_q_heads) * h.cfg.head_dim, kn = static_cast<size_t>(h.cfg.n_kv_heads) * h.cfg.head_dim;
    std::vector<float> out((t1 - t0) * qn);
    c.append_attend(seq, layer, t1 - t0, h.q.data() + t0 * qn, h.k.data() + t0 * kn, h.v.data() + t0 * kn, out.data());
    return out;
}

// The engine's accuracy promise (docs/engine.md, "Accuracy"), for the reference; twice that between two engines.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double factor, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), factor * (5e-6 + 1e-5 * std::fabs(want[i])))
            << what << " element " << i << ": " << got[i] << " vs " << want[i];
}

uint32_t bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits(a[i]), bits(b[i])) << what << " element " << i;
}

TEST(CudaEngine, UnavailableDeviceFailsCreateCleanly) {
    const char* why = kvc_cuda_engine_unavailable();
    if (!why) GTEST_SKIP() << "a device is usable here: the no-device path is not reachable";
    kvc_config c = make_config(4, 2, 16, KVC_DTYPE_F32, KVC_ROPE_NONE, 16);
    kvc_cache* cache = nullptr;
    EXPECT_EQ(cuda_api()->create(&c, &cache), KVC_ERR_UNSUPPORTED);
    EXPECT_EQ(cache, nullptr);
    EXPECT_NE(std::string(cuda_api()->last_error(nullptr)).find("CUDA"), std::string::npos)
        << cuda_api()->last_error(nullptr);
}

// The loadable module, as a third party's harness loads it: one export, the same table; without a device its
// create fails cleanly with the reason, with one it creates and destroys a cache.
// Where the module is: KVCHECK_CUDA_PLUGIN when set, the build's path, or next to this program or in ../lib (a
// bundle carried to a GPU machine keeps the build's layout but not its absolute path).
std::string plugin_path() {
    if (const char* env = std::getenv("KVCHECK_CUDA_PLUGIN")) return env;
    std::vector<std::string> candidates = {KVCHECK_CUDA_PLUGIN_PATH};
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        std::string dir(self, static_cast<size_t>(n));
        dir = dir.substr(0, dir.find_last_of('/'));
        candidates.push_back(dir + "/libkvcheck_cuda_engine_plugin.so");
        candidates.push_back(dir + "/../lib/libkvcheck_cuda_engine_plugin.so");
    }
    for (const std::string& c : candidates)
        if (access(c.c_str(), R_OK) == 0) return c;
    return candidates.front();
}

TEST(CudaEngine, PluginModuleExportsTheEngine) {
    const std::string path = plugin_path();
    void* so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(so, nullptr) << dlerror() << " (set KVCHECK_CUDA_PLUGIN to the module's path)";
    const auto entry = reinterpret_cast<kvc_entry_fn>(dlsym(so, KVC_ENTRY_SYMBOL));
    ASSERT_NE(entry, nullptr) << dlerror();
    const kvc_plugin_api* api = entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    ASSERT_NE(api, nullptr);
    EXPECT_EQ(entry(KVC_ABI_VERSION_MAJOR + 1, 0), nullptr) << "another major version is refused";
    EXPECT_STREQ(api->name, "kvcheck-cuda");
    kvc_caps caps{};
    caps.struct_size = sizeof caps;
    api->get_caps(&caps);
    EXPECT_EQ(caps.memory_space, static_cast<uint32_t>(KVC_MEMORY_DEVICE));
    const kvc_config c = make_config(4, 2, 16, KVC_DTYPE_BF16, KVC_ROPE_GPTJ, 16);
    kvc_cache* cache = nullptr;
    const kvc_status st = api->create(&c, &cache);
    if (kvc_cuda_engine_unavailable()) {
        EXPECT_EQ(st, KVC_ERR_UNSUPPORTED);
        EXPECT_EQ(cache, nullptr);
        EXPECT_NE(std::string(api->last_error(nullptr)).find("no CUDA device"), std::string::npos)
            << api->last_error(nullptr);
    } else {
        ASSERT_EQ(st, KVC_OK) << api->last_error(nullptr);
        api->destroy(cache);
    }
    dlclose(so);
}

// Runs everywhere: the caps are the table's, no device needed. The quantized dtypes and every scale form, as the
// CPU engine declares them (ABI 1.2), and read_kv_scales is provided.
TEST(CudaEngine, CapsDeclareDeviceMemoryTheF32ClassAndTheQuantizedDtypes) {
    kvc_caps caps{};
    caps.struct_size = sizeof caps;
    cuda_api()->get_caps(&caps);
    EXPECT_EQ(caps.memory_space, static_cast<uint32_t>(KVC_MEMORY_DEVICE));
    EXPECT_EQ(caps.precision, static_cast<uint32_t>(KVC_PRECISION_F32));
    EXPECT_EQ(caps.dtypes, 0x7fu) << "f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8_token, q8_0";
    EXPECT_EQ(caps.quant, KVC_QUANT_FP8_SCALE_TENSOR | KVC_QUANT_FP8_SCALE_KV_HEAD | KVC_QUANT_INT8_SCALE_F16);
    kvc_caps cpu{};
    cpu.struct_size = sizeof cpu;
    cpu_api()->get_caps(&cpu);
    EXPECT_EQ(caps.dtypes, cpu.dtypes);
    EXPECT_EQ(caps.quant, cpu.quant);
    EXPECT_TRUE(KVC_API_HAS(cuda_api(), read_kv_scales));
    EXPECT_NE(cuda_api()->read_kv_scales, nullptr);
}

// Runs everywhere: a quantized config is judged before the device is asked for (the CPU engine's checks, shared),
// so a bad one is refused for what it is with or without a GPU; a good one is refused only for want of a device.
TEST(CudaEngine, QuantizedConfigsAreJudgedWithOrWithoutADevice) {
    const float scales[4] = {0.5f, 0.25f, 0.0f, 1.0f};
    struct Bad {
        const char* what;
        kvc_status status;
        kvc_config cfg;
    };
    std::vector<Bad> bad;
    kvc_config c = make_config(4, 2, 48, KVC_DTYPE_Q8_0, KVC_ROPE_NONE, 16);
    bad.push_back({"q8_0 needs a head_dim multiple of 32", KVC_ERR_UNSUPPORTED, c});
    c = make_config(4, 2, 64, KVC_DTYPE_FP8_E4M3, KVC_ROPE_NEOX, 16, 2);
    c.kv_scale_mode = KVC_SCALE_KV_HEAD;
    bad.push_back({"KV_HEAD scales missing", KVC_ERR_INVALID_ARGUMENT, c});
    c.k_scales = scales; // [2][2]: the third is 0
    c.v_scales = scales;
    bad.push_back({"a zero scale", KVC_ERR_INVALID_ARGUMENT, c});
    c.kv_scale_mode = 3;
    bad.push_back({"an unknown scale mode", KVC_ERR_INVALID_ARGUMENT, c});
    c = make_config(4, 2, 64, KVC_DTYPE_INT8_TOKEN, KVC_ROPE_NEOX, 16);
    c.int8_scale_dtype = KVC_DTYPE_BF16;
    bad.push_back({"a bf16 int8 scale", KVC_ERR_UNSUPPORTED, c});
    c.int8_scale_dtype = KVC_DTYPE_F16;
    c.struct_size = static_cast<uint32_t>(offsetof(kvc_config, int8_scale_dtype));
    bad.push_back({"the config of ABI 1.1", KVC_ERR_INVALID_ARGUMENT, c});
    c = make_config(4, 2, 64, 7, KVC_ROPE_NEOX, 16);
    bad.push_back({"an unknown dtype", KVC_ERR_UNSUPPORTED, c});
    for (const Bad& b : bad) {
        kvc_cache* cache = nullptr;
        EXPECT_EQ(cuda_api()->create(&b.cfg, &cache), b.status) << b.what << ": " << cuda_api()->last_error(nullptr);
        EXPECT_EQ(cache, nullptr) << b.what;
        const std::string why = cuda_api()->last_error(nullptr);
        EXPECT_EQ(why.find("CUDA"), std::string::npos) << b.what << ": judged before the device: " << why;
        kvc_cache* on_cpu = nullptr;
        EXPECT_EQ(cpu_api()->create(&b.cfg, &on_cpu), b.status) << b.what << ": as the CPU engine";
        if (on_cpu) cpu_api()->destroy(on_cpu);
    }
    for (const uint32_t dtype : {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2, KVC_DTYPE_INT8_TOKEN, KVC_DTYPE_Q8_0}) {
        kvc_config good = make_config(4, 2, 64, dtype, KVC_ROPE_NEOX, 16, 2);
        if (dtype == KVC_DTYPE_FP8_E4M3) {
            good.kv_scale_mode = KVC_SCALE_TENSOR;
            good.k_scales = scales;
            good.v_scales = scales; // [2]: 0.5, 0.25
        }
        good.int8_scale_dtype = KVC_DTYPE_F16;
        kvc_cache* cache = nullptr;
        const kvc_status st = cuda_api()->create(&good, &cache);
        if (kvc_cuda_engine_unavailable()) {
            EXPECT_EQ(st, KVC_ERR_UNSUPPORTED) << dtype;
            EXPECT_NE(std::string(cuda_api()->last_error(nullptr)).find("CUDA"), std::string::npos)
                << cuda_api()->last_error(nullptr);
        } else {
            EXPECT_EQ(st, KVC_OK) << dtype << ": " << cuda_api()->last_error(nullptr);
            if (cache) cuda_api()->destroy(cache);
        }
    }
}

// (n_q_heads, n_kv_heads, head_dim, dtype, rope, block size)
using Shape = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
class CudaVsCpu : public ::testing::TestWithParam<Shape> {};

// A prompt in chunks, then decode steps past the 1,024-key segment boundary (spread decode and its merge):
// every output within the promise of the reference at sampled positions, within twice that of the CPU engine at
// every position.
TEST_P(CudaVsCpu, OutputsMatchTheCpuEngineAndTheReference) {
    SKIP_WITHOUT_DEVICE();
    const auto [nq, nkv, d, dtype, rope, block] = GetParam();
    const kvc_config cfg = make_config(nq, nkv, d, dtype, rope, block);
    std::mt19937_64 gen(test_seed(20261130));
    const uint32_t prompt = 1100, steps = 40, total = prompt + steps;
    const History h = make_history(cfg, total, gen);
    kvc::Cache gpu(cuda_api(), cfg), cpu(cpu_api(), cfg);
    std::vector<float> got, want;
    for (uint32_t t0 = 0; t0 < prompt;) { // chunked prefill: uneven chunks, across split and segment boundaries
        const uint32_t t1 = std::min(prompt, t0 + 1 + (t0 * 7 + 300) % 513);
        const std::vector<float> a = feed(gpu, 0, h, t0, t1), b = feed(cpu, 0, h, t0, t1);
        got.insert(got.end(), a.begin(), a.end());
        want.insert(want.end(), b.begin(), b.end());
        t0 = t1;
    }
    for (uint32_t t = prompt; t < total; ++t) {
        const std::vector<float> a = feed(gpu, 0, h, t, t + 1), b = feed(cpu, 0, h, t, t + 1);
        got.insert(got.end(), a.begin(), a.end());
        want.insert(want.end(), b.begin(), b.end());
    }
    expect_close(got, want, 2.0, "cuda vs cpu");
    const size_t qn = static_cast<size_t>(nq) * d;
    for (uint32_t t : {0u, 1u, 255u, 256u, 1023u, 1024u, 1099u, 1100u, total - 1}) {
        const std::vector<float> ref = h.reference(t);
        expect_close(std::vector<float>(got.begin() + t * qn, got.begin() + (t + 1) * qn), ref, 1.0,
                     "cuda vs reference at token " + std::to_string(t));
    }
    // read_kv: the same stored rows as the CPU engine (bit for bit without RoPE; RoPE angles in double on the
    // device against long double on the CPU may move a stored element by one unit of the dtype)
    const size_t row = static_cast<size_t>(nkv) * d * kvc::dtype_size(dtype);
    std::vector<uint8_t> gk(total * row), gv(total * row), ck(total * row), cv(total * row);
    gpu.read_kv(0, 0, 0, total, gk.data(), gv.data());
    cpu.read_kv(0, 0, 0, total, ck.data(), cv.data());
    EXPECT_EQ(gv, cv);
    if (rope == KVC_ROPE_NONE) {
        EXPECT_EQ(gk, ck);
    } else {
        const size_t es = kvc::dtype_size(dtype);
        for (size_t i = 0; i < gk.size(); i += es) {
            int64_t a = 0, b = 0;
            std::memcpy(&a, &gk[i], es);
            std::memcpy(&b, &ck[i], es);
            ASSERT_LE(std::llabs(a - b), 1) << "stored K element " << i / es;
        }
    }
    const kvc_memory mem = gpu.memory();
    const uint64_t block_bytes = 2ull * nkv * block * d * kvc::dtype_size(dtype);
    EXPECT_EQ(mem.live_bytes, 2ull * total * nkv * d * kvc::dtype_size(dtype));
    EXPECT_EQ(mem.capacity_bytes, (total + block - 1) / block * block_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaVsCpu,
    ::testing::Values(Shape{8, 2, 64, KVC_DTYPE_F32, KVC_ROPE_NEOX, 16}, Shape{8, 2, 64, KVC_DTYPE_F16, KVC_ROPE_GPTJ, 16},
                      Shape{8, 2, 64, KVC_DTYPE_BF16, KVC_ROPE_NEOX, 1}, Shape{4, 4, 128, KVC_DTYPE_BF16, KVC_ROPE_NONE, 256},
                      Shape{6, 2, 16, KVC_DTYPE_F16, KVC_ROPE_NEOX, 7}, Shape{32, 1, 128, KVC_DTYPE_F32, KVC_ROPE_GPTJ, 16},
                      Shape{2, 1, 256, KVC_DTYPE_BF16, KVC_ROPE_NEOX, 16},
                      // rows that are not a whole number of 16-byte pieces: staged element by element
                      Shape{4, 2, 12, KVC_DTYPE_F16, KVC_ROPE_NEOX, 16}, Shape{3, 1, 7, KVC_DTYPE_BF16, KVC_ROPE_NONE, 5}));

// Chunking, batch neighbours and repetition do not change a bit (docs/cuda-engine.md, the determinism rule).
TEST(CudaEngine, ChunkingNeighboursAndRepetitionDoNotChangeABit) {
    SKIP_WITHOUT_DEVICE();
    const kvc_config cfg = make_config(8, 2, 64, KVC_DTYPE_BF16, KVC_ROPE_NEOX, 16);
    std::mt19937_64 gen(test_seed(20261130));
    const uint32_t total = 1300;
    const History h = make_history(cfg, total, gen), other = make_history(cfg, total, gen);
    const size_t qn = 8 * 64, kn = 2 * 64;
    auto run_alone = [&](uint32_t chunk) {
        kvc::Cache c(cuda_api(), cfg);
        std::vector<float> out;
        for (uint32_t t0 = 0; t0 < total; t0 += chunk) {
            const std::vector<float> a = feed(c, 0, h, t0, std::min(total, t0 + chunk));
            out.insert(out.end(), a.begin(), a.end());
        }
        return out;
    };
    const std::vector<float> whole = run_alone(total);
    expect_bitwise(run_alone(1), whole, "one token at a time vs one prefill");
    expect_bitwise(run_alone(97), whole, "chunks of 97 vs one prefill");
    expect_bitwise(run_alone(total), whole, "repetition");
    // the same sequence (id 2) in batches with neighbours of other lengths, one token per step
    kvc::Cache c(cuda_api(), cfg);
    feed(c, 0, other, 0, 700);
    std::vector<float> batched;
    for (uint32_t t = 0; t < total; ++t) {
        const uint32_t n0 = t % 3; // 0..2 tokens of the neighbour in this step
        const uint32_t seq_ids[2] = {0, 2};
        const uint32_t offsets[3] = {0, n0, n0 + 1};
        std::vector<float> q((n0 + 1) * qn), k((n0 + 1) * kn), v((n0 + 1) * kn), out((n0 + 1) * qn);
        std::copy_n(other.q.begin(), n0 * qn, q.begin());
        std::copy_n(other.k.begin(), n0 * kn, k.begin());
        std::copy_n(other.v.begin(), n0 * kn, v.begin());
        std::copy_n(h.q.begin() + t * qn, qn, q.begin() + n0 * qn);
        std::copy_n(h.k.begin() + t * kn, kn, k.begin() + n0 * kn);
        std::copy_n(h.v.begin() + t * kn, kn, v.begin() + n0 * kn);
        kvc_batch b{};
        b.struct_size = sizeof b;
        b.n_seqs = 2;
        b.seq_ids = seq_ids;
        b.token_offsets = offsets;
        b.q = q.data();
        b.k = k.data();
        b.v = v.data();
        b.out = out.data();
        c.append_attend_batch(0, b);
        batched.insert(batched.end(), out.begin() + n0 * qn, out.end());
    }
    expect_bitwise(batched, whole, "in a batch with neighbours vs alone");
}

// Fork shares every block; the first append to a shared partial last block copies it (parent and child each see
// their own continuation), full blocks stay shared; release frees what only the released sequence held.
TEST(CudaEngine, ForkCopiesASharedPartialBlockOnWriteAndReleaseFreesBlocks) {
    SKIP_WITHOUT_DEVICE();
    const kvc_config cfg = make_config(4, 2, 32, KVC_DTYPE_F16, KVC_ROPE_NEOX, 16);
    std::mt19937_64 gen(test_seed(20261130));
    const History h = make_history(cfg, 40, gen), alt = make_history(cfg, 40, gen);
    kvc::Cache gpu(cuda_api(), cfg), cpu(cpu_api(), cfg);
    for (kvc::Cache* c : {&gpu, &cpu}) feed(*c, 0, h, 0, 21); // 21 tokens: one full block, one partial
    const uint64_t block_bytes = 2ull * 2 * 16 * 32 * 2;
    EXPECT_EQ(gpu.memory().capacity_bytes, 2 * block_bytes);
    gpu.fork(0, 1);
    cpu.fork(0, 1);
    EXPECT_EQ(gpu.memory().capacity_bytes, 2 * block_bytes) << "fork copies nothing";
    EXPECT_EQ(gpu.memory().live_bytes, 2 * 2 * 21ull * 2 * 32 * 2);
    // the child continues with alt's rows 21.., the parent with h's
    History child = h;
    std::copy(alt.q.begin() + 21 * 128, alt.q.end(), child.q.begin() + 21 * 128);
    std::copy(alt.k.begin() + 21 * 64, alt.k.end(), child.k.begin() + 21 * 64);
    std::copy(alt.v.begin() + 21 * 64, alt.v.end(), child.v.begin() + 21 * 64);
    expect_close(feed(gpu, 1, child, 21, 30), feed(cpu, 1, child, 21, 30), 2.0, "child after fork");
    EXPECT_EQ(gpu.memory().capacity_bytes, 3 * block_bytes) << "the child's copy of the partial block";
    expect_close(feed(gpu, 0, h, 21, 25), feed(cpu, 0, h, 21, 25), 2.0, "parent after fork");
    EXPECT_EQ(gpu.memory().capacity_bytes, 3 * block_bytes) << "the parent writes its block in place (last holder)";
    expect_close(feed(gpu, 1, child, 30, 31), child.reference(30), 1.0, "child vs reference");
    expect_close(feed(gpu, 0, h, 25, 26), h.reference(25), 1.0, "parent vs reference");
    // the parent's rows are untouched by the child's appends (the CPU engine's parent holds 25 rows: row 25 went to
    // the GPU alone, for the reference comparison above)
    std::vector<uint8_t> pk(25 * 64 * 2), pv(25 * 64 * 2), ck(25 * 64 * 2), cv(25 * 64 * 2);
    gpu.read_kv(0, 0, 0, 25, pk.data(), pv.data());
    cpu.read_kv(0, 0, 0, 25, ck.data(), cv.data());
    EXPECT_EQ(pv, cv);
    gpu.release(1);
    EXPECT_EQ(gpu.memory().capacity_bytes, 2 * block_bytes);
    gpu.release(0);
    EXPECT_EQ(gpu.memory().capacity_bytes, 0u);
    EXPECT_EQ(gpu.memory().live_bytes, 0u);
    EXPECT_EQ(gpu.seq_length(0, 0), 0u);
    // a released sequence starts again from position 0
    kvc::Cache fresh(cuda_api(), cfg);
    expect_bitwise(feed(gpu, 0, alt, 0, 10), feed(fresh, 0, alt, 0, 10), "after release vs a fresh cache");
}

TEST(CudaEngine, BadInputIsRefusedAndChangesNothing) {
    SKIP_WITHOUT_DEVICE();
    const kvc_config cfg = make_config(4, 2, 16, KVC_DTYPE_F32, KVC_ROPE_NONE, 16, 2, 2);
    kvc::Cache c(cuda_api(), cfg);
    const kvc_plugin_api* api = cuda_api();
    std::vector<float> x(4 * 16 * 4, 0.5f), out(4 * 16 * 4);
    EXPECT_EQ(api->append_attend(c.get(), 2, 0, 1, x.data(), x.data(), x.data(), out.data()), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api->append_attend(c.get(), 0, 2, 1, x.data(), x.data(), x.data(), out.data()), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api->append_attend(c.get(), 0, 0, 1, nullptr, x.data(), x.data(), out.data()), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api->append_attend(c.get(), 0, 0, 0, nullptr, nullptr, nullptr, nullptr), KVC_OK);
    EXPECT_EQ(c.seq_length(0, 0), 0u);
    EXPECT_EQ(api->fork(c.get(), 0, 1), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api->release(c.get(), 0), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api->append_attend(c.get(), 0, 0, 2, x.data(), x.data(), x.data(), out.data()), KVC_OK);
    std::vector<float> k(4 * 2 * 16), v(4 * 2 * 16);
    EXPECT_EQ(api->read_kv(c.get(), 0, 0, 1, 2, k.data(), v.data()), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api->read_kv(c.get(), 0, 1, 0, 1, k.data(), v.data()), KVC_ERR_INVALID_ARGUMENT);
}

// The workspace is allocated by create and constant after it (NO-Q's rule); K/V storage is capacity + pool.
TEST(CudaEngine, WorkspaceIsConstantAndStorageIsReported) {
    SKIP_WITHOUT_DEVICE();
    const kvc_config cfg = make_config(8, 2, 64, KVC_DTYPE_BF16, KVC_ROPE_NEOX, 16);
    std::mt19937_64 gen(test_seed(20261130));
    const History h = make_history(cfg, 3000, gen);
    kvc::Cache c(cuda_api(), cfg);
    const kvc_memory before = c.memory();
    EXPECT_GT(before.workspace_bytes, 0u);
    feed(c, 0, h, 0, 3000); // a prefill larger than the workspace: transient scratch, freed by the call
    const kvc_memory after = c.memory();
    EXPECT_EQ(after.workspace_bytes, before.workspace_bytes);
    EXPECT_EQ(after.capacity_bytes, (3000 + 15) / 16 * (2ull * 2 * 16 * 64 * 2));
    EXPECT_LE(after.pool_bytes, after.capacity_bytes + 256 * 8 + 65536) << "the arena at most doubles";
}

// ---- quantized caches (ABI 1.2: fp8 E4M3FN / E5M2 with scales, int8 per token, q8_0) ----

// (dtype, fp8 kv_scale_mode, int8_scale_dtype, n_q_heads, n_kv_heads, head_dim, rope, block size)
struct QuantShape {
    uint32_t dtype, scale_mode, int8_scale, nq, nkv, d, rope, block;
};

// A quantized config of 2 layers; fp8 scales that differ per layer (and per KV head), sized so that some E4M3
// codes saturate. The config points into q.
struct QuantConfig {
    kvc_config cfg{};
    std::vector<float> k_scales, v_scales;
    explicit QuantConfig(const QuantShape& s) {
        cfg = make_config(s.nq, s.nkv, s.d, s.dtype, s.rope, s.block, 2);
        cfg.int8_scale_dtype = s.int8_scale;
        cfg.kv_scale_mode = s.scale_mode;
        if (s.scale_mode != KVC_SCALE_NONE) {
            const uint32_t n = 2 * (s.scale_mode == KVC_SCALE_KV_HEAD ? s.nkv : 1);
            for (uint32_t i = 0; i < n; ++i) {
                k_scales.push_back(0.004f * static_cast<float>(i + 1) + 0.001f);
                v_scales.push_back(0.003f * static_cast<float>(i + 2));
            }
            cfg.k_scales = k_scales.data();
            cfg.v_scales = v_scales.data();
        }
    }
    QuantConfig(const QuantConfig&) = delete;
};

// Rows 0 .. n - 1 of one stream as stored: codes (read_kv) and scales (read_kv_scales).
struct Stored {
    std::vector<uint8_t> k, v, ks, vs;
};
Stored read_stored(kvc::Cache& c, const kvc_config& cfg, uint32_t seq, uint32_t layer, uint32_t n) {
    const size_t codes = static_cast<size_t>(n) * cfg.n_kv_heads * cfg.head_dim;
    const size_t scales = static_cast<size_t>(n) * cfg.n_kv_heads * kvc::scales_per_head_row(cfg.cache_dtype, cfg.head_dim) *
                          kvc::scale_size(cfg.cache_dtype, cfg.int8_scale_dtype);
    Stored s{std::vector<uint8_t>(codes), std::vector<uint8_t>(codes), std::vector<uint8_t>(scales),
             std::vector<uint8_t>(scales)};
    c.read_kv(seq, layer, 0, n, s.k.data(), s.v.data());
    c.read_kv_scales(seq, layer, 0, n, s.ks.data(), s.vs.data());
    return s;
}

// The stored rows dequantized by the reference's dequantizers: [n][n_kv_heads][head_dim] floats.
std::vector<float> dequantized(const kvc_config& cfg, const std::vector<uint8_t>& codes,
                               const std::vector<uint8_t>& scales) {
    const uint32_t d = cfg.head_dim, dt = cfg.cache_dtype;
    const size_t rows = codes.size() / d;
    const size_t per_row = scales.size() / rows; // bytes of scales per head row
    std::vector<float> out(codes.size());
    for (size_t r = 0; r < rows; ++r) {
        const uint8_t* c = codes.data() + r * d;
        const uint8_t* sc = scales.data() + r * per_row;
        float* o = out.data() + r * d;
        if (kvc::dtype_is_fp8(dt)) {
            float scale;
            std::memcpy(&scale, sc, 4);
            kvc::ref::dequantize_fp8_row(c, static_cast<int>(d), scale,
                                         dt == KVC_DTYPE_FP8_E4M3 ? kvc::ref::Fp8::E4M3FN : kvc::ref::Fp8::E5M2, o);
        } else if (dt == KVC_DTYPE_INT8_TOKEN) {
            float scale;
            if (per_row == 2) {
                uint16_t h;
                std::memcpy(&h, sc, 2);
                scale = kvc::ref::f16_value(h);
            } else {
                std::memcpy(&scale, sc, 4);
            }
            kvc::ref::dequantize_int8_row(reinterpret_cast<const int8_t*>(c), static_cast<int>(d), scale, o);
        } else {
            std::vector<kvc::ref::BlockQ8_0> blocks(d / 32);
            for (uint32_t b = 0; b < d / 32; ++b) {
                std::memcpy(&blocks[b].d, sc + 2 * b, 2);
                std::memcpy(blocks[b].qs, c + 32 * b, 32);
            }
            kvc::ref::dequantize_row_q8_0(blocks.data(), static_cast<int>(d), o);
        }
    }
    return out;
}

// The output of query token t of h over the cache's own dequantized rows K, V ([T][n_kv_heads][d], K as stored:
// rotated), in long double, q rotated by t in long double: the promise, as for the other dtypes.
std::vector<float> reference_over(const History& h, uint32_t t, const std::vector<float>& K, const std::vector<float>& V) {
    const kvc_config& cfg = h.cfg;
    const uint32_t d = cfg.head_dim, nq = cfg.n_q_heads, nkv = cfg.n_kv_heads, group = nq / nkv;
    std::vector<float> out(static_cast<size_t>(nq) * d);
    for (uint32_t hd = 0; hd < nq; ++hd) {
        const uint32_t g = hd / group;
        std::vector<long double> qr(h.q.begin() + (static_cast<size_t>(t) * nq + hd) * d,
                                    h.q.begin() + (static_cast<size_t>(t) * nq + hd + 1) * d);
        kvc::ref::apply_rope<long double>(qr.data(), static_cast<int>(d), t, static_cast<kvc::ref::Rope>(cfg.rope),
                                          cfg.rope_theta);
        std::vector<long double> s(t + 1), acc(d, 0.0L);
        long double mx = -INFINITY, l = 0.0L;
        for (uint32_t j = 0; j <= t; ++j) {
            long double dot = 0.0L;
            for (uint32_t c = 0; c < d; ++c) dot += qr[c] * K[(static_cast<size_t>(j) * nkv + g) * d + c];
            s[j] = dot * cfg.scale;
            mx = std::max(mx, s[j]);
        }
        for (uint32_t j = 0; j <= t; ++j) {
            const long double p = std::exp(s[j] - mx);
            l += p;
            for (uint32_t c = 0; c < d; ++c) acc[c] += p * V[(static_cast<size_t>(j) * nkv + g) * d + c];
        }
        for (uint32_t c = 0; c < d; ++c) out[static_cast<size_t>(hd) * d + c] = static_cast<float>(acc[c] / l);
    }
    return out;
}

// One quantization step of a dequantized value a with scale bytes sc (what a 1-ulp change of the rotated input
// can move it by, and a little more): int8 its scale, q8_0 its block's d, fp8 a unit of the code's binade.
double quant_step(const kvc_config& cfg, float a, const uint8_t* sc, uint32_t dim) {
    const uint32_t dt = cfg.cache_dtype;
    if (kvc::dtype_is_fp8(dt)) {
        float scale;
        std::memcpy(&scale, sc, 4);
        const double mant = dt == KVC_DTYPE_FP8_E4M3 ? 0.125 : 0.25, sub = dt == KVC_DTYPE_FP8_E4M3 ? 0x1p-9 : 0x1p-16;
        return std::fabs(a) * mant + sub * scale;
    }
    uint16_t h;
    if (dt == KVC_DTYPE_Q8_0) {
        std::memcpy(&h, sc + 2 * (dim / 32), 2);
        return kvc::ref::f16_value(h);
    }
    if (cfg.int8_scale_dtype == KVC_DTYPE_F16) {
        std::memcpy(&h, sc, 2);
        return kvc::ref::f16_value(h);
    }
    float scale;
    std::memcpy(&scale, sc, 4);
    return scale;
}

class CudaQuant : public ::testing::TestWithParam<QuantShape> {};

// Both layers of one stream in chunks, then decode steps past the 1,024-key segment boundary: every output within
// the promise of the reference over the cache's own dequantized rows (read_kv and read_kv_scales, dequantized by
// kvc::ref), at split and segment boundaries. The stored codes and scales bit for bit those of the CPU engine (V
// always, K without RoPE; with RoPE the device's double angles may move a rotated K element by an f32 ulp, hence a
// code by one step), so the quantizer on the device is the reference's. Without RoPE the outputs are also within
// twice the promise of the CPU engine's. memory(): live bytes with the scales, capacity, the workspace.
TEST_P(CudaQuant, StoresTheReferencesCodesAndAttendsOverThem) {
    SKIP_WITHOUT_DEVICE();
    const QuantShape shape = GetParam();
    const QuantConfig qc(shape);
    const kvc_config& cfg = qc.cfg;
    std::mt19937_64 gen(test_seed(20261206));
    const uint32_t prompt = 1030, steps = 20, total = prompt + steps;
    const History h0 = make_history(cfg, total, gen), h1 = make_history(cfg, total, gen);
    kvc::Cache gpu(cuda_api(), cfg), cpu(cpu_api(), cfg);
    std::vector<float> got[2], want[2];
    auto step = [&](uint32_t t0, uint32_t t1) {
        for (uint32_t layer = 0; layer < 2; ++layer) {
            const History& h = layer == 0 ? h0 : h1;
            const std::vector<float> a = feed(gpu, 0, h, t0, t1, layer), b = feed(cpu, 0, h, t0, t1, layer);
            got[layer].insert(got[layer].end(), a.begin(), a.end());
            want[layer].insert(want[layer].end(), b.begin(), b.end());
        }
    };
    for (uint32_t t0 = 0; t0 < prompt;) {
        const uint32_t t1 = std::min(prompt, t0 + 1 + (t0 * 7 + 300) % 513);
        step(t0, t1);
        t0 = t1;
    }
    for (uint32_t t = prompt; t < total; ++t) step(t, t + 1);
    const size_t qn = static_cast<size_t>(cfg.n_q_heads) * cfg.head_dim;
    for (uint32_t layer = 0; layer < 2; ++layer) {
        const History& h = layer == 0 ? h0 : h1;
        const Stored g = read_stored(gpu, cfg, 0, layer, total), c = read_stored(cpu, cfg, 0, layer, total);
        const std::vector<float> K = dequantized(cfg, g.k, g.ks), V = dequantized(cfg, g.v, g.vs);
        for (uint32_t t : {0u, 1u, 255u, 256u, 1023u, 1024u, prompt - 1, prompt, total - 1})
            expect_close(std::vector<float>(got[layer].begin() + t * qn, got[layer].begin() + (t + 1) * qn),
                         reference_over(h, t, K, V), 1.0,
                         "layer " + std::to_string(layer) + ": cuda vs the reference over its rows at token " +
                             std::to_string(t));
        EXPECT_EQ(g.v, c.v) << "V codes, layer " << layer;
        EXPECT_EQ(g.vs, c.vs) << "V scales, layer " << layer;
        if (cfg.rope == KVC_ROPE_NONE) {
            EXPECT_EQ(g.k, c.k) << "K codes, layer " << layer;
            EXPECT_EQ(g.ks, c.ks) << "K scales, layer " << layer;
            expect_close(got[layer], want[layer], 2.0, "cuda vs cpu, layer " + std::to_string(layer));
        } else {
            const std::vector<float> CK = dequantized(cfg, c.k, c.ks);
            const size_t per_row = g.ks.size() / (g.k.size() / cfg.head_dim);
            size_t moved = 0;
            for (size_t i = 0; i < K.size(); ++i) {
                if (K[i] == CK[i]) continue;
                ++moved;
                const size_t row = i / cfg.head_dim;
                const uint32_t dim = static_cast<uint32_t>(i % cfg.head_dim);
                const double tol = quant_step(cfg, K[i], g.ks.data() + row * per_row, dim) +
                                   quant_step(cfg, CK[i], c.ks.data() + row * per_row, dim);
                ASSERT_LE(std::fabs(static_cast<double>(K[i]) - CK[i]), tol) << "dequantized K element " << i;
            }
            EXPECT_LE(moved, K.size() / 100) << "rotated K moved by RoPE's last bit in at most 1% of elements";
        }
    }
    const kvc_memory mem = gpu.memory();
    const uint64_t row = kvc::head_row_bytes(cfg.cache_dtype, cfg.head_dim, cfg.int8_scale_dtype);
    EXPECT_EQ(mem.live_bytes, 2ull * 2 * total * cfg.n_kv_heads * row);
    EXPECT_EQ(mem.capacity_bytes, 2ull * (total + shape.block - 1) / shape.block * (2ull * cfg.n_kv_heads * shape.block * row));
    const uint64_t fp8_scales = kvc::dtype_is_fp8(cfg.cache_dtype) ? 2ull * 2 * cfg.n_kv_heads * sizeof(float) : 0;
    EXPECT_EQ(mem.workspace_bytes,
              (8ull << 20) + (cfg.rope != KVC_ROPE_NONE ? cfg.head_dim / 2 * sizeof(double) : 0) + fp8_scales);
    const kvc_memory cm = cpu.memory();
    EXPECT_EQ(mem.live_bytes, cm.live_bytes);
    EXPECT_EQ(mem.workspace_bytes - cm.workspace_bytes,
              (8ull << 20) + (cfg.rope != KVC_ROPE_NONE ? cfg.head_dim / 2 * sizeof(double) : 0))
        << "the fp8 scales are reported as the CPU engine reports them";
}

// e.g. fp8_e4m3_kv_head_8x2_d128_neox_b16
std::string quant_shape_name(const ::testing::TestParamInfo<QuantShape>& info) {
    const QuantShape& s = info.param;
    std::string name = kvc::dtype_name(s.dtype);
    if (kvc::dtype_is_fp8(s.dtype))
        name += s.scale_mode == KVC_SCALE_KV_HEAD ? "_kv_head" : s.scale_mode == KVC_SCALE_TENSOR ? "_tensor" : "_unscaled";
    if (s.dtype == KVC_DTYPE_INT8_TOKEN) name += s.int8_scale == KVC_DTYPE_F16 ? "_f16" : "_f32";
    const char* const rope[] = {"none", "neox", "gptj"};
    return name + "_" + std::to_string(s.nq) + "x" + std::to_string(s.nkv) + "_d" + std::to_string(s.d) + "_" +
           rope[s.rope] + "_b" + std::to_string(s.block);
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, CudaQuant,
    ::testing::Values(
        QuantShape{KVC_DTYPE_FP8_E4M3, KVC_SCALE_KV_HEAD, KVC_DTYPE_F32, 8, 2, 128, KVC_ROPE_NEOX, 16},
        QuantShape{KVC_DTYPE_FP8_E4M3, KVC_SCALE_TENSOR, KVC_DTYPE_F32, 4, 4, 64, KVC_ROPE_NONE, 256},
        QuantShape{KVC_DTYPE_FP8_E5M2, KVC_SCALE_NONE, KVC_DTYPE_F32, 6, 2, 32, KVC_ROPE_GPTJ, 7},
        // rows that are not whole 16-byte pieces: staged code by code
        QuantShape{KVC_DTYPE_FP8_E4M3, KVC_SCALE_NONE, KVC_DTYPE_F32, 3, 1, 24, KVC_ROPE_NONE, 5},
        QuantShape{KVC_DTYPE_INT8_TOKEN, 0, KVC_DTYPE_F32, 8, 2, 128, KVC_ROPE_NEOX, 16},
        // unaligned scales: rows of 14 and 11 bytes
        QuantShape{KVC_DTYPE_INT8_TOKEN, 0, KVC_DTYPE_F16, 4, 2, 12, KVC_ROPE_NONE, 16},
        QuantShape{KVC_DTYPE_INT8_TOKEN, 0, KVC_DTYPE_F32, 2, 1, 7, KVC_ROPE_NONE, 1},
        QuantShape{KVC_DTYPE_Q8_0, 0, KVC_DTYPE_F32, 8, 2, 128, KVC_ROPE_NEOX, 16},
        QuantShape{KVC_DTYPE_Q8_0, 0, KVC_DTYPE_F32, 4, 1, 96, KVC_ROPE_NONE, 3}),
    quant_shape_name);

// The determinism rule holds for quantized caches: one token at a time, chunks of 97 and one prefill give the same
// bits (the dequantized value of a code does not depend on who stages it).
TEST(CudaQuantEngine, ChunkingDoesNotChangeABit) {
    SKIP_WITHOUT_DEVICE();
    for (const QuantShape& s : {QuantShape{KVC_DTYPE_FP8_E4M3, KVC_SCALE_KV_HEAD, KVC_DTYPE_F32, 8, 2, 64, KVC_ROPE_NEOX, 16},
                                QuantShape{KVC_DTYPE_Q8_0, 0, KVC_DTYPE_F32, 8, 2, 64, KVC_ROPE_NEOX, 16},
                                QuantShape{KVC_DTYPE_INT8_TOKEN, 0, KVC_DTYPE_F16, 8, 2, 64, KVC_ROPE_GPTJ, 16}}) {
        const QuantConfig qc(s);
        std::mt19937_64 gen(test_seed(20261206));
        const uint32_t total = 1100;
        const History h = make_history(qc.cfg, total, gen);
        auto run = [&](uint32_t chunk) {
            kvc::Cache c(cuda_api(), qc.cfg);
            std::vector<float> out;
            for (uint32_t t0 = 0; t0 < total; t0 += chunk) {
                const std::vector<float> a = feed(c, 0, h, t0, std::min(total, t0 + chunk), 1);
                out.insert(out.end(), a.begin(), a.end());
            }
            return out;
        };
        const std::vector<float> whole = run(total);
        expect_bitwise(run(1), whole, "one token at a time vs one prefill, dtype " + std::to_string(s.dtype));
        expect_bitwise(run(97), whole, "chunks of 97 vs one prefill, dtype " + std::to_string(s.dtype));
    }
}

// int8 and q8_0 store finite rows only, and an f16 int8 scale must not overflow: refused before anything changes,
// as the CPU engine refuses them. fp8 stores NaN as NaN. read_kv_scales of an f16 cache is UNSUPPORTED.
// Fork shares a quantized block and copies it on write, scales and all.
TEST(CudaQuantEngine, BadRowsAreRefusedAndForkCopiesScales) {
    SKIP_WITHOUT_DEVICE();
    const kvc_plugin_api* api = cuda_api();
    for (const uint32_t dtype : {KVC_DTYPE_INT8_TOKEN, KVC_DTYPE_Q8_0}) {
        kvc_config cfg = make_config(4, 2, 32, dtype, KVC_ROPE_NEOX, 16);
        cfg.int8_scale_dtype = KVC_DTYPE_F16;
        kvc::Cache c(api, cfg);
        std::vector<float> q(4 * 32, 0.5f), k(2 * 32, 0.25f), v(2 * 32, -0.5f), out(4 * 32);
        v[40] = NAN;
        EXPECT_EQ(api->append_attend(c.get(), 0, 0, 1, q.data(), k.data(), v.data(), out.data()), KVC_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(api->last_error(c.get())).find("non-finite"), std::string::npos) << api->last_error(c.get());
        v[40] = 0.5f;
        k[3] = 1e10f; // absmax / 127 overflows an f16 scale (int8); q8_0's d is an f16 infinity, as ggml stores it
        const kvc_status st = api->append_attend(c.get(), 0, 0, 1, q.data(), k.data(), v.data(), out.data());
        EXPECT_EQ(st, dtype == KVC_DTYPE_INT8_TOKEN ? KVC_ERR_INVALID_ARGUMENT : KVC_OK) << api->last_error(c.get());
        EXPECT_EQ(c.seq_length(0, 0), dtype == KVC_DTYPE_INT8_TOKEN ? 0u : 1u);
    }
    {
        kvc_config cfg = make_config(4, 2, 32, KVC_DTYPE_FP8_E5M2, KVC_ROPE_NONE, 16);
        kvc::Cache c(api, cfg);
        std::vector<float> q(4 * 32, 0.5f), k(2 * 32, 0.25f), v(2 * 32, -0.5f), out(4 * 32);
        k[5] = NAN;
        EXPECT_EQ(api->append_attend(c.get(), 0, 0, 1, q.data(), k.data(), v.data(), out.data()), KVC_OK);
        std::vector<uint8_t> kc(64), vc(64);
        c.read_kv(0, 0, 0, 1, kc.data(), vc.data());
        EXPECT_TRUE(std::isnan(kvc::ref::decode_e5m2(kc[5])));
    }
    {
        kvc::Cache c(api, make_config(4, 2, 32, KVC_DTYPE_F16, KVC_ROPE_NONE, 16));
        std::vector<float> x(4 * 32, 0.5f), out(4 * 32);
        c.append_attend(0, 0, 1, x.data(), x.data(), x.data(), out.data());
        std::vector<uint8_t> ks(8), vs(8);
        EXPECT_EQ(api->read_kv_scales(c.get(), 0, 0, 0, 1, ks.data(), vs.data()), KVC_ERR_UNSUPPORTED);
    }
    // fork: 21 tokens (a full block and a partial one), the child and the parent continue differently
    const QuantShape s{KVC_DTYPE_Q8_0, 0, KVC_DTYPE_F32, 4, 2, 64, KVC_ROPE_NEOX, 16};
    const QuantConfig qc(s);
    std::mt19937_64 gen(test_seed(20261206));
    const History h = make_history(qc.cfg, 40, gen), alt = make_history(qc.cfg, 40, gen);
    kvc::Cache gpu(api, qc.cfg), cpu(cpu_api(), qc.cfg);
    for (kvc::Cache* c : {&gpu, &cpu}) {
        feed(*c, 0, h, 0, 21);
        c->fork(0, 1);
        feed(*c, 1, alt, 21, 30);
        feed(*c, 0, h, 21, 25);
    }
    for (uint32_t seq : {0u, 1u}) {
        const uint32_t n = seq == 0 ? 25 : 30;
        const Stored g = read_stored(gpu, qc.cfg, seq, 0, n), c = read_stored(cpu, qc.cfg, seq, 0, n);
        EXPECT_EQ(g.v, c.v) << "seq " << seq;
        EXPECT_EQ(g.vs, c.vs) << "seq " << seq;
    }
}

} // namespace
