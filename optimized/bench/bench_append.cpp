// (4) Append throughput against the same run's memcpy throughput, one thread each. Throughput is the caller's f32
// K and V bytes taken in per second (the same rows memcpy copies), so dtypes compare: an f32 cache is a
// scatter-copy of them, an f16 cache also converts and writes half as many bytes.
#include "bench_common.hpp"

#include <random>

namespace kvc::bench {
namespace {

void append_throughput(benchmark::State& state, uint32_t dtype) {
    const uint32_t H = 8, d = 128, n = 2048;
    for (auto _ : state) {
        opt::EngineOptions o;
        auto e = engine_for(config(H, H, d, dtype, 16, 2), o);
        std::mt19937 gen(3);
        std::normal_distribution<float> dist;
        std::vector<float> k(size_t(n) * H * d), v(k.size());
        for (float& x : k) x = dist(gen);
        for (float& x : v) x = dist(gen);
        const size_t copied = k.size() * 4 * 2; // the K and V inputs: what append takes in and memcpy copies
        TouchedBuffer dst(copied), src(copied);
        std::vector<double> ta, tm;
        for (int r = 0; r < 12; ++r) {
            const double t0 = now_s();
            if (e->append(0, 0, n, k.data(), v.data()) != KVC_OK) std::exit(1);
            ta.push_back(now_s() - t0);
            e->release(0); // the blocks go back to the free list: the next round reuses them (no page faults)
            tm.push_back(memcpy_seconds(dst.data(), src.data(), copied));
        }
        ta.erase(ta.begin()); // the first append also allocated and faulted the pool in
        const double bw_append = copied / fastest(ta), bw_memcpy = copied / fastest(tm);
        state.counters["append_GBps"] = bw_append / 1e9;
        state.counters["memcpy_GBps"] = bw_memcpy / 1e9;
        state.counters["ratio"] = bw_append / bw_memcpy;
        char note[160];
        std::snprintf(note, sizeof note, "append %.2f GB/s of f32 K/V in, memcpy %.2f GB/s (%u tokens, %u KV heads x %u)",
                      bw_append / 1e9, bw_memcpy / 1e9, n, H, d);
        report(std::string("4. append throughput / memcpy, ") + (dtype == KVC_DTYPE_F32 ? "f32" : "f16") + " cache",
               bw_append / bw_memcpy, "", note);
    }
}

void BM_AppendF32(benchmark::State& state) { append_throughput(state, KVC_DTYPE_F32); }
void BM_AppendF16(benchmark::State& state) { append_throughput(state, KVC_DTYPE_F16); }

BENCHMARK(BM_AppendF32)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AppendF16)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
