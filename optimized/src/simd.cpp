#include "simd.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <cstring>
#endif

namespace kvc::opt {

#if defined(__x86_64__) || defined(__i386__)
namespace {
// F16C is CPUID leaf 1, ECX bit 29. Read directly because clang (14) rejects __builtin_cpu_supports("f16c"),
// and the fuzz build compiles this file with clang; g++ keeps using its builtin for all three.
[[maybe_unused]] bool cpuid_f16c() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
} // namespace
#endif

bool cpu_has_avx2_f16c() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool yes = [] {
        __builtin_cpu_init();
        // avx2 and fma through the builtin in both compilers: it also checks that the OS saves the YMM registers
        // (XGETBV), which F16C needs too, so "avx2 && f16c" implies the OS side for F16C.
        const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#if defined(__clang__)
        return avx2_fma && cpuid_f16c();
#else
        return avx2_fma && __builtin_cpu_supports("f16c");
#endif
    }();
    return yes;
#else
    return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool yes = [] {
        __builtin_cpu_init();
        // the builtin checks the OS side too (XGETBV: opmask and ZMM state saved)
        return cpu_has_avx2_f16c() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    }();
    return yes;
#else
    return false;
#endif
}

namespace {
// Whether CPUID leaf 0 names this vendor (12 characters: EBX, EDX, ECX in that order).
bool cpu_vendor_is(const char* vendor) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned eax = 0, regs[3] = {0, 0, 0};
    if (__get_cpuid(0, &eax, &regs[0], &regs[2], &regs[1]) == 0) return false;
    return std::memcmp(regs, vendor, 12) == 0;
#else
    (void)vendor;
    return false;
#endif
}
} // namespace

bool cpu_is_amd() {
    static const bool yes = cpu_vendor_is("AuthenticAMD");
    return yes;
}

bool cpu_is_intel() {
    static const bool yes = cpu_vendor_is("GenuineIntel");
    return yes;
}

unsigned cpu_family() {
#if defined(__x86_64__) || defined(__i386__)
    static const unsigned family = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return 0u;
        const unsigned base = (eax >> 8) & 0xf;
        return base == 0xf ? base + ((eax >> 20) & 0xff) : base;
    }();
    return family;
#else
    return 0;
#endif
}

const char* kernel_isa(bool simd_allowed) {
    if (!simd_allowed || !cpu_has_avx2_f16c()) return "portable";
    return cpu_has_avx512() ? "AVX-512+AVX2+FMA+F16C" : "AVX2+FMA+F16C";
}

} // namespace kvc::opt
