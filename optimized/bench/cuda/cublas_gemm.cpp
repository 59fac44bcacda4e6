// cuBLAS bf16 GEMM through dlopen (cublas_gemm.hpp). Only the header's types are used at compile time; every
// function is looked up by name, so nothing here links cuBLAS.
#include "cublas_gemm.hpp"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

namespace kvc::gpubench {
namespace {

// The cuBLAS entry points used, by their exported names (cublas_v2.h maps cublasCreate to cublasCreate_v2).
struct Cublas {
    void* lib = nullptr;
    std::string path;
    decltype(&cublasCreate_v2) create = nullptr;
    decltype(&cublasDestroy_v2) destroy = nullptr;
    // cublasGemmEx is overloaded in C++ (an int64 form for C++ callers): the exported C symbol has this type
    using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                      const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                      const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    GemmEx gemm = nullptr;
    decltype(&cublasGetVersion_v2) version = nullptr;

    // "" on success, else why cuBLAS is not usable.
    std::string load() {
        std::string tried;
        for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
            lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
            if (lib) {
                path = name;
                break;
            }
            const char* e = dlerror();
            tried += std::string(tried.empty() ? "" : "; ") + (e ? e : name);
        }
        if (!lib) return "cuBLAS not found (" + tried + ")";
        create = reinterpret_cast<decltype(create)>(dlsym(lib, "cublasCreate_v2"));
        destroy = reinterpret_cast<decltype(destroy)>(dlsym(lib, "cublasDestroy_v2"));
        gemm = reinterpret_cast<decltype(gemm)>(dlsym(lib, "cublasGemmEx"));
        version = reinterpret_cast<decltype(version)>(dlsym(lib, "cublasGetVersion_v2"));
        if (!create || !destroy || !gemm) return path + " lacks cublasCreate_v2/cublasDestroy_v2/cublasGemmEx";
        return "";
    }
};

} // namespace

GemmResult cublas_bf16_gemm(int n, int warmup, int repeats) {
    GemmResult r;
    r.n = n;
    Cublas cb;
    if (std::string why = cb.load(); !why.empty()) {
        r.why_not = why;
        return r;
    }
    cublasHandle_t h = nullptr;
    if (cublasStatus_t s = cb.create(&h); s != CUBLAS_STATUS_SUCCESS) {
        r.why_not = "cublasCreate failed with status " + std::to_string(static_cast<int>(s));
        return r;
    }
    int version = 0;
    if (cb.version) cb.version(h, &version);
    r.library = cb.path + " (cuBLAS " + std::to_string(version) + ")";

    const std::size_t elems = static_cast<std::size_t>(n) * n;
    DeviceBuffer a(elems * 2), b(elems * 2), c(elems * 2);
    fill_bf16(a.get(), elems, 11);
    fill_bf16(b.get(), elems, 12);
    fill_bf16(c.get(), elems, 13);
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    r.time = time_ms(
        [&] {
            const cublasStatus_t s = cb.gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                                             b.get(), CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (s != CUBLAS_STATUS_SUCCESS) status = s;
        },
        warmup, repeats);
    cb.destroy(h);
    if (status != CUBLAS_STATUS_SUCCESS) {
        r.why_not = "cublasGemmEx failed with status " + std::to_string(static_cast<int>(status));
        return r;
    }
    r.tflops = 2.0 * n * static_cast<double>(n) * n / (r.time.median_ms * 1e-3) / 1e12;
    r.ran = true;
    return r;
}

} // namespace kvc::gpubench
