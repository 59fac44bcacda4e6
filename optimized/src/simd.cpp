#include "simd.hpp"

namespace kvc::opt {

bool cpu_has_avx2_f16c() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool yes = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }();
    return yes;
#else
    return false;
#endif
}

const char* kernel_isa(bool simd_allowed) { return simd_allowed && cpu_has_avx2_f16c() ? "AVX2+FMA+F16C" : "portable"; }

} // namespace kvc::opt
