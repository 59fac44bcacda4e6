// Shared by the benchmarks: timing, medians, the in-run baselines (streaming read, memcpy), and the summary that
// kvcheck_bench prints after Google Benchmark's table. Every goal is a ratio of two things measured in the same
// run, so a noisy or slower machine moves both sides (docs/performance.md).
#pragma once

#include "attention_kernel.hpp"
#include "kvcheck/optimized/engine.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvc::bench {

inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> xs);
// The fastest of several timings: on a shared machine every disturbance only adds time, so the minimum is the
// steadiest estimate of what the code itself costs (used for both sides of every ratio).
double fastest(const std::vector<double>& xs);

// Seconds to read every byte of buf once, with every core (the engine's thread pool) or max_threads, AVX2 loads.
double stream_read_seconds(const uint8_t* buf, size_t bytes, unsigned max_threads = 0);
// Seconds for one memcpy of bytes (one thread).
double memcpy_seconds(uint8_t* dst, const uint8_t* src, size_t bytes);

// A buffer that is really there: every page written once, after asking for transparent huge pages as the engine's
// pool does for its slabs (opt::advise_huge_pages), so the streaming read and the decode it is compared with walk
// memory through the same kind of pages.
// 64 bytes more than size() are there: stream_read_seconds() starts at the first 64-byte boundary.
class TouchedBuffer {
public:
    explicit TouchedBuffer(size_t bytes);
    uint8_t* data() { return p_.get(); }
    size_t size() const { return n_; }

private:
    std::unique_ptr<uint8_t[]> p_; // n_ + 64 bytes
    size_t n_ = 0;
};

// Pushes what the last measurement left in the caches back to memory: reads, with every core, a buffer of twice the
// last-level cache (at least 64 MiB), so the measurement that follows starts from memory whatever ran before it.
// Reads, not writes: the caches are left holding clean lines, so no write-back lands in the next measurement. Why
// (docs/performance.md, "every measured byte flushed"): without it a 480 MiB L3 keeps a 128 MiB cache
// between decode steps while the streaming read's buffer is evicted, and "decode / read" comes out at 1.5.
void evict_caches();
// The bytes evict_caches() reads.
size_t eviction_bytes();
// Writes back and drops every cache line of [p, p + bytes) from every cache level (clflushopt where the CPU has it,
// else clflush; nothing off x86). The scan of evict_caches() alone does not evict a buffer the measurements keep
// reusing: the last-level cache's replacement protects lines that were hit before. Measured on the Intel Xeon kind
// (model 167, 480 MiB L3): a 32 MiB buffer read 5 times reads at 23 GB/s after a 960 MiB scan and at 18
// after its lines were flushed; 256 MiB: 20.2 against 19.4. So each measured buffer is flushed as well.
void flush_lines(const void* p, size_t bytes);

std::unique_ptr<opt::Engine> engine_for(const kvc_config& c, const opt::EngineOptions& o = {});
kvc_config config(uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t dtype, uint32_t block,
                  uint32_t max_seqs, uint32_t rope = KVC_ROPE_NONE);

// Seconds of run() with the kernels' group paths set as given (the AVX2 kernel's, the AVX-512 kernel's), both back
// on (the default) afterwards. Same bits either way: the A/Bs of the group paths. Process-wide: no kernel may run
// meanwhile on another thread.
double with_group_paths(bool avx2, bool avx512, const std::function<double()>& run);

// Seconds of run() with the AVX2 kernel's walk (attention_kernel.hpp, WalkPlan) set to `walk`, then back to the one
// before. Same bits either way: the A/Bs of the walk. Process-wide, as above.
double with_walk(const opt::WalkPlan& walk, const std::function<double()>& run);
// Seconds of run() with the AVX-512 group path's score blocks in the other register layout (row pairs or key pairs:
// opt::set_avx512_score_row_pairs), then the one before back. Same bits either way. Process-wide, as above.
double with_other_score_layout(const std::function<double()>& run);
// What that other layout is, for the benchmark's lines: "key pairs" or "row pairs".
const char* other_score_layout();

// One line of the closing summary: what was measured, the ratio, its goal ("" when there is none) and a note.
void report(const std::string& what, double value, const std::string& goal, const std::string& note);
void print_summary();
// The CPU model (/proc/cpuinfo) and the instruction set of the kernels, before the table.
void print_machine();

} // namespace kvc::bench
