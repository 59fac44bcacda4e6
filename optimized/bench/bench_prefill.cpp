// (6) Prefill: one sequence's prompt through append_attend in chunks (causal attention inside each chunk and over
// everything before it), MHA and GQA 8:1, f16 cache, 16-token blocks, every core. Prefill is compute-bound, so it is
// reported as lane-FMAs per ns: the F32 class's multiply-adds (q.k and p.v, per query head, per visible key, per
// dimension) over the time. Tiles hold several query tokens, so prefill takes the kernel's group path even for MHA;
// interleaved A/Bs against the direct path, and on AVX-512 machines against the AVX2 kernel. No goal applies here:
// the lines say what the group path and the AVX-512 kernel do for prefill.
#include "bench_common.hpp"

#include "simd.hpp"

#include <random>

namespace kvc::bench {
namespace {

constexpr uint32_t kTokens = 2048, kChunk = 256, kKvHeads = 8, kHeadDim = 128;
constexpr int kReps = 4;

void prefill(benchmark::State& state, uint32_t group) {
    const uint32_t qh = group * kKvHeads;
    for (auto _ : state) {
        auto e = engine_for(config(qh, kKvHeads, kHeadDim, KVC_DTYPE_F16, 16, 1));
        std::mt19937 gen(11);
        std::normal_distribution<float> dist;
        std::vector<float> q(size_t(kTokens) * qh * kHeadDim), k(size_t(kTokens) * kKvHeads * kHeadDim), v(k.size());
        std::vector<float> out(q.size());
        for (float& x : q) x = dist(gen);
        for (float& x : k) x = dist(gen);
        for (float& x : v) x = dist(gen);
        auto run = [&] {
            const double t0 = now_s();
            for (uint32_t t = 0; t < kTokens; t += kChunk)
                if (e->append_attend(0, 0, kChunk, q.data() + size_t(t) * qh * kHeadDim,
                                     k.data() + size_t(t) * kKvHeads * kHeadDim,
                                     v.data() + size_t(t) * kKvHeads * kHeadDim,
                                     out.data() + size_t(t) * qh * kHeadDim) != KVC_OK)
                    std::exit(1);
            const double seconds = now_s() - t0;
            e->release(0); // the blocks go back to the free list: every run appends into the same memory
            return seconds;
        };
        run(); // warm-up: the pool is allocated and faulted in
        const bool ab_wide = e->uses_simd() && opt::cpu_has_avx512();
        std::vector<double> t_default, t_direct, t_avx2;
        for (int r = 0; r < kReps; ++r) { // interleaved, so drifts in the machine hit every side alike
            t_default.push_back(run());
            if (e->uses_simd()) t_direct.push_back(with_group_paths(false, false, run));
            if (ab_wide) t_avx2.push_back(with_group_paths(true, false, run));
        }
        // every query row sees its own position and all before it: T (T + 1) / 2 (row, key) pairs per query head
        const double fmas = double(qh) * kHeadDim * 2 * (double(kTokens) * (kTokens + 1) / 2);
        const double rate = fmas / fastest(t_default) / 1e9;
        state.counters["lane_fmas_per_ns"] = rate;
        const std::string name = group == 1 ? "MHA" : "GQA " + std::to_string(group) + ":1";
        char note[200];
        std::snprintf(note, sizeof note, "%.1f ms per prompt of %u tokens in chunks of %u, f16, B 16, all cores",
                      fastest(t_default) * 1e3, kTokens, kChunk);
        report("6. prefill " + name + ": lane-FMAs per ns", rate, "", note);
        if (!t_direct.empty()) {
            std::snprintf(note, sizeof note, "the same prefill on the AVX2 kernel's direct path: %.1f ms",
                          fastest(t_direct) * 1e3);
            report("6. ... group path: speedup", fastest(t_direct) / fastest(t_default), "", note);
        }
        if (ab_wide) {
            std::snprintf(note, sizeof note, "the same prefill on the AVX2 kernel: %.1f ms", fastest(t_avx2) * 1e3);
            report("6. ... AVX-512 group path: speedup", fastest(t_avx2) / fastest(t_default), "", note);
        }
    }
}

void BM_Prefill(benchmark::State& state) { prefill(state, static_cast<uint32_t>(state.range(0))); }

BENCHMARK(BM_Prefill)->ArgName("group")->Arg(1)->Arg(8)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
