// The plugin's hand-written f16/bf16 conversions against Eigen's (kvc::ref::f16_bits / bf16_bits and their
// inverses): bit for bit on every finite float we try, NaN to NaN of the same sign.
//
// Tried: every 16-bit pattern widened and narrowed back; every midpoint between neighbouring 16-bit values (the ties)
// and the floats just beside it; a strided sweep over all 2^32 float patterns; a few million random patterns; named
// boundary cases. DISABLED_EveryFloat does all 2^32 (run it with --gtest_also_run_disabled_tests; ~a minute).
#include "example_plugin.h"
#include "kvcheck/reference/dtype.hpp"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

namespace {

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
uint32_t to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Both conversions of x, compared with Eigen's; returns false (with a gtest failure) on the first mismatch.
// Compares first and builds messages only on failure: this runs tens of millions of times.
bool narrow_matches(float x) {
    const uint16_t h = kvc_example_f32_to_f16(x), b = kvc_example_f32_to_bf16(x);
    if (std::isnan(x)) {
        // Eigen keeps or drops NaN payloads depending on the CPU path it compiles to; only NaN-ness and sign count.
        const uint16_t sign = uint16_t(to_bits(x) >> 31);
        if ((h & 0x7fffu) > 0x7c00u && (b & 0x7fffu) > 0x7f80u && h >> 15 == sign && b >> 15 == sign) return true;
        ADD_FAILURE() << std::hex << "NaN 0x" << to_bits(x) << " became f16 0x" << h << ", bf16 0x" << b;
        return false;
    }
    const uint16_t h_ref = kvc::ref::f16_bits(x), b_ref = kvc::ref::bf16_bits(x);
    if (h == h_ref && b == b_ref) return true;
    ADD_FAILURE() << std::hex << "float 0x" << to_bits(x) << " (" << std::hexfloat << x << std::hex << "): f16 0x" << h
                  << " (Eigen 0x" << h_ref << "), bf16 0x" << b << " (Eigen 0x" << b_ref << ")";
    return false;
}

TEST(HalfConversion, F16WidensEveryPatternLikeEigen) {
    for (uint32_t p = 0; p <= 0xffff; ++p) {
        const float ours = kvc_example_f16_to_f32(uint16_t(p)), ref = kvc::ref::f16_value(uint16_t(p));
        if (std::isnan(ref)) {
            ASSERT_TRUE(std::isnan(ours)) << std::hex << "f16 0x" << p;
            ASSERT_EQ(std::signbit(ours), std::signbit(ref)) << std::hex << "f16 0x" << p;
        } else {
            ASSERT_EQ(to_bits(ours), to_bits(ref)) << std::hex << "f16 0x" << p;
        }
    }
}

TEST(HalfConversion, Bf16WidensEveryPatternLikeEigen) {
    for (uint32_t p = 0; p <= 0xffff; ++p) {
        const float ours = kvc_example_bf16_to_f32(uint16_t(p)), ref = kvc::ref::bf16_value(uint16_t(p));
        ASSERT_EQ(to_bits(ours), to_bits(ref)) << std::hex << "bf16 0x" << p; // a pure shift: NaNs too
    }
}

// Every finite 16-bit value converts back to itself, and so does every value widened from the other format.
TEST(HalfConversion, EveryWidenedPatternNarrowsLikeEigen) {
    for (uint32_t p = 0; p <= 0xffff; ++p) {
        ASSERT_TRUE(narrow_matches(kvc_example_f16_to_f32(uint16_t(p))));
        ASSERT_TRUE(narrow_matches(kvc_example_bf16_to_f32(uint16_t(p))));
        if (!std::isnan(kvc_example_f16_to_f32(uint16_t(p)))) {
            ASSERT_EQ(kvc_example_f32_to_f16(kvc_example_f16_to_f32(uint16_t(p))), p);
        }
        if (!std::isnan(kvc_example_bf16_to_f32(uint16_t(p)))) {
            ASSERT_EQ(kvc_example_f32_to_bf16(kvc_example_bf16_to_f32(uint16_t(p))), p);
        }
    }
}

// Ties are where round-to-nearest-even differs from every simpler rule. The midpoint of two neighbouring f16 (or
// bf16) values is exact in float; so are the floats one ulp either side of it.
TEST(HalfConversion, MidpointsAndTheirNeighboursNarrowLikeEigen) {
    for (int format = 0; format < 2; ++format)
        for (uint32_t p = 0; p < 0x7fff; ++p) { // positive patterns; the pair (p, p+1); signs mirrored below
            const float lo = format == 0 ? kvc_example_f16_to_f32(uint16_t(p)) : kvc_example_bf16_to_f32(uint16_t(p));
            float hi = format == 0 ? kvc_example_f16_to_f32(uint16_t(p + 1)) : kvc_example_bf16_to_f32(uint16_t(p + 1));
            if (!std::isfinite(lo)) break; // past the largest finite value
            if (std::isinf(hi)) hi = format == 0 ? 65536.0f : std::numeric_limits<float>::max(); // past the top
            const float mid = float((double(lo) + double(hi)) / 2);
            for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
                ASSERT_TRUE(narrow_matches(x));
                ASSERT_TRUE(narrow_matches(-x));
            }
        }
}

