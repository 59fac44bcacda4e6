// The determinism contract (docs/engine.md): the same inputs give bitwise the same outputs, and a token's output
// does not depend on its batch neighbours, on how its prompt was chunked (decode step = the engine's own full
// prefill of that position), nor on the number of threads. The reduction structure depends on positions only.
#include "engine_test_util.hpp"

#include <sys/wait.h>
#include <unistd.h>

namespace kvc::test {
namespace {

struct Tokens {
    std::vector<float> q, k, v;
};

Tokens random_tokens(const kvc_config& c, uint32_t n, uint64_t seed) {
    Rng rng(seed);
    return {rng.normal(size_t(n) * c.n_q_heads * c.head_dim), rng.normal(size_t(n) * c.n_kv_heads * c.head_dim),
            rng.normal(size_t(n) * c.n_kv_heads * c.head_dim)};
}

// The outputs of all n tokens fed to one sequence in the given chunks.
std::vector<float> run_chunked(const kvc_config& c, const Tokens& t, const std::vector<uint32_t>& chunks,
                               const opt::EngineOptions& o = {}) {
    auto e = make_engine(c, o);
    const size_t qrow = size_t(c.n_q_heads) * c.head_dim, kvrow = size_t(c.n_kv_heads) * c.head_dim;
    std::vector<float> out(t.q.size(), -7.0f);
    size_t pos = 0;
    for (uint32_t n : chunks) {
        EXPECT_EQ(e->append_attend(0, 0, n, t.q.data() + pos * qrow, t.k.data() + pos * kvrow, t.v.data() + pos * kvrow,
                                   out.data() + pos * qrow),
                  KVC_OK)
            << e->last_error();
        pos += n;
    }
    return out;
}

std::vector<uint32_t> random_chunks(uint32_t total, Rng& rng) {
    std::vector<uint32_t> chunks;
    for (uint32_t left = total; left > 0;) {
        const uint32_t pick = rng.below(4) == 0 ? 1 + rng.below(300) : 1 + rng.below(4); // decode-like and big
        chunks.push_back(std::min(pick, left));
        left -= chunks.back();
    }
    return chunks;
}

using Param = std::tuple<uint32_t /*dtype*/, bool /*simd*/>;
class Determinism : public ::testing::TestWithParam<Param> {};

// Crossing splits (256) and segments (1024): the decode path (spread over segments) and the prefill path (tiled)
// produce the same bits for the same position.
TEST_P(Determinism, ChunkingDoesNotChangeABit) {
    const auto [dtype, simd] = GetParam();
    const uint64_t seed = test_seed(500 + dtype);
    opt::EngineOptions o;
    o.simd = simd;
    const kvc_config c = make_config(6, 2, 20, dtype, 7, KVC_ROPE_NEOX);
    const uint32_t n = 1300;
    const Tokens t = random_tokens(c, n, seed);
    const std::vector<float> full = run_chunked(c, t, {n}, o); // the engine's own uncached computation
    std::vector<uint32_t> ones(n, 1);
    EXPECT_TRUE(bitwise_equal(run_chunked(c, t, ones, o), full)) << "decode step by step differs from the prefill";
    Rng rng(seed);
    for (int trial = 0; trial < 3; ++trial)
        EXPECT_TRUE(bitwise_equal(run_chunked(c, t, random_chunks(n, rng), o), full)) << "trial " << trial;
}

TEST_P(Determinism, BatchNeighboursDoNotChangeABit) {
    const auto [dtype, simd] = GetParam();
    const uint64_t seed = test_seed(600 + dtype);
    opt::EngineOptions o;
    o.simd = simd;
    const kvc_config c = make_config(4, 4, 16, dtype, 16, KVC_ROPE_GPTJ);
    const size_t qrow = 64, kvrow = 64;
    // sequence 0 alone: prefill 40, then decode steps
    const Tokens t = random_tokens(c, 60, seed);
    std::vector<uint32_t> chunks = {40};
    chunks.resize(21, 1);
    const std::vector<float> alone = run_chunked(c, t, chunks, o);
    // the same sequence in batches next to others of different lengths, at a different batch position each step
    auto e = make_engine(c, o);
    Rng rng(seed + 1);
    std::vector<float> batched(alone.size(), -7.0f);
    size_t pos = 0;
    for (uint32_t step = 0; step < chunks.size(); ++step) {
        const uint32_t mine = chunks[step], others = 1 + step % 3, before = step % 2;
        std::vector<uint32_t> ids, offs = {0};
        std::vector<float> q, k, v;
        auto add = [&](uint32_t id, uint32_t n, const float* qs, const float* ks, const float* vs) {
            ids.push_back(id);
            offs.push_back(offs.back() + n);
            q.insert(q.end(), qs, qs + n * qrow);
            k.insert(k.end(), ks, ks + n * kvrow);
            v.insert(v.end(), vs, vs + n * kvrow);
        };
        const Tokens noise = random_tokens(c, 2 * others + 7 * step, rng.gen());
        if (before) add(3, others, noise.q.data(), noise.k.data(), noise.v.data());
        add(0, mine, t.q.data() + pos * qrow, t.k.data() + pos * kvrow, t.v.data() + pos * kvrow);
        add(5, others + 7 * step, noise.q.data() + others * qrow, noise.k.data() + others * kvrow,
            noise.v.data() + others * kvrow);
        std::vector<float> out(q.size());
        kvc_batch b{sizeof(kvc_batch), static_cast<uint32_t>(ids.size()), ids.data(), offs.data(), q.data(), k.data(),
                    v.data(), out.data()};
        ASSERT_EQ(e->append_attend_batch(0, &b), KVC_OK) << e->last_error();
        const size_t at = before ? offs[1] : 0;
        std::copy(out.begin() + at * qrow, out.begin() + (at + mine) * qrow, batched.begin() + pos * qrow);
        pos += mine;
    }
    EXPECT_TRUE(bitwise_equal(batched, alone));
}

// Enough K/V per call (over 2 MiB) that the work is spread over the threads: decode steps over three segments,
// then a tiled chunk.
TEST_P(Determinism, ThreadCountAndRepetitionDoNotChangeABit) {
    const auto [dtype, simd] = GetParam();
    const uint64_t seed = test_seed(700 + dtype);
    const kvc_config c = make_config(8, 4, 64, dtype, 16, KVC_ROPE_NEOX);
    const uint32_t history = 2200, steps = 40, chunk = 64;
    const Tokens fill = random_tokens(c, history, seed), t = random_tokens(c, steps + chunk, seed + 1);
    auto run = [&](unsigned threads) {
        opt::EngineOptions o;
        o.threads = threads;
        o.simd = simd;
        auto e = make_engine(c, o);
        EXPECT_EQ(e->append(0, 0, history, fill.k.data(), fill.v.data()), KVC_OK);
        const size_t qrow = 8 * 64, kvrow = 4 * 64;
        std::vector<float> out(t.q.size());
        for (uint32_t i = 0; i <= steps; ++i) {
            const uint32_t n = i < steps ? 1 : chunk, at = i;
            EXPECT_EQ(e->append_attend(0, 0, n, t.q.data() + at * qrow, t.k.data() + at * kvrow, t.v.data() + at * kvrow,
                                       out.data() + at * qrow),
                      KVC_OK);
        }
        return out;
    };
    const std::vector<float> all = run(0);
    EXPECT_TRUE(bitwise_equal(run(1), all)) << "1 thread vs every core";
    EXPECT_TRUE(bitwise_equal(run(0), all)) << "the same run twice";
}

// A decode walks groups of KV heads per kernel call (all heads of a block together); a prefill walks one head per
// call. The grouping depends on the batch and the thread count, never a row's bits: decode steps with grouping on
// equal those with one head per call, and the prefill of the same positions. MHA with 8 KV heads and tiles of 1,
// 2 and 4 rows (one, two and four decode tokens per call).
TEST_P(Determinism, HeadGroupingDoesNotChangeABit) {
    const auto [dtype, simd] = GetParam();
    const uint64_t seed = test_seed(750 + dtype);
    const kvc_config c = make_config(8, 8, 20, dtype, 5, KVC_ROPE_NEOX);
    const uint32_t n = 1080;
    const Tokens t = random_tokens(c, n, seed);
    std::vector<uint32_t> chunks = {1030};
    for (uint32_t left = n - 1030, i = 0; left > 0; ++i) { // decode calls of 1, 2 and 4 tokens, past 1024
        chunks.push_back(std::min(left, 1u << (i % 3)));
        left -= chunks.back();
    }
    opt::EngineOptions grouped, single;
    grouped.simd = single.simd = simd;
    single.group_heads = false;
    const std::vector<float> a = run_chunked(c, t, chunks, grouped), b = run_chunked(c, t, chunks, single);
    EXPECT_TRUE(bitwise_equal(a, b)) << "decode with heads grouped vs one head per kernel call";
    std::vector<uint32_t> whole = {n};
    EXPECT_TRUE(bitwise_equal(a, run_chunked(c, t, whole, grouped))) << "decode vs prefill of the same positions";
}

INSTANTIATE_TEST_SUITE_P(All, Determinism,
                         ::testing::Combine(::testing::Values(uint32_t(KVC_DTYPE_F32), uint32_t(KVC_DTYPE_F16),
                                                              uint32_t(KVC_DTYPE_BF16)),
                                            ::testing::Bool()),
                         [](const auto& info) {
                             return std::string(dtype_name(std::get<0>(info.param))) +
                                    (std::get<1>(info.param) ? "_simd" : "_portable");
                         });

} // namespace
} // namespace kvc::test

