// Which instruction set the kernels may use on this machine. Decided once, at run time, so the engine built with
// AVX2/F16C kernels still runs (on the portable kernels) where those instructions are missing.
#pragma once

namespace kvc::opt {

// True when the CPU executes AVX2, FMA and F16C (the only extensions our SIMD kernels use).
bool cpu_has_avx2_f16c();

// True when the CPU (and the OS: ZMM state saved) executes AVX-512 F, DQ, VL and BW besides AVX2/FMA/F16C: the AVX-512
// split kernel uses them.
bool cpu_has_avx512();

// The CPUID vendor: "AuthenticAMD", "GenuineIntel". The default walk of the x86 kernels depends on it
// (attention_kernel_avx2.cpp, machine_walk).
bool cpu_is_amd();
bool cpu_is_intel();
// The CPUID display family (base family, plus the extended family where the base is 15): 25 for AMD Zen 3 and Zen 4,
// 26 for Zen 5, 6 for the Intel cores here; 0 where it cannot be read. Kernel choices measured on one core generation
// name it with this.
unsigned cpu_family();

// The instruction set the engine's kernels use here: "AVX-512+AVX2+FMA+F16C", "AVX2+FMA+F16C" or "portable"
// (benchmarks print it).
const char* kernel_isa(bool simd_allowed = true);

// The attribute that compiles one function for AVX2/FMA/F16C while the rest of its file stays portable. Only
// functions reached after cpu_has_avx2_f16c() said yes may carry it.
#define KVC_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
// The same for AVX-512 (F, DQ, VL, BW, with AVX2/FMA/F16C): only behind cpu_has_avx512().
#define KVC_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl,avx512bw")))

// Put before a loop of constant trip count over an array of vector registers (accumulators, loaded chunks): GCC 12 then
// unrolls it early enough to keep the array in registers. Without it, a loop nest around such an array (a key loop
// with a prefetch branch, say) keeps a copy of every accumulator on the stack, stored on every key: 8 stores per key
// in the MHA V loop, which then runs at the store port's pace (measured on Zen 3).
#define KVC_UNROLL _Pragma("GCC unroll 16")

} // namespace kvc::opt
