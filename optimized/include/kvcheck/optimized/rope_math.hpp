// Rotary position embedding for host and device code alike: the part the CUDA kernels run, written once and
// unit-tested on the CPU against the reference (kvc::ref::apply_rope) and the CPU engine (tests/cuda/
// test_cuda_math_host.cpp).
//
//   pair j (0 <= j < d/2) turns by angle = pos * theta^(-2j/d)
//   NeoX pairs (j, j + d/2), GPT-J pairs (2j, 2j + 1)
//
// The inverse frequencies are computed once per cache on the host in long double, exactly as the reference and the
// CPU engine do, and rounded to double (rope_inv_freq). A device has no long double: the angle, its cosine and sine
// and the rotation are computed in double, then rounded once to float. The angle's relative error is about 2^-52,
// so up to positions of millions the rotated value is the float nearest the reference's in all but rare ties (one
// unit in the last place at most; the CPU test measures it).
#pragma once

#include "kvcheck/optimized/kv_layout.h" // KVC_HOST_DEVICE

#include <math.h>
#include <stdint.h>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace kvc::opt::math {

enum : uint32_t { kRopeNone = 0, kRopeNeox = 1, kRopeGptj = 2 }; // = kvc_rope

#if !defined(__CUDA_ARCH__)
// Host only: theta^(-2j/d), the reference's expression operand for operand, rounded to double for the device.
inline double rope_inv_freq(float theta, uint32_t head_dim, uint32_t j) {
    const long double f = std::pow(static_cast<long double>(static_cast<double>(theta)),
                                   -2.0L * static_cast<int>(j) / static_cast<int>(head_dim));
    return static_cast<double>(f);
}
#endif

// The two elements pair j rotates.
KVC_HOST_DEVICE inline void rope_pair(uint32_t variant, uint32_t head_dim, uint32_t j, uint32_t* a, uint32_t* b) {
    const uint32_t half = head_dim / 2;
    *a = variant == kRopeNeox ? j : 2 * j;
    *b = variant == kRopeNeox ? j + half : 2 * j + 1;
}

// cos and sin of pos * inv_freq, in double.
KVC_HOST_DEVICE inline void rope_cos_sin(uint64_t pos, double inv_freq, double* c, double* s) {
    const double angle = static_cast<double>(pos) * inv_freq;
#if defined(__CUDA_ARCH__)
    sincos(angle, s, c);
#else
    *c = std::cos(angle);
    *s = std::sin(angle);
#endif
}

// Rotates (xa, xb) in double and rounds each result once to float (the CPU engine's Rope::apply, same expression).
KVC_HOST_DEVICE inline void rope_rotate(float* xa, float* xb, double c, double s) {
    const double a = *xa, b = *xb;
    *xa = static_cast<float>(a * c - b * s);
    *xb = static_cast<float>(a * s + b * c);
}

} // namespace kvc::opt::math
