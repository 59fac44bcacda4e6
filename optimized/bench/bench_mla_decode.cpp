// (10) Decode of a multi-head latent attention cache (DeepSeek's MLA run as MQA over the latent): one KV head, 16
// query heads, K rows of 576 dims (the 512-dim latent plus a 64-dim RoPE tail, rotated on [512, 576)) and V rows of
// 512, bf16, 16-token blocks, one sequence of 4,096 tokens (8.5 MiB of K/V). Against, in the same run:
//  - an ordinary decode reading as many cache bytes: MHA, 8 heads of 128, bf16, one sequence of 2,176 tokens
//    (4,096 x 2,176 bytes = 2,176 x 4,096);
//  - the streaming read of as many bytes (the machine's read bandwidth, as group 1);
//  - the same MLA cache on the portable kernel (EngineOptions::simd off): what the x86 kernel gains on this shape.
// MLA does 16 query heads' dot products of 576 and sums of 512 per cached byte pair, so it is bound by arithmetic
// long before memory: the lines say how far from the ordinary decode and from the read that leaves it. All four are
// measured alternately, each after evict_caches() and a flush of its bytes (from memory), with every core and with
// one thread; the fastest of kReps each.
#include "bench_common.hpp"

#include "kvcheck/abi.hpp"

#include <random>

