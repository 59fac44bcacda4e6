// Decode attention over an f16 cache: (1) effective bandwidth against the same run's streaming read of a buffer of the
// same size: 8 sequences x 8,192 tokens (256 MiB), MHA and GQA 8:1, 16- and 256-token blocks; one sequence of 512 to
// 32,768 tokens with 32 heads; each with every core and with one thread; (2) decode time with blocks scattered over the
// pool against blocks in address order. Interleaved A/Bs in the same loop: heads walked together or one per kernel
// call, the AVX2 kernel's group path or its direct path (GQA), the AVX-512 kernel or the AVX2 one (machines with
// AVX-512), the AVX-512 group path's two score layouts (GQA), and the walk (prefetching, visits). Every timed decode
// and read of both groups starts from memory (evict_caches, then flush_lines over the measured K/V blocks or read
// buffer): the goal is decode at memory speed, and a cache left in a large L3 measured L3.
#include "bench_common.hpp"

#include "attention_kernel.hpp"
#include "simd.hpp"

#include <random>

namespace kvc::bench {
namespace {

constexpr uint32_t kSeqs = 8, kTokens = 8192, kKvHeads = 8, kHeadDim = 128, kBlock = 16;
constexpr int kReps = 9;

// The walks the decode is compared with (attention_kernel.hpp, WalkPlan), each made from this machine's default
// walk (16 rows per head ahead, into L2, heads interleaved in visits of 16 keys, of 4 on Intel cores; whole runs on
// AMD cores without AVX-512). One of "whole runs" and "heads interleaved", and one of the two visit lengths, is the
// default walk again: gauges of the run's noise.
struct OtherWalk {
    const char* label;
    const char* what;
    opt::WalkPlan (*from_default)(opt::WalkPlan);
};
constexpr OtherWalk kOtherWalks[] = {
    {"first walk", "16 rows ahead into L1, each head's whole run at a time (the walk the kernel began with)",
     [](opt::WalkPlan) { return opt::WalkPlan{16, false, false, 16}; }},
    {"into L1", "the default walk, prefetching into L1 (prefetcht0)",
     [](opt::WalkPlan w) { w.prefetch_to_l2 = false; return w; }},
    {"whole runs", "each head's whole run at a time", [](opt::WalkPlan w) { w.interleave_heads = false; return w; }},
    {"heads interleaved", "heads interleaved in the default's visits",
     [](opt::WalkPlan w) { w.interleave_heads = true; return w; }},
    {"visits of 16 keys", "heads interleaved in visits of 16 keys (the default except on Intel cores)",
     [](opt::WalkPlan w) { w.interleave_heads = true; w.visit_keys = 16; return w; }},
    {"visits of 4 keys", "heads interleaved in visits of 4 keys",
     [](opt::WalkPlan w) { w.interleave_heads = true; w.visit_keys = 4; return w; }},
    {"8 rows ahead", "the default walk, 8 rows ahead", [](opt::WalkPlan w) { w.prefetch_rows = 8; return w; }},
    {"32 rows ahead", "the default walk, 32 rows ahead", [](opt::WalkPlan w) { w.prefetch_rows = 32; return w; }},
    {"nothing ahead", "the default walk, 0 rows ahead", [](opt::WalkPlan w) { w.prefetch_rows = 0; return w; }},
    {"pages primed 8 KiB ahead", "the default walk, pages primed 8 KiB ahead (the default on Intel cores and Zen 4)",
     [](opt::WalkPlan w) { w.prime_kib = 8; return w; }},
    {"pages primed 16 KiB ahead", "the default walk, pages primed 16 KiB ahead",
     [](opt::WalkPlan w) { w.prime_kib = 16; return w; }},
    {"no pages primed", "the default walk, no pages primed", [](opt::WalkPlan w) { w.prime_kib = 0; return w; }},
    {"V prefetch spread", "the default walk, each V pass prefetching its share (the default on Intel cores)",
     [](opt::WalkPlan w) { w.spread_prefetch = true; return w; }},
    {"V prefetch in the first pass", "the default walk, the first V pass prefetching a piece's rows",
     [](opt::WalkPlan w) { w.spread_prefetch = false; return w; }},
};
constexpr int kWalks = sizeof kOtherWalks / sizeof kOtherWalks[0];
constexpr int kWholeRuns = 2, kHeadsInterleaved = 3, kVisits16 = 4, kVisits4 = 5; // their places above
constexpr int kPrimed8 = 9, kUnprimed = 11;
static_assert(std::string_view(kOtherWalks[kWholeRuns].label) == "whole runs", "kWholeRuns names its walk");
static_assert(std::string_view(kOtherWalks[kHeadsInterleaved].label) == "heads interleaved", "and kHeadsInterleaved");
static_assert(std::string_view(kOtherWalks[kVisits16].label) == "visits of 16 keys", "and kVisits16");
static_assert(std::string_view(kOtherWalks[kVisits4].label) == "visits of 4 keys", "and kVisits4");
static_assert(std::string_view(kOtherWalks[kPrimed8].label) == "pages primed 8 KiB ahead", "and kPrimed8");
static_assert(std::string_view(kOtherWalks[kUnprimed].label) == "no pages primed", "and kUnprimed");

struct Shape {
    uint32_t seqs = kSeqs, tokens = kTokens, q_heads = kKvHeads, kv_heads = kKvHeads, block = kBlock;
};

// Fills shape.seqs sequences of shape.tokens tokens each, one after the other. The pool is reserved up front, as
// a server sizes its cache at start-up (one slab, huge pages where the kernel grants them); blocks are then handed
// out in address order, or in a random order when shuffled.
std::unique_ptr<opt::Engine> filled(const Shape& sh, bool shuffled) {
    auto e = engine_for(config(sh.q_heads, sh.kv_heads, kHeadDim, KVC_DTYPE_F16, sh.block, sh.seqs));
    if (e->reserve_blocks(uint64_t(sh.seqs) * (sh.tokens / sh.block + 4)) != KVC_OK) std::exit(1);
    if (shuffled) e->shuffle_free_blocks(12345);
    std::mt19937 gen(7);
    std::normal_distribution<float> dist;
    const uint32_t chunk = std::min<uint32_t>(1024, sh.tokens);
    std::vector<float> k(size_t(chunk) * sh.kv_heads * kHeadDim), v(k.size());
    for (float& x : k) x = dist(gen);
    for (float& x : v) x = dist(gen);
    for (uint32_t s = 0; s < sh.seqs; ++s)
        for (uint32_t t = 0; t < sh.tokens; t += chunk)
            if (e->append(s, 0, chunk, k.data(), v.data()) != KVC_OK) std::exit(1);
    return e;
}

// Every K/V byte of the engine's sequences 0 .. seqs - 1 out of the caches (flush_lines, block by block).
void flush_kv(const opt::Engine& e, uint32_t seqs) {
    const kvc_kv_layout g = e.geometry();
    for (uint32_t s = 0; s < seqs; ++s)
        for (uint64_t pos = 0;; pos += g.block_size) {
            const uint8_t* block = e.slot_address(s, 0, pos, KVC_PLANE_K, 0); // slot 0 of head 0 of K: the block
            if (block == nullptr) break;
            flush_lines(block, kvc_kv_block_bytes(&g));
        }
}

struct DecodeStep {
    explicit DecodeStep(const Shape& shape) : sh(shape) {
        std::mt19937 gen(9);
        std::normal_distribution<float> dist;
        q.resize(size_t(sh.seqs) * sh.q_heads * kHeadDim);
        k.resize(size_t(sh.seqs) * sh.kv_heads * kHeadDim);
        v.resize(k.size());
        out.resize(q.size());
        for (float& x : q) x = dist(gen);
        for (float& x : k) x = dist(gen);
        for (float& x : v) x = dist(gen);
        for (uint32_t s = 0; s <= sh.seqs; ++s) offsets.push_back(s);
        for (uint32_t s = 0; s < sh.seqs; ++s) ids.push_back(s);
    }
    // One decode step of every sequence (one new token each); returns seconds per K/V byte it read (last_bytes).
    // Per byte, because every step adds a token: over a benchmark's few hundred steps a 512-token cache grows by
    // more than half, and the fastest step's time against the last step's bytes would overstate its speed. Per
    // byte, steps of any length compare fairly with each other and with the streaming read.
    double run(opt::Engine& e) {
        kvc_batch b{sizeof(kvc_batch), sh.seqs, ids.data(), offsets.data(), q.data(), k.data(), v.data(), out.data()};
        const double t0 = now_s();
        if (e.append_attend_batch(0, &b) != KVC_OK) std::exit(1);
        const double t = now_s() - t0;
        uint64_t tokens = 0;
        for (uint32_t s = 0; s < sh.seqs; ++s) {
            uint32_t len = 0;
            e.seq_length(s, 0, &len);
            tokens += len;
        }
        last_bytes = tokens * 2 * sh.kv_heads * kHeadDim * 2;
        return t / static_cast<double>(last_bytes);
    }
    Shape sh;
    uint64_t last_bytes = 0; // K/V bytes the last step read
    std::vector<float> q, k, v, out;
    std::vector<uint32_t> offsets, ids;
};

// The decode and its A/B variants, measured once each per repetition in an order that rotates (repetition r starts
// with measurement r mod n), each after evict_caches(). Without the eviction, whichever ran first would follow the
// streaming read and the others a decode with part of the K/V still in a large L3: in a fixed order that favours
// every variant over the decode by up to 4 % (the "whole runs" gauge, the default walk itself, reads 0.96-0.98 on a
// 480 MiB L3). The eviction removes that cause; the rotation is there for any other effect of order (clock, the
// pool's threads waking).
class Rotation {
public:
    // cold(): what else each measurement must find out of the caches (the scan of evict_caches() does not evict a
    // buffer every measurement reuses: flush_lines)
    explicit Rotation(std::function<void()> cold) : cold_(std::move(cold)) {}
    void add(std::vector<double>& times, std::function<double()> measure) {
        items_.push_back({&times, std::move(measure)});
    }
    void run(int repetition) {
        const size_t n = items_.size();
        for (size_t i = 0; i < n; ++i) {
            Item& it = items_[(static_cast<size_t>(repetition) + i) % n];
            evict_caches();
            cold_();
            it.times->push_back(it.measure());
        }
    }

private:
    std::function<void()> cold_;
    struct Item {
        std::vector<double>* times;
        std::function<double()> measure;
    };
    std::vector<Item> items_;
};

// The decode's bytes/s against a streaming read of a buffer as big, both with every core (the engine's pool) and
// then both with one thread; fastest of interleaved repetitions on each side, each measurement after evict_caches(),
// the A/B variants in a rotating order (Rotation).
void decode_bandwidth(benchmark::State& state, const Shape& sh, const std::string& name, const char* goal) {
    for (auto _ : state) {
        auto e = filled(sh, false);
        DecodeStep step(sh);
        step.run(*e); // warm-up
        // the read covers the first step's bytes; every time below is seconds per byte (DecodeStep::run)
        const uint64_t stream_bytes = step.last_bytes;
        TouchedBuffer buf(stream_bytes);
        // small caches take more repetitions: their steps are short, and the fastest of many is steadier
        const int reps = stream_bytes < (64u << 20) ? 4 * kReps : kReps;
        // A/B of the AVX2 kernel's group path (tiles of 4+ rows: GQA) against its direct path; same bits
        const bool ab_group = sh.q_heads / sh.kv_heads >= 4 && e->uses_simd();
        // A/B of the AVX-512 kernel against the AVX2 kernel (machines with AVX-512): for GQA its 512-bit group path,
        // for MHA its direct path with 32 registers; same bits
        const bool ab_wide = e->uses_simd() && opt::cpu_has_avx512();
        // A/B of that 512-bit group path's two score layouts (row pairs or key pairs; GQA); same bits
        const bool ab_layout = ab_group && opt::cpu_has_avx512();
        // A/B of the AVX2 kernel's walk (attention_kernel.hpp, WalkPlan) against other walks; same bits
        const bool ab_walk = e->uses_simd();
        const opt::WalkPlan walk0 = opt::avx2_walk();
        std::vector<double> t_walk[kWalks];
        std::vector<double> t_decode, t_stream, t_single, t_direct, t_avx2, t_layout;
        const auto decode = [&] { return step.run(*e); };
        // every step adds a token: a cache grown by more than 5 % is filled afresh, so that a small one (512 tokens
        // grow by 400 over the run) is measured at about its size
        bool one_thread = false;
        uint64_t max_bytes = stream_bytes; // the largest step so far
        const auto keep_size = [&] {
            max_bytes = std::max(max_bytes, step.last_bytes);
            if (step.last_bytes <= stream_bytes + stream_bytes / 20) return;
            e = filled(sh, false);
            if (one_thread) e->set_threads(1);
            step.run(*e); // warm-up
        };
        const auto cold_kv = [&] { flush_kv(*e, sh.seqs); };
        Rotation all_cores(cold_kv); // the decode and its A/B variants
        all_cores.add(t_decode, decode);
        all_cores.add(t_single, [&] { // one KV head per kernel call (EngineOptions::group_heads off)
            e->set_group_heads(false);
            const double t = step.run(*e);
            e->set_group_heads(true);
            return t;
        });
        if (ab_group) all_cores.add(t_direct, [&] { return with_group_paths(false, false, decode); });
        if (ab_wide) all_cores.add(t_avx2, [&] { return with_group_paths(true, false, decode); });
        if (ab_layout) all_cores.add(t_layout, [&] { return with_other_score_layout(decode); });
        for (int a = 0; ab_walk && a < kWalks; ++a)
            all_cores.add(t_walk[a], [&, a] { return with_walk(kOtherWalks[a].from_default(walk0), decode); });
        for (int r = 0; r < reps; ++r) { // interleaved, so drifts in the machine hit both sides alike
            keep_size();
            evict_caches();
            flush_lines(buf.data(), buf.size() + 64);
            t_stream.push_back(stream_read_seconds(buf.data(), stream_bytes) / double(stream_bytes));
            all_cores.run(r);
        }
        const double bw_decode = 1 / fastest(t_decode), bw_stream = 1 / fastest(t_stream);
        const double ratio = bw_decode / bw_stream;
        // the same on one core each: what a core achieves whatever else runs on the machine
        e->set_threads(1);
        one_thread = true;
        std::vector<double> t1_decode, t1_stream, t1_direct, t1_old_walk, t1_other_heads, t1_other_visits, t1_other_prime,
            t1_avx2, t1_layout;
        // the head walk and the visit length the default does not use (whole runs or heads interleaved; visits of 16
        // or 4 keys): the choices per machine kind
        const OtherWalk& other_heads = kOtherWalks[walk0.interleave_heads ? kWholeRuns : kHeadsInterleaved];
        const OtherWalk& other_visits = kOtherWalks[walk0.visit_keys == 4 ? kVisits16 : kVisits4];
        const OtherWalk& other_prime = kOtherWalks[walk0.prime_kib != 0 ? kUnprimed : kPrimed8];
        Rotation one_core(cold_kv);
        one_core.add(t1_decode, decode);
        if (ab_walk) {
            one_core.add(t1_old_walk, [&] { return with_walk(kOtherWalks[0].from_default(walk0), decode); });
            one_core.add(t1_other_heads, [&] { return with_walk(other_heads.from_default(walk0), decode); });
            one_core.add(t1_other_visits, [&] { return with_walk(other_visits.from_default(walk0), decode); });
            one_core.add(t1_other_prime, [&] { return with_walk(other_prime.from_default(walk0), decode); });
        }
        if (ab_group) one_core.add(t1_direct, [&] { return with_group_paths(false, false, decode); });
        if (ab_wide) one_core.add(t1_avx2, [&] { return with_group_paths(true, false, decode); });
        if (ab_layout) one_core.add(t1_layout, [&] { return with_other_score_layout(decode); });
        for (int r = 0; r < reps; ++r) { // as many as on all cores: one core of a shared host is the noisier side
            keep_size();
            evict_caches();
            flush_lines(buf.data(), buf.size() + 64);
            t1_stream.push_back(stream_read_seconds(buf.data(), stream_bytes, 1) / double(stream_bytes));
            one_core.run(r);
        }
        const double bw1_decode = 1 / fastest(t1_decode), bw1_stream = 1 / fastest(t1_stream);
        max_bytes = std::max(max_bytes, step.last_bytes);
        const auto tokens_of = [&](uint64_t b) { return unsigned(b / (uint64_t(sh.seqs) * sh.kv_heads * kHeadDim * 4)); };
        // a time per byte as milliseconds per step at the first step's size
        const auto ms = [&](const std::vector<double>& t) { return fastest(t) * double(stream_bytes) * 1e3; };
        const double ratio1 = bw1_decode / bw1_stream;
        state.counters["kv_MiB"] = stream_bytes / 1048576.0;
        state.counters["decode_GBps"] = bw_decode / 1e9;
        state.counters["stream_GBps"] = bw_stream / 1e9;
        state.counters["ratio"] = ratio;
        state.counters["ratio_1thread"] = ratio1;
        state.counters["decode_ms"] = ms(t_decode);
        char note[240];
        std::snprintf(note, sizeof note, "all cores: decode %.1f GB/s vs read %.1f GB/s, %.1f ms/step; %.0f MiB (%u to %u tokens per sequence)",
                      bw_decode / 1e9, bw_stream / 1e9, ms(t_decode), stream_bytes / 1048576.0, tokens_of(stream_bytes), tokens_of(max_bytes));
        report("1. decode / streaming read, " + name + ", all cores", ratio, goal, note);
        std::snprintf(note, sizeof note, "the same decode walking one KV head per kernel call: %.1f ms/step",
                      ms(t_single));
        report("1. ... heads walked together: speedup", fastest(t_single) / fastest(t_decode), "", note);
        if (ab_group) {
            std::snprintf(note, sizeof note, "the same decode on the kernel's direct path (no group path): %.1f ms/step",
                          ms(t_direct));
            report("1. ... GQA group path: speedup", fastest(t_direct) / fastest(t_decode), "", note);
            state.counters["group_path_speedup"] = fastest(t_direct) / fastest(t_decode);
        }
        if (ab_wide) {
            std::snprintf(note, sizeof note, "the same decode on the AVX2 kernel: %.1f ms/step", ms(t_avx2));
            report("1. ... AVX-512 kernel: speedup", fastest(t_avx2) / fastest(t_decode), "", note);
        }
        if (ab_layout) {
            std::snprintf(note, sizeof note, "the same decode, the AVX-512 score blocks in %s: %.1f ms/step",
                          other_score_layout(), ms(t_layout));
            report(std::string("1. ... score blocks of ") + other_score_layout() + ": time / default's",
                   fastest(t_layout) / fastest(t_decode), "", note);
        }
        for (int a = 0; ab_walk && a < kWalks; ++a) {
            std::snprintf(note, sizeof note, "the same decode, %s: %.1f ms/step", kOtherWalks[a].what,
                          ms(t_walk[a]));
            report(std::string("1. ... ") + kOtherWalks[a].label + ": time / default's",
                   fastest(t_walk[a]) / fastest(t_decode), "", note);
        }
        std::snprintf(note, sizeof note, "one thread: decode %.1f GB/s vs read %.1f GB/s, %.1f ms/step",
                      bw1_decode / 1e9, bw1_stream / 1e9, ms(t1_decode));
        report("1. decode / streaming read, " + name + ", one thread", ratio1, goal, note);
        if (ab_walk) {
            std::snprintf(note, sizeof note, "one thread, %s: %.1f ms/step", kOtherWalks[0].what,
                          ms(t1_old_walk));
            report(std::string("1. ... ") + kOtherWalks[0].label + ", one thread: time / default's",
                   fastest(t1_old_walk) / fastest(t1_decode), "", note);
            std::snprintf(note, sizeof note, "one thread, %s: %.1f ms/step", other_heads.what,
                          ms(t1_other_heads));
            report(std::string("1. ... ") + other_heads.label + ", one thread: time / default's",
                   fastest(t1_other_heads) / fastest(t1_decode), "", note);
            std::snprintf(note, sizeof note, "one thread, %s: %.1f ms/step", other_visits.what,
                          ms(t1_other_visits));
            report(std::string("1. ... ") + other_visits.label + ", one thread: time / default's",
                   fastest(t1_other_visits) / fastest(t1_decode), "", note);
            std::snprintf(note, sizeof note, "one thread, %s: %.1f ms/step", other_prime.what, ms(t1_other_prime));
            report(std::string("1. ... ") + other_prime.label + ", one thread: time / default's",
                   fastest(t1_other_prime) / fastest(t1_decode), "", note);
        }
        if (ab_group) {
            std::snprintf(note, sizeof note, "one thread, direct path: %.1f ms/step", ms(t1_direct));
            report("1. ... GQA group path, one thread: speedup", fastest(t1_direct) / fastest(t1_decode), "", note);
        }
        if (ab_wide) {
            std::snprintf(note, sizeof note, "one thread, AVX2 kernel: %.1f ms/step", ms(t1_avx2));
            report("1. ... AVX-512 kernel, one thread: speedup", fastest(t1_avx2) / fastest(t1_decode), "", note);
        }
        if (ab_layout) {
            std::snprintf(note, sizeof note, "one thread, the AVX-512 score blocks in %s: %.1f ms/step",
                          other_score_layout(), ms(t1_layout));
            report(std::string("1. ... score blocks of ") + other_score_layout() + ", one thread: time / default's",
                   fastest(t1_layout) / fastest(t1_decode), "", note);
        }
    }
}

void BM_DecodeBandwidth(benchmark::State& state) {
    Shape sh;
    sh.q_heads = static_cast<uint32_t>(state.range(0)) * kKvHeads;
    sh.block = static_cast<uint32_t>(state.range(1));
    const bool mha = sh.q_heads == sh.kv_heads;
    decode_bandwidth(state, sh, std::string(mha ? "MHA" : "GQA 8:1") + " f16, B " + std::to_string(sh.block),
                     mha ? ">= 0.80" : ">= 0.60");
}

// One sequence, 32 KV heads (MHA): the decode spreads its keys over the threads (split-KV).
void BM_DecodeSingleSequence(benchmark::State& state) {
    Shape sh;
    sh.seqs = 1;
    sh.tokens = static_cast<uint32_t>(state.range(0));
    sh.q_heads = sh.kv_heads = 32;
    decode_bandwidth(state, sh, "1 seq x " + std::to_string(sh.tokens) + ", 32 heads, B 16", ">= 0.80");
}

void BM_DecodeShuffledBlocks(benchmark::State& state) {
    for (auto _ : state) {
        auto contiguous = filled(Shape{}, false);
        auto shuffled = filled(Shape{}, true);
        DecodeStep step(Shape{});
        step.run(*contiguous);
        step.run(*shuffled);
        const double bytes0 = double(step.last_bytes); // times are per byte: ms per step at this size
        std::vector<double> tc, ts;
        for (int r = 0; r < kReps; ++r) {
            evict_caches();
            flush_kv(*contiguous, kSeqs);
            tc.push_back(step.run(*contiguous));
            evict_caches();
            flush_kv(*shuffled, kSeqs);
            ts.push_back(step.run(*shuffled));
        }
        const double overhead = fastest(ts) / fastest(tc) - 1.0;
        state.counters["contiguous_ms"] = fastest(tc) * bytes0 * 1e3;
        state.counters["shuffled_ms"] = fastest(ts) * bytes0 * 1e3;
        state.counters["overhead"] = overhead;
        char note[160];
        std::snprintf(note, sizeof note, "contiguous %.1f ms, shuffled %.1f ms per decode step (MHA f16, %u-token blocks)",
                      fastest(tc) * bytes0 * 1e3, fastest(ts) * bytes0 * 1e3, kBlock);
        report("2. decode time shuffled / contiguous blocks - 1", overhead, "<= 0.10", note);
    }
}

BENCHMARK(BM_DecodeBandwidth)->ArgNames({"group", "block"})->ArgsProduct({{1, 8}, {16, 256}})->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeSingleSequence)->ArgName("tokens")->Arg(512)->Arg(2048)->Arg(8192)->Arg(32768)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeShuffledBlocks)->Iterations(1)->Unit(benchmark::kMillisecond);

} // namespace
} // namespace kvc::bench
