#include "bench_common.hpp"
#include "attention_kernel.hpp"

#include "block_pool.hpp"
#include "simd.hpp"
#include "thread_pool.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include <unistd.h>

namespace kvc::bench {
namespace {

struct Line {
    std::string what, goal, note;
    double value;
};
std::vector<Line>& lines() {
    static std::vector<Line> l;
    return l;
}

struct StreamJob {
    const uint8_t* buf;
    size_t chunk, bytes;
    std::vector<float> sums;
};

KVC_TARGET_AVX2 float sum_avx2(const uint8_t* p, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(reinterpret_cast<const float*>(p + i)));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(reinterpret_cast<const float*>(p + i + 32)));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(reinterpret_cast<const float*>(p + i + 64)));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(reinterpret_cast<const float*>(p + i + 96)));
    }
    alignas(32) float t[8];
    _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

float sum_portable(const uint8_t* p, size_t n) {
    float acc[8] = {};
    for (size_t i = 0; i + 32 <= n; i += 32)
        for (int j = 0; j < 8; ++j) {
            float x;
            std::memcpy(&x, p + i + 4 * j, 4);
            acc[j] += x;
        }
    return acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

void stream_item(void* ctx, size_t i) {
    auto* job = static_cast<StreamJob*>(ctx);
    const size_t off = i * job->chunk, n = std::min(job->chunk, job->bytes - off);
    job->sums[i] = opt::cpu_has_avx2_f16c() ? sum_avx2(job->buf + off, n) : sum_portable(job->buf + off, n);
}

std::string cpu_model() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

// The model name alone does not tell the machine kinds apart here (both say "AMD EPYC"): the widest vector
// extension does (Zen 3: AVX2; Zen 4: AVX-512).
std::string cpu_label() {
    const char* widest = "no AVX2";
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) widest = "AVX-512F";
    else if (__builtin_cpu_supports("avx2")) widest = "AVX2";
#endif
    return cpu_model() + " with " + widest;
}

} // namespace

double median(std::vector<double> xs) {
    if (xs.empty()) return NAN;
    std::sort(xs.begin(), xs.end());
    return xs[xs.size() / 2];
}

double fastest(const std::vector<double>& xs) { return xs.empty() ? NAN : *std::min_element(xs.begin(), xs.end()); }

double with_group_paths(bool avx2, bool avx512, const std::function<double()>& run) {
    opt::set_avx2_group_path(avx2);
    opt::set_avx512_group_path(avx512);
    const double seconds = run();
    opt::set_avx2_group_path(true);
    opt::set_avx512_group_path(true);
    return seconds;
}

double with_other_score_layout(const std::function<double()>& run) {
    const bool before = opt::avx512_score_row_pairs();
    opt::set_avx512_score_row_pairs(!before);
    const double seconds = run();
    opt::set_avx512_score_row_pairs(before);
    return seconds;
}

const char* other_score_layout() { return opt::avx512_score_row_pairs() ? "key pairs" : "row pairs"; }

double with_walk(const opt::WalkPlan& walk, const std::function<double()>& run) {
    const opt::WalkPlan before = opt::avx2_walk();
    opt::set_avx2_walk(walk);
    const double seconds = run();
    opt::set_avx2_walk(before);
    return seconds;
}

TouchedBuffer::TouchedBuffer(size_t bytes) : p_(new uint8_t[bytes + 64]), n_(bytes) { // new[]: not yet touched
    opt::advise_huge_pages(p_.get(), bytes + 64);
    for (size_t i = 0; i < bytes + 64; i += 4096) p_[i] = 1;
}

namespace {
// Twice the last-level cache the OS reports (glibc's sysconf: 0 or -1 where it does not know), at least 64 MiB and
// at most 4 GiB (a value past that is not a cache size).
size_t eviction_size() {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    const size_t last = static_cast<size_t>(std::max({l3, l2, 0L}));
    return std::clamp<size_t>(2 * last, size_t(64) << 20, size_t(4) << 30);
}
TouchedBuffer& eviction_buffer() {
    static TouchedBuffer b(eviction_size());
    return b;
}
} // namespace