namespace kvc::bench {
namespace {

constexpr uint32_t kQHeads = 16, kLatent = 512, kRopeDims = 64, kKDim = kLatent + kRopeDims, kVDim = kLatent;
constexpr uint32_t kTokens = 4096, kBlock = 16;
// the ordinary decode: kMhaHeads heads of kMhaDim, as many bytes per sequence as the MLA cache
constexpr uint32_t kMhaHeads = 8, kMhaDim = 128;
constexpr uint32_t kMhaTokens = kTokens * (kKDim + kVDim) / (2 * kMhaHeads * kMhaDim);
static_assert(uint64_t{kTokens} * (kKDim + kVDim) == uint64_t{kMhaTokens} * 2 * kMhaHeads * kMhaDim, "equal bytes");
constexpr int kReps = 7;

kvc_config mla_config() {
    kvc_config c = config(kQHeads, 1, kKDim, KVC_DTYPE_BF16, kBlock, 1, KVC_ROPE_NEOX);
    c.head_dim_v = kVDim;
    c.rope_dim_begin = kLatent;
    c.rope_dims = kRopeDims;
    return c;
}

// An engine whose one sequence holds `tokens` of random K/V.
std::unique_ptr<opt::Engine> filled(const kvc_config& c, uint32_t tokens, bool simd) {
    opt::EngineOptions o;
    o.simd = simd;
    auto e = engine_for(c, o);
    if (e->reserve_blocks(tokens / kBlock + 4) != KVC_OK) std::exit(1);
    std::mt19937 gen(7);
    std::normal_distribution<float> dist;
    const uint32_t dv = c.head_dim_v ? c.head_dim_v : c.head_dim, chunk = 256;
    std::vector<float> k(size_t(chunk) * c.n_kv_heads * c.head_dim), v(size_t(chunk) * c.n_kv_heads * dv);
    for (float& x : k) x = dist(gen);
    for (float& x : v) x = dist(gen);
    for (uint32_t t = 0; t < tokens; t += chunk)
        if (e->append(0, 0, std::min(chunk, tokens - t), k.data(), v.data()) != KVC_OK) std::exit(1);
    return e;
}

// The cache bytes of the engine's one sequence (K and V rows of every head), and a flush of all of its blocks.
uint64_t kv_bytes(const opt::Engine& e, uint32_t tokens) {
    const kvc_kv_layout g = e.geometry(), gv = e.geometry_v();
    return uint64_t{tokens} * g.n_kv_heads * (g.row_bytes + gv.row_bytes);
}
void flush_kv(const opt::Engine& e, uint32_t tokens) {
    const kvc_kv_layout g = e.geometry(), gv = e.geometry_v();
    const uint64_t block_bytes = g.plane_bytes + uint64_t{g.n_kv_heads} * gv.head_bytes; // K plane, then V's
    for (uint64_t pos = 0; pos < tokens; pos += g.block_size)
        if (const uint8_t* block = e.slot_address(0, 0, pos, KVC_PLANE_K, 0)) flush_lines(block, block_bytes);
}

// One decode step of the one sequence; seconds.
struct Step {
    explicit Step(const kvc_config& c) {
        std::mt19937 gen(9);
        std::normal_distribution<float> dist;
        const uint32_t dv = c.head_dim_v ? c.head_dim_v : c.head_dim;
        q.resize(size_t(c.n_q_heads) * c.head_dim);
        k.resize(size_t(c.n_kv_heads) * c.head_dim);
        v.resize(size_t(c.n_kv_heads) * dv);
        out.resize(size_t(c.n_q_heads) * dv);
        for (std::vector<float>* x : {&q, &k, &v})
            for (float& e : *x) e = dist(gen);
    }
    double run(opt::Engine& e) {
        const double t0 = now_s();
        if (e.append_attend(0, 0, 1, q.data(), k.data(), v.data(), out.data()) != KVC_OK) std::exit(1);
        return now_s() - t0;
    }
    std::vector<float> q, k, v, out;
};

void BM_DecodeLatent(benchmark::State& state) {
    for (auto _ : state) {
        const kvc_config cm = mla_config();
        const kvc_config co = config(kMhaHeads, kMhaHeads, kMhaDim, KVC_DTYPE_BF16, kBlock, 1);
        auto mla = filled(cm, kTokens, true);
        auto portable = filled(cm, kTokens, false);
        auto ordinary = filled(co, kMhaTokens, true);
        const uint64_t bytes = kv_bytes(*mla, kTokens);
        if (bytes != kv_bytes(*ordinary, kMhaTokens)) std::exit(1);
        TouchedBuffer buf(bytes);
        Step step_mla(cm), step_ordinary(co);
        for (unsigned threads : {0u, 1u}) {
            for (opt::Engine* e : {mla.get(), portable.get(), ordinary.get()}) e->set_threads(threads);
            step_mla.run(*mla); // warm-up: the thread pool, the plan's scratch
            step_mla.run(*portable);
            step_ordinary.run(*ordinary);
            std::vector<double> t_mla, t_portable, t_ordinary, t_stream;
            for (int r = 0; r < kReps; ++r)
                for (int i = 0; i < 4; ++i) { // rotate which goes first
                    const int which = (i + r) % 4;
                    evict_caches();
                    if (which == 0) {
                        flush_kv(*mla, kTokens + kReps + 2);
                        t_mla.push_back(step_mla.run(*mla));
                    } else if (which == 1) {
                        flush_kv(*portable, kTokens + kReps + 2);
                        t_portable.push_back(step_mla.run(*portable));
                    } else if (which == 2) {
                        flush_kv(*ordinary, kMhaTokens + kReps + 2);
                        t_ordinary.push_back(step_ordinary.run(*ordinary));
                    } else {
                        flush_lines(buf.data(), buf.size() + 64);
                        t_stream.push_back(stream_read_seconds(buf.data(), bytes, threads));
                    }
                }
            const std::string how = threads == 0 ? "all cores" : "one thread";
            char note[320];
            std::snprintf(note, sizeof note,
                          "MLA step %.3f ms (%u q heads, 1 KV head, K %u / V %u, RoPE %u, bf16, %u tokens, %.1f MiB), "
                          "portable %.3f ms, MHA %ux%u step %.3f ms (%u tokens), read %.3f ms",
                          fastest(t_mla) * 1e3, kQHeads, kKDim, kVDim, kRopeDims, kTokens, double(bytes) / 1048576.0,
                          fastest(t_portable) * 1e3, kMhaHeads, kMhaDim, fastest(t_ordinary) * 1e3, kMhaTokens,
                          fastest(t_stream) * 1e3);
            report("10. MLA decode time / ordinary decode of as many bytes, " + how,
                   fastest(t_mla) / fastest(t_ordinary), "", note);
            report("10. ... MLA decode / streaming read, " + how, fastest(t_stream) / fastest(t_mla), "", note);
            report("10. ... ordinary decode / streaming read, " + how, fastest(t_stream) / fastest(t_ordinary), "",
                   note);
            report("10. ... MLA on the x86 kernel: speedup over portable, " + how,
                   fastest(t_portable) / fastest(t_mla), "", note);
        }
    }
}

BENCHMARK(BM_DecodeLatent)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