namespace kvc::test {
namespace {

// The conformance harness runs each case in a fork() of itself, without exec: the child inherits the engine's
// thread pool object but none of its worker threads. A parallel call there must not wait for workers that do not
// exist, and must give the parent's bits.
TEST(Threads, ParallelCallsWorkInAForkedChild) {
    const kvc_config c = make_config(8, 4, 64, KVC_DTYPE_F32, 16, KVC_ROPE_NEOX);
    const uint32_t history = 4000; // 8 MB of K/V per decode step: always spread over the workers
    Rng rng(test_seed(900));
    const auto k = rng.normal(size_t(history) * 4 * 64), v = rng.normal(size_t(history) * 4 * 64);
    const auto q = rng.normal(8 * 64), k1 = rng.normal(4 * 64), v1 = rng.normal(4 * 64);
    auto decode = [&] {
        auto e = make_engine(c);
        EXPECT_EQ(e->append(0, 0, history, k.data(), v.data()), KVC_OK);
        std::vector<float> out(8 * 64);
        EXPECT_EQ(e->append_attend(0, 0, 1, q.data(), k1.data(), v1.data(), out.data()), KVC_OK);
        return out;
    };
    const std::vector<float> parent = decode(); // the pool and its workers exist from here on
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        const std::vector<float> child = decode();
        const char ok = bitwise_equal(child, parent) ? 'y' : 'n';
        (void)!write(fds[1], &ok, 1);
        _exit(0);
    }
    close(fds[1]);
    char ok = 0;
    EXPECT_EQ(read(fds[0], &ok, 1), 1) << "the child died before answering";
    close(fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(ok, 'y') << "the forked child computed different bits";
}

} // namespace
} // namespace kvc::test
