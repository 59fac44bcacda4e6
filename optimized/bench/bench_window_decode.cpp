// (9) Decode with a sliding window: sequences of 32,768 tokens in a cache of window 4,096 with 4 sinks that evicts
// what no query can see again, against decode of sequences of 4,096 tokens without a window (every key seen). Both
// attend to about the same keys (4,100 and 4,096), so a windowed step whose work follows S + W and not the length
// costs about as much: the ratio windowed step time / full step time (target: <= 1.2). 8 sequences, MHA (8 heads of
// 128), f16, 16-token blocks, one decode step of every sequence, with every core and with one thread. The two
// engines are measured alternately, each step after evict_caches() and a flush of its K/V blocks (from memory).
#include "bench_common.hpp"

#include "kvcheck/abi.hpp"

#include <random>

namespace kvc::bench {
namespace {

constexpr uint32_t kSeqs = 8, kWindow = 4096, kSinks = 4, kLong = 32768, kHeads = 8, kHeadDim = 128, kBlock = 16;
constexpr int kReps = 9;

// An engine whose kSeqs sequences hold `tokens` each; windowed: layer 0 has the window, and the cache evicts.
std::unique_ptr<opt::Engine> filled(bool windowed, uint32_t tokens, const uint32_t* windows) {
    kvc_config c = config(kHeads, kHeads, kHeadDim, KVC_DTYPE_F16, kBlock, kSeqs);
    if (windowed) {
        c.windows = windows;
        c.n_sinks = kSinks;
        c.evict = 1;
    }
    auto e = engine_for(c);
    const uint64_t held = windowed ? (kWindow + kSinks) / kBlock + 4 : tokens / kBlock + 4;
    if (e->reserve_blocks(uint64_t(kSeqs) * held) != KVC_OK) std::exit(1);
    std::mt19937 gen(7);
    std::normal_distribution<float> dist;
    const uint32_t chunk = 1024;
    std::vector<float> k(size_t(chunk) * kHeads * kHeadDim), v(k.size());
    for (float& x : k) x = dist(gen);
    for (float& x : v) x = dist(gen);
    for (uint32_t s = 0; s < kSeqs; ++s)
        for (uint32_t t = 0; t < tokens; t += chunk) {
            if (e->append(s, 0, chunk, k.data(), v.data()) != KVC_OK) std::exit(1);
        }
    return e;
}

// Flushes every block the engine still holds (an evicting stream's freed blocks have no address).
void flush_kv(const opt::Engine& e, uint32_t tokens) {
    const kvc_kv_layout g = e.geometry();
    for (uint32_t s = 0; s < kSeqs; ++s)
        for (uint64_t pos = 0; pos < tokens + 64; pos += g.block_size)
            if (const uint8_t* block = e.slot_address(s, 0, pos, KVC_PLANE_K, 0)) flush_lines(block, kvc_kv_block_bytes(&g));
}

// One decode step of every sequence; seconds.
struct Step {
    Step() {
        std::mt19937 gen(9);
        std::normal_distribution<float> dist;
        q.resize(size_t(kSeqs) * kHeads * kHeadDim);
        k.resize(q.size());
        v.resize(q.size());
        out.resize(q.size());
        for (float* p : {q.data(), k.data(), v.data()})
            for (size_t i = 0; i < q.size(); ++i) p[i] = dist(gen);
        for (uint32_t s = 0; s <= kSeqs; ++s) offsets.push_back(s);
        for (uint32_t s = 0; s < kSeqs; ++s) ids.push_back(s);
    }
    double run(opt::Engine& e) {
        kvc_batch b{sizeof(kvc_batch), kSeqs, ids.data(), offsets.data(), q.data(), k.data(), v.data(), out.data()};
        const double t0 = now_s();
        if (e.append_attend_batch(0, &b) != KVC_OK) std::exit(1);
        return now_s() - t0;
    }
    std::vector<float> q, k, v, out;
    std::vector<uint32_t> offsets, ids;
};

void BM_DecodeWindowedVsFull(benchmark::State& state) {
    for (auto _ : state) {
        const uint32_t windows[1] = {kWindow};
        auto full = filled(false, kWindow, windows);
        auto win = filled(true, kLong, windows);
        kvc_memory m{};
        m.struct_size = sizeof m;
        win->memory(&m);
        const double held_mib = double(m.capacity_bytes) / 1048576.0;
        Step step;
        for (unsigned threads : {0u, 1u}) {
            full->set_threads(threads);
            win->set_threads(threads);
            step.run(*full); // warm-up: the thread pool, the plan's scratch
            step.run(*win);
            std::vector<double> tf, tw;
            for (int r = 0; r < kReps; ++r)
                for (int i = 0; i < 2; ++i) { // alternate which goes first
                    const bool windowed = (i + r) % 2 == 0;
                    opt::Engine& e = windowed ? *win : *full;
                    evict_caches();
                    flush_kv(e, windowed ? kLong + 2 * kReps + 4 : kWindow + 2 * kReps + 4);
                    (windowed ? tw : tf).push_back(step.run(e));
                }
            const double ratio = fastest(tw) / fastest(tf);
            state.counters[std::string("ratio_") + (threads == 0 ? "all" : "one")] = ratio;
            char note[240];
            std::snprintf(note, sizeof note,
                          "windowed step %.3f ms at %u tokens (W %u, S %u, evicting, %.1f MiB held), full step %.3f "
                          "ms at %u tokens (%u seqs, MHA %u x %u, f16)",
                          fastest(tw) * 1e3, kLong, kWindow, kSinks, held_mib, fastest(tf) * 1e3, kWindow, kSeqs, kHeads,
                          kHeadDim);
            report(std::string("9. decode time windowed 32k / full 4k, ") + (threads == 0 ? "all cores" : "one thread"),
                   ratio, "<= 1.2", note);
        }
    }
}

BENCHMARK(BM_DecodeWindowedVsFull)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
