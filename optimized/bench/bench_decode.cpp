// Decode attention over a 256 MiB f16 cache: (1) effective bandwidth against the same run's streaming read of a
// buffer of the same size, MHA and GQA 8:1; (2) decode time with blocks scattered over the pool against blocks in
// address order.
#include "bench_common.hpp"

#include <random>

namespace kvc::bench {
namespace {

constexpr uint32_t kSeqs = 8, kTokens = 8192, kKvHeads = 8, kHeadDim = 128, kBlock = 16;
constexpr int kReps = 9;

// Fills kSeqs sequences of kTokens tokens each, one after the other. The pool is reserved up front, as a server
// sizes its cache at start-up (one slab, huge pages where the kernel grants them); blocks are then handed out in
// address order, or in a random order when shuffled.
std::unique_ptr<opt::Engine> filled(uint32_t n_q_heads, bool shuffled) {
    auto e = engine_for(config(n_q_heads, kKvHeads, kHeadDim, KVC_DTYPE_F16, kBlock, kSeqs));
    if (e->reserve_blocks(uint64_t(kSeqs) * (kTokens / kBlock + 4)) != KVC_OK) std::exit(1);
    if (shuffled) e->shuffle_free_blocks(12345);
    std::mt19937 gen(7);
    std::normal_distribution<float> dist;
    const uint32_t chunk = 1024;
    std::vector<float> k(size_t(chunk) * kKvHeads * kHeadDim), v(k.size());
    for (float& x : k) x = dist(gen);
    for (float& x : v) x = dist(gen);
    for (uint32_t s = 0; s < kSeqs; ++s)
        for (uint32_t t = 0; t < kTokens; t += chunk)
            if (e->append(s, 0, chunk, k.data(), v.data()) != KVC_OK) std::exit(1);
    return e;
}

struct DecodeStep {
    explicit DecodeStep(uint32_t n_q_heads) : hq(n_q_heads) {
        std::mt19937 gen(9);
        std::normal_distribution<float> dist;
        q.resize(size_t(kSeqs) * hq * kHeadDim);
        k.resize(size_t(kSeqs) * kKvHeads * kHeadDim);
        v.resize(k.size());
        out.resize(q.size());
        for (float& x : q) x = dist(gen);
        for (float& x : k) x = dist(gen);
        for (float& x : v) x = dist(gen);
        for (uint32_t s = 0; s <= kSeqs; ++s) offsets.push_back(s);
        for (uint32_t s = 0; s < kSeqs; ++s) ids.push_back(s);
    }
    // One decode step of every sequence (one new token each); returns seconds and the K/V bytes it read.
    double run(opt::Engine& e, uint64_t* bytes) {
        kvc_batch b{sizeof(kvc_batch), kSeqs, ids.data(), offsets.data(), q.data(), k.data(), v.data(), out.data()};
        const double t0 = now_s();
        if (e.append_attend_batch(0, &b) != KVC_OK) std::exit(1);
        const double t = now_s() - t0;
        uint64_t tokens = 0;
        for (uint32_t s = 0; s < kSeqs; ++s) {
            uint32_t len = 0;
            e.seq_length(s, 0, &len);
            tokens += len;
        }
        *bytes = tokens * 2 * kKvHeads * kHeadDim * 2;
        return t;
    }
    uint32_t hq;
    std::vector<float> q, k, v, out;
    std::vector<uint32_t> offsets, ids;
};

void decode_bandwidth(benchmark::State& state, uint32_t n_q_heads, const char* name, const char* goal) {
    for (auto _ : state) {
        auto e = filled(n_q_heads, false);
        DecodeStep step(n_q_heads);
        uint64_t bytes = 0;
        step.run(*e, &bytes); // warm-up
        const uint64_t stream_bytes = bytes; // (each decode step adds a token: its bytes grow a little)
        std::vector<uint8_t> buf = touched_buffer(stream_bytes);
        std::vector<double> t_decode, t_stream;
        for (int r = 0; r < kReps; ++r) { // interleaved, so drifts in the machine hit both sides alike
            t_stream.push_back(stream_read_seconds(buf.data(), stream_bytes));
            t_decode.push_back(step.run(*e, &bytes));
        }
        const double bw_decode = bytes / fastest(t_decode), bw_stream = stream_bytes / fastest(t_stream);
        const double ratio = bw_decode / bw_stream;
        // the same on one core each: what a core achieves whatever else runs on the machine
        e->set_threads(1);
        std::vector<double> t1_decode, t1_stream;
        for (int r = 0; r < 3; ++r) {
            t1_stream.push_back(stream_read_seconds(buf.data(), stream_bytes, 1));
            t1_decode.push_back(step.run(*e, &bytes));
        }
        const double ratio1 = (bytes / fastest(t1_decode)) / (stream_bytes / fastest(t1_stream));
        state.counters["kv_MiB"] = bytes / 1048576.0;
        state.counters["decode_GBps"] = bw_decode / 1e9;
        state.counters["stream_GBps"] = bw_stream / 1e9;
        state.counters["ratio"] = ratio;
        state.counters["ratio_1thread"] = ratio1;
        state.counters["decode_ms"] = fastest(t_decode) * 1e3;
        char note[200];
        std::snprintf(note, sizeof note, "decode %.1f GB/s, stream read %.1f GB/s, %.0f MiB, %.1f ms/step; one thread each: %.2f",
                      bw_decode / 1e9, bw_stream / 1e9, bytes / 1048576.0, fastest(t_decode) * 1e3, ratio1);
        report(std::string("1. decode bandwidth / streaming read, ") + name, ratio, goal, note);
    }
}

void BM_DecodeBandwidthMHA(benchmark::State& state) { decode_bandwidth(state, kKvHeads, "MHA f16", ">= 0.80"); }
void BM_DecodeBandwidthGQA8(benchmark::State& state) { decode_bandwidth(state, 8 * kKvHeads, "GQA 8:1 f16", ">= 0.60"); }

void BM_DecodeShuffledBlocks(benchmark::State& state) {
    for (auto _ : state) {
        auto contiguous = filled(kKvHeads, false);
        auto shuffled = filled(kKvHeads, true);
        DecodeStep step(kKvHeads);
        uint64_t bytes = 0;
        step.run(*contiguous, &bytes);
        step.run(*shuffled, &bytes);
        std::vector<double> tc, ts;
        for (int r = 0; r < kReps; ++r) {
            tc.push_back(step.run(*contiguous, &bytes));
            ts.push_back(step.run(*shuffled, &bytes));
        }
        const double overhead = fastest(ts) / fastest(tc) - 1.0;
        state.counters["contiguous_ms"] = fastest(tc) * 1e3;
        state.counters["shuffled_ms"] = fastest(ts) * 1e3;
        state.counters["overhead"] = overhead;
        char note[160];
        std::snprintf(note, sizeof note, "contiguous %.1f ms, shuffled %.1f ms per decode step (MHA f16, %u-token blocks)",
                      fastest(tc) * 1e3, fastest(ts) * 1e3, kBlock);
        report("2. decode time shuffled / contiguous blocks - 1", overhead, "<= 0.10", note);
    }
}

BENCHMARK(BM_DecodeBandwidthMHA)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeBandwidthGQA8)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeShuffledBlocks)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
