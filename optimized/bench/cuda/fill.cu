// Device-side fill of bf16 matrices for the cuBLAS baseline: values in (-1, 1), never zero, from a hash of the
// index (no host generation of hundreds of MiB, and the same numbers every run).
#include "common.hpp"

#include <cuda_bf16.h>

namespace kvc::gpubench {
namespace {

__global__ void fill_bf16_kernel(__nv_bfloat16* p, std::size_t n, uint32_t seed) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t h = static_cast<uint32_t>(i) ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA6Bu ^ seed;
        h ^= h >> 16;
        h *= 0x7FEB352Du;
        h ^= h >> 15;
        h *= 0x846CA68Bu;
        h ^= h >> 16;
        const uint32_t u = h >> 9;                                      // 23 bits
        p[i] = __float2bfloat16(static_cast<float>(2 * u + 1) / 8388608.0f - 1.0f); // odd / 2^23 - 1: never 0
    }
}

} // namespace

void fill_bf16(void* p, std::size_t n, uint32_t seed) {
    fill_bf16_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
    check(cudaGetLastError(), "fill_bf16_kernel launch");
    check(cudaDeviceSynchronize(), "fill_bf16_kernel");
}

} // namespace kvc::gpubench
