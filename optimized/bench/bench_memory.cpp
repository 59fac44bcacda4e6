// (5) Allocated / live K/V bytes over a serving-like trace: sequences arrive with prompts of mixed lengths
// (log-uniform 16..4096), decode a few tokens at a time, and finish in random order; blocks of finished sequences
// are reused. Allocated = capacity_bytes (the blocks sequences hold: what paging wastes is the unfilled end of each
// last block); held = capacity_bytes + pool_bytes (every byte of K/V storage, free blocks and slab reserve too);
// live = live_bytes.
#include "bench_common.hpp"

#include <cmath>
#include <random>

namespace kvc::bench {
namespace {

void BM_MemoryTrace(benchmark::State& state) {
    const uint32_t H = 2, d = 64, B = 16, max_seqs = 256, active_target = 32, events = 3000;
    for (auto _ : state) {
        auto e = engine_for(config(H, H, d, KVC_DTYPE_F16, B, max_seqs));
        std::mt19937_64 gen(2024);
        std::vector<float> k(size_t(4096) * H * d, 0.5f), v(k.size(), -0.5f);
        std::vector<uint32_t> active, idle;
        for (uint32_t s = 0; s < max_seqs; ++s) idle.push_back(s);
        double cap_sum = 0, cap_worst = 0, held_sum = 0, held_worst = 0;
        int samples = 0;
        kvc_memory m{};
        m.struct_size = sizeof m;
        for (uint32_t ev = 0; ev < events; ++ev) {
            const uint32_t kind = static_cast<uint32_t>(gen() % 8);
            if ((kind == 0 || active.size() < active_target / 2) && !idle.empty()) { // a request arrives
                const uint32_t s = idle.back();
                idle.pop_back();
                const double u = std::uniform_real_distribution<double>(std::log(16.0), std::log(4096.0))(gen);
                if (e->append(s, 0, static_cast<uint32_t>(std::exp(u)), k.data(), v.data()) != KVC_OK) std::exit(1);
                active.push_back(s);
            } else if (kind == 1 && active.size() > active_target / 2) { // a request finishes
                const size_t i = gen() % active.size();
                e->release(active[i]);
                idle.push_back(active[i]);
                active.erase(active.begin() + static_cast<long>(i));
            } else { // every active sequence decodes 1..8 tokens
                for (uint32_t s : active)
                    if (e->append(s, 0, 1 + static_cast<uint32_t>(gen() % 8), k.data(), v.data()) != KVC_OK) std::exit(1);
            }
            e->memory(&m);
            if (ev >= events / 4 && m.live_bytes > 0) { // after warm-up
                const double cap = double(m.capacity_bytes) / double(m.live_bytes);
                const double held = double(m.capacity_bytes + m.pool_bytes) / double(m.live_bytes);
                cap_sum += cap;
                held_sum += held;
                cap_worst = std::max(cap_worst, cap);
                held_worst = std::max(held_worst, held);
                ++samples;
            }
        }
        state.counters["allocated_mean"] = cap_sum / samples;
        state.counters["allocated_worst"] = cap_worst;
        state.counters["held_mean"] = held_sum / samples;
        state.counters["held_worst"] = held_worst;
        char note[200];
        std::snprintf(note, sizeof note, "worst %.3f; %u-token blocks, %u events, %.1f MiB live at the end", cap_worst, B,
                      events, m.live_bytes / 1048576.0);
        report("5. allocated (blocks held) / live K/V bytes, trace mean", cap_sum / samples, "<= 1.04", note);
        std::snprintf(note, sizeof note, "worst %.3f: free slabs go back to malloc, scattered blocks are compacted",
                      held_worst);
        report("5b. held (blocks + free pool) / live K/V bytes, trace mean", held_sum / samples, "<= 1.10", note);
    }
}

BENCHMARK(BM_MemoryTrace)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
