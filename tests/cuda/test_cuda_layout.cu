// The paged layout (optimized/include/kvcheck/optimized/kv_layout.h) is one struct and one addressing function for
// host and device. This test gathers every row of a paged stream on the device through kvc_kv_address and checks
// that it equals the host's gather through the same function. Without a GPU it skips and says why.
#include "kvcheck/optimized/kv_layout.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

// One thread per (token, head, dim): copy the element at its logical coordinates into a dense [T][H][d] buffer.
__global__ void gather_k(kvc_kv_layout layout, const uint32_t* table, uint32_t n_tokens, float* out) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t per_token = layout.n_kv_heads * layout.head_dim;
    if (i >= n_tokens * per_token) return;
    const uint32_t pos = i / per_token, head = i % per_token / layout.head_dim, dim = i % layout.head_dim;
    out[i] = *reinterpret_cast<const float*>(kvc_kv_address(&layout, table, pos, KVC_PLANE_K, head, dim));
}

std::string no_device_reason() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
    if (n == 0) return "no CUDA device present";
    return "";
}

TEST(CudaLayout, DeviceAddressingEqualsHostAddressing) {
    const std::string why = no_device_reason();
    if (!why.empty()) GTEST_SKIP() << why;

    const uint32_t block = 7, heads = 3, dim = 5, tokens = 30, n_blocks = (tokens + block - 1) / block + 2;
    kvc_kv_layout l = kvc_kv_layout_make(block, heads, dim, sizeof(float));
    // blocks scattered in a pool, the table in shuffled order
    std::vector<uint8_t> host_pool(n_blocks * kvc_kv_block_bytes(&l));
    for (size_t i = 0; i < host_pool.size() / sizeof(float); ++i) {
        const float v = static_cast<float>(i) * 0.25f;
        std::memcpy(host_pool.data() + i * sizeof(float), &v, sizeof v);
    }
    std::vector<uint32_t> table = {5, 0, 3, 1, 4};
    std::vector<uint8_t*> host_base(n_blocks);
    for (uint32_t b = 0; b < n_blocks; ++b) host_base[b] = host_pool.data() + b * kvc_kv_block_bytes(&l);

    std::vector<float> expected(tokens * heads * dim);
    l.block_base = host_base.data();
    for (uint32_t t = 0, i = 0; t < tokens; ++t)
        for (uint32_t h = 0; h < heads; ++h)
            for (uint32_t x = 0; x < dim; ++x, ++i)
                std::memcpy(&expected[i], kvc_kv_address(&l, table.data(), t, KVC_PLANE_K, h, x), sizeof(float));

    uint8_t* dev_pool = nullptr;
    uint8_t** dev_base = nullptr;
    uint32_t* dev_table = nullptr;
    float* dev_out = nullptr;
    ASSERT_EQ(cudaMalloc(&dev_pool, host_pool.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev_base, n_blocks * sizeof(uint8_t*)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev_table, table.size() * sizeof(uint32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev_out, expected.size() * sizeof(float)), cudaSuccess);
    std::vector<uint8_t*> dev_blocks(n_blocks);
    for (uint32_t b = 0; b < n_blocks; ++b) dev_blocks[b] = dev_pool + b * kvc_kv_block_bytes(&l);
    cudaMemcpy(dev_pool, host_pool.data(), host_pool.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dev_base, dev_blocks.data(), n_blocks * sizeof(uint8_t*), cudaMemcpyHostToDevice);
    cudaMemcpy(dev_table, table.data(), table.size() * sizeof(uint32_t), cudaMemcpyHostToDevice);
    l.block_base = dev_base;
    const uint32_t n = static_cast<uint32_t>(expected.size());
    gather_k<<<(n + 127) / 128, 128>>>(l, dev_table, tokens, dev_out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got(expected.size());
    cudaMemcpy(got.data(), dev_out, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
    EXPECT_EQ(got, expected);
    cudaFree(dev_pool);
    cudaFree(dev_base);
    cudaFree(dev_table);
    cudaFree(dev_out);
}

} // namespace
