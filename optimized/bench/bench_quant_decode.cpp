// (8) Decode on a quantized cache against decode on an f16 cache holding the same tokens: 8 sequences x 8,192 tokens,
// MHA (8 heads of 128), 16-token blocks, one decode step of every sequence, with every core and with one thread.
// The two engines are measured alternately in one loop, each step after evict_caches() and a flush of its K/V
// blocks, so both read from memory; the ratio is fp8 step time / f16 step time (target: <= 0.6, since an
// fp8 cache reads half the bytes). int8 and q8_0 are measured the same way, for information.
#include "bench_common.hpp"

#include "kvcheck/abi.hpp"

#include <random>

namespace kvc::bench {
namespace {

constexpr uint32_t kSeqs = 8, kTokens = 8192, kHeads = 8, kHeadDim = 128, kBlock = 16;
constexpr int kReps = 9;

std::unique_ptr<opt::Engine> filled(uint32_t dtype) {
    kvc_config c = config(kHeads, kHeads, kHeadDim, dtype, kBlock, kSeqs);
    std::vector<float> scales(kHeads, 0.02f); // fp8: |x| up to ~9 before saturating; unit-normal rows fit
    if (kvc::dtype_is_fp8(dtype)) {
        c.kv_scale_mode = KVC_SCALE_KV_HEAD;
        c.k_scales = c.v_scales = scales.data();
    }
    c.int8_scale_dtype = KVC_DTYPE_F32;
    auto e = engine_for(c);
    if (e->reserve_blocks(uint64_t(kSeqs) * (kTokens / kBlock + 4)) != KVC_OK) std::exit(1);
    std::mt19937 gen(7);
    std::normal_distribution<float> dist;
    const uint32_t chunk = 1024;
    std::vector<float> k(size_t(chunk) * kHeads * kHeadDim), v(k.size());
    for (float& x : k) x = dist(gen);
    for (float& x : v) x = dist(gen);
    for (uint32_t s = 0; s < kSeqs; ++s)
        for (uint32_t t = 0; t < kTokens; t += chunk)
            if (e->append(s, 0, chunk, k.data(), v.data()) != KVC_OK) std::exit(1);
    return e;
}

void flush_kv(const opt::Engine& e) {
    const kvc_kv_layout g = e.geometry();
    for (uint32_t s = 0; s < kSeqs; ++s)
        for (uint64_t pos = 0;; pos += g.block_size) {
            const uint8_t* block = e.slot_address(s, 0, pos, KVC_PLANE_K, 0);
            if (block == nullptr) break;
            flush_lines(block, kvc_kv_block_bytes(&g));
        }
}

// One decode step of every sequence; seconds. The caches grow by one token per step, equally for both engines.
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

// Fastest step time of a quantized cache and of the f16 cache, alternating, then the same with one thread.
void quant_decode(benchmark::State& state, uint32_t dtype, const char* goal) {
    for (auto _ : state) {
        auto f16 = filled(KVC_DTYPE_F16);
        auto quant = filled(dtype);
        Step step;
        for (unsigned threads : {0u, 1u}) {
            f16->set_threads(threads);
            quant->set_threads(threads);
            step.run(*f16); // warm-up: the thread pool, the plan's scratch
            step.run(*quant);
            std::vector<double> t16, tq;
            for (int r = 0; r < kReps; ++r)
                for (int i = 0; i < 2; ++i) { // alternate which goes first
                    opt::Engine& e = (i + r) % 2 == 0 ? *f16 : *quant;
                    evict_caches();
                    flush_kv(e);
                    ((&e == f16.get()) ? t16 : tq).push_back(step.run(e));
                }
            const double ratio = fastest(tq) / fastest(t16);
            const std::string mode = threads == 0 ? "all cores" : "one thread";
            state.counters[std::string("ratio_") + (threads == 0 ? "all" : "one")] = ratio;
            char note[200];
            std::snprintf(note, sizeof note, "%s step %.3f ms, f16 step %.3f ms (%u seqs x %u tokens, MHA %u x %u)",
                          kvc::dtype_name(dtype), fastest(tq) * 1e3, fastest(t16) * 1e3, kSeqs, kTokens, kHeads,
                          kHeadDim);
            report(std::string("8. decode time ") + kvc::dtype_name(dtype) + " / f16, " + mode, ratio, goal, note);
        }
    }
}

void BM_DecodeFp8VsF16(benchmark::State& state) { quant_decode(state, KVC_DTYPE_FP8_E4M3, "<= 0.6"); }
void BM_DecodeE5M2VsF16(benchmark::State& state) { quant_decode(state, KVC_DTYPE_FP8_E5M2, "<= 0.6"); }
void BM_DecodeInt8VsF16(benchmark::State& state) { quant_decode(state, KVC_DTYPE_INT8_TOKEN, ""); }
void BM_DecodeQ8_0VsF16(benchmark::State& state) { quant_decode(state, KVC_DTYPE_Q8_0, ""); }

BENCHMARK(BM_DecodeFp8VsF16)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeE5M2VsF16)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeInt8VsF16)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeQ8_0VsF16)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