void evict_caches() {
    TouchedBuffer& b = eviction_buffer();
    stream_read_seconds(b.data(), b.size());
}

size_t eviction_bytes() { return eviction_size(); }

#if defined(__x86_64__) || defined(__i386__)
namespace {
__attribute__((target("clflushopt"))) void flush_lines_opt(const uint8_t* p, const uint8_t* end) {
    for (; p < end; p += 64) _mm_clflushopt(const_cast<uint8_t*>(p));
    _mm_sfence();
}
void flush_lines_plain(const uint8_t* p, const uint8_t* end) {
    for (; p < end; p += 64) _mm_clflush(p);
    _mm_mfence();
}
} // namespace
#endif

void flush_lines(const void* p, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
    const auto a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63);
    const auto* first = reinterpret_cast<const uint8_t*>(a);
    const auto* end = static_cast<const uint8_t*>(p) + bytes;
    static const bool opt = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("clflushopt") != 0;
    }();
    if (opt) flush_lines_opt(first, end);
    else flush_lines_plain(first, end);
#else
    (void)p;
    (void)bytes;
#endif
}

double stream_read_seconds(const uint8_t* buf, size_t bytes, unsigned max_threads) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(buf);
    const uint8_t* aligned = buf + ((64 - a % 64) % 64);
    StreamJob job{aligned, size_t(1) << 20, bytes, {}};
    job.sums.assign((bytes + job.chunk - 1) / job.chunk, 0.0f);
    const double t0 = now_s();
    opt::ThreadPool::instance().run(job.sums.size(), stream_item, &job, max_threads);
    const double t = now_s() - t0;
    float total = 0;
    for (float s : job.sums) total += s;
    benchmark::DoNotOptimize(total);
    return t;
}

double memcpy_seconds(uint8_t* dst, const uint8_t* src, size_t bytes) {
    const double t0 = now_s();
    std::memcpy(dst, src, bytes);
    benchmark::ClobberMemory();
    return now_s() - t0;
}

kvc_config config(uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t dtype, uint32_t block,
                  uint32_t max_seqs, uint32_t rope) {
    kvc_config c{};
    c.struct_size = sizeof c;
    c.n_layers = 1;
    c.n_q_heads = n_q_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = head_dim;
    c.cache_dtype = dtype;
    c.max_seqs = max_seqs;
    c.max_tokens = 0;
    c.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    c.rope = rope;
    c.rope_theta = 10000.0f;
    c.block_size_hint = block;
    return c;
}

std::unique_ptr<opt::Engine> engine_for(const kvc_config& c, const opt::EngineOptions& o) {
    kvc_status s = KVC_OK;
    std::string err;
    auto e = opt::Engine::create(c, o, &s, &err);
    if (!e) {
        std::fprintf(stderr, "kvcheck_bench: engine refused the config: %s\n", err.c_str());
        std::exit(1);
    }
    return e;
}

void report(const std::string& what, double value, const std::string& goal, const std::string& note) {
    lines().push_back({what, goal, note, value});
}

void print_machine() {
    const opt::WalkPlan walk = opt::avx2_walk();
    char walk_text[64] = "whole runs";
    if (walk.interleave_heads) std::snprintf(walk_text, sizeof walk_text, "heads interleaved in visits of %u keys", walk.visit_keys);
    std::printf("kvcheck_bench on %s (%u threads), kernels %s, walk: %s; caches evicted before each decode and read of "
                "group 1 and 2 by reading %.0f MiB\n",
                cpu_label().c_str(), std::thread::hardware_concurrency(), opt::kernel_isa(), walk_text,
                eviction_bytes() / 1048576.0);
}

void print_summary() {
    std::string load = "?";
    std::ifstream("/proc/loadavg") >> load; // other work on the machine takes cores from the compute-bound side
    std::printf("\nkvcheck_bench summary (%s, kernels %s, %u threads, load average %s; ratios measured inside this run)\n",
                cpu_label().c_str(), opt::kernel_isa(), std::thread::hardware_concurrency(), load.c_str());
    for (const Line& l : lines())
        std::printf("  %-58s %8.3f  %-10s %s\n", l.what.c_str(), l.value, l.goal.c_str(), l.note.c_str());
}

} // namespace kvc::bench
