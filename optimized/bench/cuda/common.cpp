// Buffers, timing and the in-run baselines of the GPU benchmarks (common.hpp).
#include "common.hpp"

#include "kvcheck/reference/splitmix64.hpp"

#include <algorithm>
#include <cstring>

namespace kvc::gpubench {

std::string no_device_reason() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" +
               cudaGetErrorString(e) + ")";
    if (n == 0) return "no CUDA device present (cudaGetDeviceCount returned 0)";
    const cudaError_t s = cudaSetDevice(0);
    if (s != cudaSuccess)
        return std::string("no usable CUDA device: cudaSetDevice(0): ") + cudaGetErrorName(s) + " (" +
               cudaGetErrorString(s) + ")";
    return "";
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : n_(bytes) { check(cudaMalloc(&p_, bytes), "cudaMalloc"); }
DeviceBuffer::~DeviceBuffer() { cudaFree(p_); }

PinnedFloats::PinnedFloats(std::size_t count, uint64_t seed) : n_(count) {
    check(cudaMallocHost(reinterpret_cast<void**>(&p_), count * sizeof(float)), "cudaMallocHost");
    // splitmix64 per element: cheap, and the odd numerator keeps every value away from zero
    SplitMix64 rng{seed};
    for (std::size_t i = 0; i < count; ++i) {
        const uint64_t z = rng.next();
        const uint32_t u = static_cast<uint32_t>(z >> 41); // 23 bits
        p_[i] = (static_cast<float>(2 * u + 1) / 8388608.0f) - 1.0f; // (2u+1)/2^23 - 1: odd/2^23, never 0
    }
}
PinnedFloats::~PinnedFloats() { cudaFreeHost(p_); }

Stats stats_of(std::vector<double> ms) {
    Stats s;
    if (ms.empty()) return s;
    std::sort(ms.begin(), ms.end());
    const std::size_t n = ms.size();
    s.median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    s.min_ms = ms.front();
    s.max_ms = ms.back();
    s.repeats = static_cast<int>(n);
    return s;
}

namespace {

// One event pair, reused: record, run, record, wait.
class EventPair {
public:
    EventPair() {
        check(cudaEventCreate(&a_), "cudaEventCreate");
        check(cudaEventCreate(&b_), "cudaEventCreate");
    }
    ~EventPair() {
        cudaEventDestroy(a_);
        cudaEventDestroy(b_);
    }
    EventPair(const EventPair&) = delete;
    EventPair& operator=(const EventPair&) = delete;
    double time(const std::function<void()>& fn) {
        check(cudaEventRecord(a_, 0), "cudaEventRecord");
        fn();
        check(cudaEventRecord(b_, 0), "cudaEventRecord");
        check(cudaEventSynchronize(b_), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, a_, b_), "cudaEventElapsedTime");
        return ms;
    }

private:
    cudaEvent_t a_{}, b_{};
};

} // namespace

Stats time_ms(const std::function<void()>& fn, int warmup, int repeats, const std::function<void()>& between) {
    EventPair ev;
    std::vector<double> ms;
    for (int i = 0; i < warmup + repeats; ++i) {
        if (between) between();
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        const double t = ev.time(fn);
        if (i >= warmup) ms.push_back(t);
    }
    return stats_of(ms);
}

std::pair<Stats, Stats> time_pair_ms(const std::function<void()>& a, const std::function<void()>& b, int warmup,
                                     int repeats) {
    EventPair ev;
    std::vector<double> ma, mb;
    for (int i = 0; i < warmup + repeats; ++i) {
        const double ta = ev.time(a);
        const double tb = ev.time(b);
        if (i >= warmup) {
            ma.push_back(ta);
            mb.push_back(tb);
        }
    }
    return {stats_of(ma), stats_of(mb)};
}

CopyResult device_copy(std::size_t bytes, int warmup, int repeats) {
    DeviceBuffer src(bytes), dst(bytes);
    check(cudaMemset(src.get(), 0x5a, bytes), "cudaMemset");
    check(cudaMemset(dst.get(), 0, bytes), "cudaMemset");
    CopyResult r;
    r.bytes = bytes;
    r.time = time_ms([&] { check(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, 0),
                                 "cudaMemcpyAsync D2D"); },
                     warmup, repeats);
    r.bytes_per_s = 2.0 * static_cast<double>(bytes) / (r.time.median_ms * 1e-3);
    return r;
}

Stats host_to_device_ms(std::size_t bytes, int warmup, int repeats) {
    PinnedFloats host((bytes + sizeof(float) - 1) / sizeof(float), 1);
    DeviceBuffer dev(bytes);
    return time_ms([&] { check(cudaMemcpyAsync(dev.get(), host.get(), bytes, cudaMemcpyHostToDevice, 0), "H2D"); },
                   warmup, repeats);
}

Stats device_to_host_ms(std::size_t bytes, int warmup, int repeats) {
    PinnedFloats host((bytes + sizeof(float) - 1) / sizeof(float), 2);
    DeviceBuffer dev(bytes);
    check(cudaMemset(dev.get(), 0x3c, bytes), "cudaMemset");
    return time_ms([&] { check(cudaMemcpyAsync(host.get(), dev.get(), bytes, cudaMemcpyDeviceToHost, 0), "D2H"); },
                   warmup, repeats);
}

} // namespace kvc::gpubench
