// Device 0's identity, clocks and versions, from the CUDA runtime (device_info.hpp). Current clocks need NVML,
// which the bundle does not carry: run.sh records them with nvidia-smi beside this program's output.
#include "device_info.hpp"

#include "common.hpp"

#include <cstdio>

namespace kvc::gpubench {

std::string describe_device(nlohmann::json& out) {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    int driver = 0, runtime = 0, sm_khz = 0, mem_khz = 0;
    check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
    check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
    check(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, 0), "cudaDeviceGetAttribute(ClockRate)");
    check(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0), "cudaDeviceGetAttribute(MemoryClockRate)");
    // peak DRAM bandwidth from the attributes: 2 transfers per memory clock (DDR) over the bus width
    const double peak = 2.0 * mem_khz * 1e3 * (p.memoryBusWidth / 8.0);
    out = {{"name", p.name},
           {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
           {"multiprocessors", p.multiProcessorCount},
           {"memory_bytes", p.totalGlobalMem},
           {"l2_bytes", p.l2CacheSize},
           {"memory_bus_bits", p.memoryBusWidth},
           {"max_sm_clock_mhz", sm_khz / 1000},
           {"max_memory_clock_mhz", mem_khz / 1000},
           {"peak_dram_bytes_per_s_from_attributes", peak},
           {"cuda_driver_version", driver},
           {"cuda_runtime_version", runtime}};
    char text[768];
    std::snprintf(text, sizeof text,
                  "GPU: %s (sm_%d%d), %d SMs, %.1f GiB, L2 %.0f MiB, %d-bit bus\n"
                  "clocks (maximum, from the runtime): SM %d MHz, memory %d MHz; peak DRAM by those %.2f TB/s\n"
                  "CUDA driver %d.%d, runtime %d.%d (linked into this program)\n",
                  p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem / 1073741824.0,
                  p.l2CacheSize / 1048576.0, p.memoryBusWidth, sm_khz / 1000, mem_khz / 1000, peak / 1e12,
                  driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    return text;
}

} // namespace kvc::gpubench
