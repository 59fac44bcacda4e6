// Shared by the GPU benchmarks (kvcheck_bench_cuda): CUDA error checks, owned device and pinned host buffers, and
// timing with CUDA events. Every goal is a ratio of two things measured in the same run (docs/gpu.md).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvc::gpubench {

// A failed CUDA call, with the call's name and the runtime's words for the error.
class CudaError : public std::runtime_error {
public:
    CudaError(cudaError_t e, const std::string& what)
        : std::runtime_error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"), code(e) {}
    cudaError_t code;
};

inline void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw CudaError(e, what);
}

// "" when device 0 is usable, else why not (the CUDA error in words): what every GPU step prints when it skips.
std::string no_device_reason();

// Device memory, freed on scope exit.
class DeviceBuffer {
public:
    explicit DeviceBuffer(std::size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void* get() const { return p_; }
    std::size_t bytes() const { return n_; }

private:
    void* p_ = nullptr;
    std::size_t n_ = 0;
};

// Page-locked host floats: what the benchmark hands the engine through the ABI, so that the engine's own copies run
// at the bus's speed and the host side of a call costs as little as the ABI allows. Filled with values in (-1, 1),
// never zero (a kernel that skips zeros or a compressed transfer would flatter an all-zero input).
class PinnedFloats {
public:
    PinnedFloats(std::size_t count, uint64_t seed);
    ~PinnedFloats();
    PinnedFloats(const PinnedFloats&) = delete;
    PinnedFloats& operator=(const PinnedFloats&) = delete;
    float* get() const { return p_; }
    std::size_t count() const { return n_; }

private:
    float* p_ = nullptr;
    std::size_t n_ = 0;
};

// Median, minimum and maximum of repeated timings, in milliseconds.
struct Stats {
    double median_ms = 0, min_ms = 0, max_ms = 0;
    int repeats = 0;
};
Stats stats_of(std::vector<double> ms);

// Times fn `repeats` times after `warmup` untimed calls. Each timing spans two CUDA events recorded on the legacy
// default stream (which waits for, and is waited for by, every blocking stream) around fn, and waits for the second.
// `between`, when given, runs before every call, untimed (e.g. to empty a cache).
Stats time_ms(const std::function<void()>& fn, int warmup, int repeats,
              const std::function<void()>& between = nullptr);

// Two functions timed alternately (a, b, a, b, ...), so that a drifting clock or a neighbour moves both sides.
std::pair<Stats, Stats> time_pair_ms(const std::function<void()>& a, const std::function<void()>& b, int warmup,
                                     int repeats);

// The in-run baselines. Device-to-device cudaMemcpy of `bytes`: bandwidth counts bytes read plus bytes written.
struct CopyResult {
    std::size_t bytes = 0;
    Stats time;
    double bytes_per_s = 0; // 2 * bytes / median time
};
CopyResult device_copy(std::size_t bytes, int warmup, int repeats);
// Host (pinned) to device and device to host copies of these sizes: what an ABI call's own transfers cost at best.
Stats host_to_device_ms(std::size_t bytes, int warmup, int repeats);
Stats device_to_host_ms(std::size_t bytes, int warmup, int repeats);

// Fills n bf16 elements at p with values in (-1, 1), never zero (fill.cu).
void fill_bf16(void* p, std::size_t n, uint32_t seed);

} // namespace kvc::gpubench
