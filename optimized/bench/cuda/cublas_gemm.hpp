// The compute baseline of the prefill goal: cuBLAS's bf16 GEMM, loaded at run time with dlopen. Linked statically
// it would make the portable bundle too big (libcublasLt alone is over 500 MB), and a GPU machine without cuBLAS
// still gets every other number: the result then says "n/a: <reason>".
#pragma once

#include "common.hpp"

#include <string>

namespace kvc::gpubench {

struct GemmResult {
    bool ran = false;
    std::string why_not;  // set when !ran
    std::string library;  // the file dlopen found, and cuBLAS's version
    int n = 0;            // an n x n x n product, bf16 in and out, f32 accumulation
    Stats time;
    double tflops = 0;    // 2 n^3 / median time
};

GemmResult cublas_bf16_gemm(int n, int warmup, int repeats);

} // namespace kvc::gpubench
