// The CUDA engine through the ABI, on a GPU: its outputs against the CPU engine's and the reference's on the same
// cases (GQA, RoPE NeoX/GPT-J, f16/bf16, block sizes 1/16/256, chunked prefill, fork with copy-on-write, release),
// read_kv round trips, the memory formula, and determinism (bitwise the same with other batch neighbours, another
// chunking, and on repetition). Without a usable device every test skips with the CUDA error as its reason.
// Random inputs print their seed (KVCHECK_SEED=N replays). Label `cuda`; tools/gpu-check.sh runs it on a GPU.
#include "kvcheck/abi.hpp"
#include "kvcheck/optimized/cpu_engine.h"
#include "kvcheck/optimized/cuda_engine.h"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/rope.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
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

TEST(CudaEngine, CapsDeclareDeviceMemoryAndTheF32Class) {
    kvc_caps caps{};
    caps.struct_size = sizeof caps;
    cuda_api()->get_caps(&caps);
    EXPECT_EQ(caps.memory_space, static_cast<uint32_t>(KVC_MEMORY_DEVICE));
    EXPECT_EQ(caps.precision, static_cast<uint32_t>(KVC_PRECISION_F32));
    EXPECT_EQ(caps.dtypes, 7u);
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

} // namespace