TEST(HalfConversion, BoundaryCasesNarrowLikeEigen) {
    const float cases[] = {
        0.0f, -0.0f, 1.0f, -1.0f, 0.1f, 1.0f / 3.0f,
        std::numeric_limits<float>::denorm_min(), FLT_MIN, std::nextafter(FLT_MIN, 0.0f), FLT_MAX, -FLT_MAX,
        INFINITY, -INFINITY, std::nanf(""), -std::nanf(""), from_bits(0x7f800001u), from_bits(0xffbfffffu),
        65504.0f, 65519.0f, std::nextafter(65520.0f, 0.0f), 65520.0f, 65536.0f, 1e6f, // f16 top and overflow
        std::ldexp(1.0f, -14), std::nextafter(std::ldexp(1.0f, -14), 0.0f), // smallest f16 normal
        std::ldexp(1023.5f, -24), std::ldexp(1.0f, -24), std::ldexp(1.5f, -24), std::ldexp(2.5f, -24), // subnormals
        std::ldexp(1.0f, -25), std::nextafter(std::ldexp(1.0f, -25), 1.0f), std::ldexp(1.0f, -26), // half the least
        from_bits(0x3f808000u), from_bits(0x3f818000u), from_bits(0x3f808001u), from_bits(0x7f7f8000u), // bf16 ties
        from_bits(0x00008000u), from_bits(0x00018000u), from_bits(0x807fffffu), // bf16 on float subnormals
    };
    for (float x : cases) ASSERT_TRUE(narrow_matches(x));
}

TEST(HalfConversion, StridedSweepOverAllFloatsNarrowsLikeEigen) {
    // 127 is odd, so the sweep visits every residue of the low bits somewhere along the way.
    for (uint64_t u = 0; u <= 0xffffffffull; u += 127) ASSERT_TRUE(narrow_matches(from_bits(uint32_t(u))));
}

TEST(HalfConversion, RandomFloatsNarrowLikeEigen) {
    std::mt19937 rng(20261129);
    for (int i = 0; i < 4000000; ++i) ASSERT_TRUE(narrow_matches(from_bits(uint32_t(rng()))));
    // Concentrated where f16 lives: exponents from below its subnormals to above its largest value.
    std::uniform_int_distribution<uint32_t> exponent(100, 145), mantissa(0, 0x7fffff), sign(0, 1);
    for (int i = 0; i < 2000000; ++i)
        ASSERT_TRUE(narrow_matches(from_bits((sign(rng) << 31) | (exponent(rng) << 23) | mantissa(rng))));
}

TEST(HalfConversion, DISABLED_EveryFloat) {
    for (uint64_t u = 0; u <= 0xffffffffull; ++u) ASSERT_TRUE(narrow_matches(from_bits(uint32_t(u))));
}

} // namespace
