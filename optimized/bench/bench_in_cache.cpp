// (7) Decode in cache: one thread, one sequence of 240 to 253 tokens with 8 KV heads of 128 (f16: under 1 MiB of K/V,
// inside every L2 here), so the kernel's own work is what the time measures, not memory. Under 256 keys is one split
// per head, as a long decode has one per 256 keys: the per-split work weighs as it does there. Two ratios, in one run:
//  - GQA 8:1: lane-FMAs per ns (q.k and p.v, per query head, per key, per dimension) over the same run's FMA loop
//    (16 independent chains, in the widest registers the kernel's group path uses). The group path shares each cached
//    byte with 8 query rows, so its decode is bound by arithmetic: this is how close to the core's peak it computes.
//  - MHA: bytes/s over the same run's read of a buffer as big (one thread, also in L2): the kernel's overhead
//    per byte where memory is not the limit.
// No goal applies here; the lines make the in-cache figures of docs/performance.md reproducible. On machines
// with AVX-512, GQA also A/Bs WalkPlan::spread_prefetch in the same loop (every second step), to show its cost here.
#include "bench_common.hpp"

#include "attention_kernel.hpp"
#include "simd.hpp"

#include <immintrin.h>

#include <random>

namespace kvc::bench {
namespace {

constexpr uint32_t kTokens = 240, kKvHeads = 8, kHeadDim = 128, kBlock = 16, kStepsPerFill = 12;
constexpr int kFills = 40;

// FMAs per ns of 16 independent chains, each `iters` FMAs long, in 256- or 512-bit registers (lane-FMAs: x 8 or x 16).
constexpr int kChains = 16;

KVC_TARGET_AVX2 double fma_loop_ymm(uint64_t iters) {
    __m256 a[kChains];
    for (int i = 0; i < kChains; ++i) a[i] = _mm256_set1_ps(float(i));
    const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
    const double t0 = now_s();
    for (uint64_t n = 0; n < iters; ++n)
        KVC_UNROLL for (int i = 0; i < kChains; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
    const double t = now_s() - t0;
    __m256 s = a[0];
    for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, a[i]);
    benchmark::DoNotOptimize(s);
    return t;
}

KVC_TARGET_AVX512 double fma_loop_zmm(uint64_t iters) {
    __m512 a[kChains];
    for (int i = 0; i < kChains; ++i) a[i] = _mm512_set1_ps(float(i));
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
    const double t0 = now_s();
    for (uint64_t n = 0; n < iters; ++n)
        KVC_UNROLL for (int i = 0; i < kChains; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
    const double t = now_s() - t0;
    __m512 s = a[0];
    for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, a[i]);
    benchmark::DoNotOptimize(s);
    return t;
}

// Lane-FMAs per second of the FMA loop: fastest of 5 runs of 2^20 x 16 FMAs.
double fma_peak(bool zmm) {
    constexpr uint64_t kIters = 1u << 20;
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) t.push_back(zmm ? fma_loop_zmm(kIters) : fma_loop_ymm(kIters));
    return double(kIters) * kChains * (zmm ? 16 : 8) / fastest(t);
}

// K/V bytes a decode step reads over `tokens` cached tokens (f16: 2 bytes, K and V).
constexpr uint64_t kv_bytes(uint64_t tokens) { return tokens * 2 * kKvHeads * kHeadDim * 2; }

// Seconds per byte of one-thread decode steps over a cache of kTokens tokens: the sequence is filled afresh every
// kStepsPerFill steps (each step adds a token: 12 steps grow it by 5 %), fastest step per byte. With `other`, every
// second step runs that walk instead (an A/B in one loop), its fastest into *other_spb.
double in_cache_seconds_per_byte(uint32_t group, const opt::WalkPlan* other = nullptr, double* other_spb = nullptr) {
    const uint32_t qh = group * kKvHeads;
    auto e = engine_for(config(qh, kKvHeads, kHeadDim, KVC_DTYPE_F16, kBlock, 1));
    e->set_threads(1);
    std::mt19937 gen(13);
    std::normal_distribution<float> dist;
    std::vector<float> k(size_t(kTokens) * kKvHeads * kHeadDim), v(k.size());
    std::vector<float> q(size_t(qh) * kHeadDim), out(q.size()), k1(size_t(kKvHeads) * kHeadDim), v1(k1.size());
    for (float& x : k) x = dist(gen);
    for (float& x : v) x = dist(gen);
    for (float& x : q) x = dist(gen);
    for (float& x : k1) x = dist(gen);
    for (float& x : v1) x = dist(gen);
    std::vector<double> t, t_other;
    const opt::WalkPlan walk0 = opt::avx2_walk();
    for (int f = 0; f < kFills; ++f) {
        e->release(0); // the blocks go back to the free list: every fill writes the same memory
        if (e->append(0, 0, kTokens, k.data(), v.data()) != KVC_OK) std::exit(1);
        for (uint32_t s = 0; s <= kStepsPerFill; ++s) {
            const bool b = other != nullptr && s % 2 == 1;
            if (b) opt::set_avx2_walk(*other);
            const double t0 = now_s();
            if (e->append_attend(0, 0, 1, q.data(), k1.data(), v1.data(), out.data()) != KVC_OK) std::exit(1);
            const double dt = now_s() - t0;
            if (b) opt::set_avx2_walk(walk0);
            if (s == 0) continue; // warm-up after the fill
            (b ? t_other : t).push_back(dt / double(kv_bytes(kTokens + s + 1)));
        }
    }
    if (other_spb != nullptr) *other_spb = fastest(t_other);
    return fastest(t);
}

void BM_DecodeInCache(benchmark::State& state) {
    const uint32_t group = static_cast<uint32_t>(state.range(0));
    for (auto _ : state) {
        if (!opt::cpu_has_avx2_f16c()) {
            state.SkipWithError("no AVX2/FMA/F16C: the portable kernels have no FMA loop to compare with");
            return;
        }
        // GQA: the AVX-512 group path's V prefetches spread over its passes, or not (WalkPlan::spread_prefetch)
        opt::WalkPlan other = opt::avx2_walk();
        other.spread_prefetch = !other.spread_prefetch;
        double other_spb = 0;
        const bool ab_spread = group > 1 && opt::cpu_has_avx512();
        const double spb = in_cache_seconds_per_byte(group, ab_spread ? &other : nullptr, &other_spb);
        const double gbps = 1 / spb / 1e9;
        char note[240];
        if (group > 1) {
            // lane-FMAs per cached byte: 2 d per query head per key, over 4 d bytes of K and V per KV head per key
            const double fmas_per_byte = double(group) * 2 * kHeadDim / (2.0 * kHeadDim * 2);
            const double rate = fmas_per_byte / spb / 1e9; // lane-FMAs per ns
            // the group path runs in zmm where the AVX-512 kernel is in use (attention_kernel_avx512.cpp)
            const bool zmm = opt::cpu_has_avx512();
            const double peak = fma_peak(zmm) / 1e9;
            state.counters["lane_fmas_per_ns"] = rate;
            state.counters["peak_lane_fmas_per_ns"] = peak;
            std::snprintf(note, sizeof note,
                          "%.1f GB/s, %.1f lane-FMAs/ns against the %s FMA loop's %.1f; %u tokens, f16, B %u, one thread",
                          gbps, rate, zmm ? "512-bit" : "256-bit", peak, kTokens, kBlock);
            report("7. in-cache decode GQA " + std::to_string(group) + ":1 / FMA peak, one thread", rate / peak, "",
                   note);
            if (ab_spread) {
                std::snprintf(note, sizeof note, "the same steps with %s: %.1f GB/s",
                              other.spread_prefetch ? "each V pass prefetching its share"
                                                    : "the first V pass prefetching a piece's rows",
                              1 / other_spb / 1e9);
                report(std::string("7. ... V prefetch ") + (other.spread_prefetch ? "spread" : "in the first pass") +
                           ": time / default's",
                       other_spb / spb, "", note);
            }
        } else {
            const uint64_t bytes = kv_bytes(kTokens);
            TouchedBuffer buf(bytes);
            std::vector<double> t_read;
            for (int r = 0; r < 200; ++r) t_read.push_back(stream_read_seconds(buf.data(), bytes, 1) / double(bytes));
            const double read = 1 / fastest(t_read) / 1e9;
            state.counters["decode_GBps"] = gbps;
            state.counters["read_GBps"] = read;
            std::snprintf(note, sizeof note, "%.1f GB/s against a read of %.1f GB/s (as many bytes, in L2); %u tokens, f16, B %u",
                          gbps, read, kTokens, kBlock);
            report("7. in-cache decode MHA / in-cache read, one thread", gbps / read, "", note);
        }
    }
}

BENCHMARK(BM_DecodeInCache)->ArgName("group")->Arg(1)->Arg(8)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
