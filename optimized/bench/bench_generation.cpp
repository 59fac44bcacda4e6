// (3) Cached generation against the reference's full recompute. S(N) is the cost of producing the token at
// position N: the reference runs one forward pass over all N tokens (timed directly: a few passes, not a whole
// generation, which would take hours at N = 4096); the engine runs one cached decode step at length N (timed over
// the last steps of a real greedy generation that reached N through decode steps). Without a cache the per-step
// cost grows at least linearly in N, with one it is nearly flat, so S(4N)/S(N) should approach 4 or more.
// Both sides take the fastest of their timings (bench_common.hpp).
#include "bench_common.hpp"

#include "kvcheck/optimized/model_engine.hpp"

#include <algorithm>

namespace kvc::bench {
namespace {

ref::ModelConfig model() {
    ref::ModelConfig c;
    c.d_model = 64;
    c.n_layers = 2;
    c.n_q_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 32;
    c.vocab = 256;
    c.rope = ref::Rope::NeoX;
    c.rmsnorm = true;
    c.mlp = true;
    c.d_ff = 128;
    c.out_proj = true;
    c.residual = true;
    c.unembed = true;
    return c;
}

struct Point {
    double engine_step, reference_step, engine_generation;
};

Point measure(uint32_t N) {
    const ref::ModelConfig c = model();
    const auto w = ref::random_weights(c, 11);
    opt::ModelEngine engine(c, w);
    const int timed = 32;
    // a real greedy generation up to N - timed positions, then the timed steps
    double t0 = now_s();
    auto g = engine.generate({1, 2}, static_cast<int>(N) - 2 - timed);
    int next = g.tokens.back();
    std::vector<double> steps;
    for (int i = 0; i < timed; ++i) {
        const double s0 = now_s();
        const std::vector<float> logits = engine.forward(0, {next});
        steps.push_back(now_s() - s0);
        next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        g.tokens.push_back(next);
    }
    const double generation = now_s() - t0;
    // the reference's step at position N: one forward pass over the N-token prefix, recomputing everything
    const int passes = N >= 4096 ? 2 : N >= 1024 ? 3 : 5;
    std::vector<double> ref_steps;
    for (int i = 0; i < passes; ++i) {
        const double s0 = now_s();
        const auto trace = ref::forward<double>(c, w, ref::embed<double>(w, g.tokens));
        ref_steps.push_back(now_s() - s0);
        benchmark::DoNotOptimize(trace.next_token);
    }
    return {fastest(steps), fastest(ref_steps), generation};
}

void BM_GenerationSpeedup(benchmark::State& state) {
    for (auto _ : state) {
        const uint32_t ns[3] = {256, 1024, 4096};
        double s[3];
        for (int i = 0; i < 3; ++i) {
            const Point p = measure(ns[i]);
            s[i] = p.reference_step / p.engine_step;
            state.counters["S_" + std::to_string(ns[i])] = s[i];
            state.counters["engine_us_" + std::to_string(ns[i])] = p.engine_step * 1e6;
            state.counters["reference_ms_" + std::to_string(ns[i])] = p.reference_step * 1e3;
            char note[200];
            std::snprintf(note, sizeof note, "reference step %.1f ms, cached step %.1f us; whole cached generation %.2f s",
                          p.reference_step * 1e3, p.engine_step * 1e6, p.engine_generation);
            report("3. speedup S(" + std::to_string(ns[i]) + ") = reference step / cached step", s[i], "", note);
        }
        state.counters["S4096_over_S1024"] = s[2] / s[1];
        state.counters["S1024_over_S256"] = s[1] / s[0];
        report("3. S(1024) / S(256)", s[1] / s[0], ">= 3.5", "");
        report("3. S(4096) / S(1024)", s[2] / s[1], ">= 3.5", "");
    }
}

BENCHMARK(BM_GenerationSpeedup)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
