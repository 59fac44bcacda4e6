// Tests of the quantized-cache formats (reference/include/kvcheck/reference/quantize.hpp).
// The fp8 expectations are derived here from the format definitions (a table of values in code order and an
// exact nearest-value search in double), never by calling the encoder under test. The int8 and q8_0 rows are
// small enough to check by hand: the expected codes are written out, with the arithmetic in the comments.
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/quantize.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

namespace {

using namespace kvc::ref;

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// ---- the independent oracle ----

// A format as its definition states it (OCP 8-bit floating point, and the E4M3FN/E5M2 specials).
struct Definition {
    Fp8 format;
    int exp_bits, mant_bits, bias;
    uint8_t max_code;      // largest finite magnitude
    double next_would_be;  // the value one code above max finite would have if it were finite
};

const Definition kDefs[] = {
    {Fp8::E4M3FN, 4, 3, 7, 0x7e, 480.0},   // 0x7f would be 1.875 * 2^8, but it is the NaN
    {Fp8::E5M2, 5, 2, 15, 0x7b, 65536.0},  // 0x7c would be 1.0 * 2^16, but it is infinity
};

// Positive finite values in code order: table[c] is the value of code c, 0 <= c <= max_code.
//   biased exponent 0:   (frac / 2^mant) * 2^(1 - bias)      (zero and subnormals)
//   otherwise:       (1 + frac / 2^mant) * 2^(biased - bias)
std::vector<double> value_table(const Definition& d) {
    std::vector<double> t;
    const int frac_count = 1 << d.mant_bits;
    for (int c = 0; c <= d.max_code; ++c) {
        const int biased = c / frac_count, frac = c % frac_count;
        const double fraction = static_cast<double>(frac) / frac_count;
        t.push_back(biased == 0 ? fraction * std::pow(2.0, 1 - d.bias)
                                : (1.0 + fraction) * std::pow(2.0, biased - d.bias));
    }
    return t;
}

bool is_nan_code(uint8_t c, Fp8 f) {
    const uint8_t mag = c & 0x7f;
    return f == Fp8::E4M3FN ? mag == 0x7f : mag > 0x7c;
}

// The code a correct saturating, round-to-nearest-even encoder gives for a non-NaN x, found by bracketing |x|
// between two neighbours of the table. Every comparison is exact: 2|x| and lo + hi are exact in double.
uint8_t expected_code(float x, const Definition& d, const std::vector<double>& table) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const double a = std::fabs(static_cast<double>(x));
    if (a >= table.back()) return sign | d.max_code; // saturation
    const auto above = std::upper_bound(table.begin(), table.end(), a); // first value > a; exists as a < max
    const int hi = static_cast<int>(above - table.begin()), lo = hi - 1;
    if (a == table[lo]) return sign | static_cast<uint8_t>(lo);
    const double twice = 2.0 * a, sum = table[lo] + table[hi];
    if (twice < sum) return sign | static_cast<uint8_t>(lo);
    if (twice > sum) return sign | static_cast<uint8_t>(hi);
    return sign | static_cast<uint8_t>(lo % 2 == 0 ? lo : hi); // the tie: the even code (mantissa LSB 0)
}

// ---- fp8: codes ----

TEST(Fp8, TableMatchesHandValues) {
    // Hand-computed anchors, so the oracle's table is itself checked against the definition.
    const auto e4 = value_table(kDefs[0]);
    EXPECT_EQ(e4[0x01], std::ldexp(1.0, -9)); // smallest subnormal 2^-9
    EXPECT_EQ(e4[0x07], 7.0 / 8 * std::ldexp(1.0, -6));
    EXPECT_EQ(e4[0x08], std::ldexp(1.0, -6)); // smallest normal
    EXPECT_EQ(e4[0x38], 1.0);
    EXPECT_EQ(e4[0x7e], 448.0);
    const auto e5 = value_table(kDefs[1]);
    EXPECT_EQ(e5[0x01], std::ldexp(1.0, -16));
    EXPECT_EQ(e5[0x04], std::ldexp(1.0, -14));
    EXPECT_EQ(e5[0x3c], 1.0);
    EXPECT_EQ(e5[0x7b], 57344.0);
    for (const auto& t : {e4, e5})
        for (size_t i = 1; i < t.size(); ++i) ASSERT_LT(t[i - 1], t[i]) << "table not increasing at " << i;
    EXPECT_EQ(fp8_max_finite(Fp8::E4M3FN), 448.0f);
    EXPECT_EQ(fp8_max_finite(Fp8::E5M2), 57344.0f);
}

TEST(Fp8, EveryCodeDecodesToItsDefinedValue) {
    for (const auto& d : kDefs) {
        const auto table = value_table(d);
        for (int c = 0; c < 256; ++c) {
            const uint8_t code = static_cast<uint8_t>(c), mag = code & 0x7f;
            const bool negative = (code & 0x80) != 0;
            const float v = decode_fp8(code, d.format);
            SCOPED_TRACE(::testing::Message() << "code 0x" << std::hex << c);
            EXPECT_EQ(std::signbit(v), negative); // 0x80 is -0, and NaNs keep their sign
            if (is_nan_code(code, d.format)) {
                EXPECT_TRUE(std::isnan(v));
            } else if (d.format == Fp8::E5M2 && mag == 0x7c) {
                EXPECT_EQ(v, negative ? -kInf : kInf);
            } else {
                ASSERT_LE(mag, d.max_code);
                EXPECT_EQ(static_cast<double>(v), negative ? -table[mag] : table[mag]);
            }
        }
    }
    // The named wrappers are the same functions.
    EXPECT_EQ(decode_e4m3fn(0x7e), 448.0f);
    EXPECT_EQ(decode_e5m2(0xfb), -57344.0f);
    EXPECT_TRUE(std::isnan(decode_e4m3fn(0xff)));
    EXPECT_FALSE(std::isnan(decode_e4m3fn(0x7e)));
    EXPECT_TRUE(std::isnan(decode_e5m2(0x7d)));
}

TEST(Fp8, EveryCodeReencodesToItself) {
    for (const auto& d : kDefs) {
        for (int c = 0; c < 256; ++c) {
            const uint8_t code = static_cast<uint8_t>(c), mag = code & 0x7f;
            const uint8_t back = encode_fp8(decode_fp8(code, d.format), d.format);
            SCOPED_TRACE(::testing::Message() << "code 0x" << std::hex << c);
            if (is_nan_code(code, d.format)) {
                EXPECT_TRUE(is_nan_code(back, d.format)); // a NaN code, its sign kept
                EXPECT_EQ(back & 0x80, code & 0x80);
            } else if (d.format == Fp8::E5M2 && mag == 0x7c) {
                EXPECT_EQ(back, (code & 0x80) | 0x7b); // infinity saturates to max finite, by contract
            } else {
                EXPECT_EQ(back, code); // includes 0x00 -> +0 -> 0x00 and 0x80 -> -0 -> 0x80
            }
        }
    }
    EXPECT_EQ(encode_e4m3fn(0.0f), 0x00);
    EXPECT_EQ(encode_e4m3fn(-0.0f), 0x80);
    EXPECT_EQ(encode_e5m2(-0.0f), 0x80);
}

// ---- fp8: rounding ----

// For every pair of neighbours (lo, hi) of the table, including (0, smallest subnormal) and (max finite, the next
// would-be value): the exact midpoint goes to the even code, the float just above it to hi, the float just below
// to lo; at the top everything saturates to max. Both signs.
TEST(Fp8, EveryMidpointRoundsToEvenAndItsNeighboursToTheNearest) {
    for (const auto& d : kDefs) {
        const auto table_only = value_table(d); // what the oracle searches: finite values only
        auto table = table_only;
        table.push_back(d.next_would_be);
        int pairs = 0;
        for (size_t lo = 0; lo + 1 < table.size(); ++lo) {
            const size_t hi = lo + 1;
            const bool top = hi == table.size() - 1;
            const double mid_exact = (table[lo] + table[hi]) / 2;
            const float mid = static_cast<float>(mid_exact);
            ASSERT_EQ(static_cast<double>(mid), mid_exact) << "midpoint not an f32"; // at most 5 significant bits
            const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, kInf);
            const uint8_t lo_code = static_cast<uint8_t>(lo);
            const uint8_t hi_code = top ? d.max_code : static_cast<uint8_t>(hi);
            const uint8_t even_code = top ? d.max_code : static_cast<uint8_t>(lo % 2 == 0 ? lo : hi);
            for (const float s : {1.0f, -1.0f}) {
                const uint8_t sign = s < 0 ? 0x80 : 0x00;
                SCOPED_TRACE(::testing::Message() << "pair " << table[lo] << " / " << table[hi] << " sign " << s);
                // The oracle agrees with what the pair says...
                EXPECT_EQ(expected_code(s * mid, d, table_only), sign | even_code);
                EXPECT_EQ(expected_code(s * above, d, table_only), sign | hi_code);
                EXPECT_EQ(expected_code(s * below, d, table_only), sign | lo_code);
                // ...and so does the encoder.
                EXPECT_EQ(encode_fp8(s * mid, d.format), sign | even_code);
                EXPECT_EQ(encode_fp8(s * above, d.format), sign | hi_code);
                EXPECT_EQ(encode_fp8(s * below, d.format), sign | lo_code);
            }
            ++pairs;
        }
        EXPECT_EQ(pairs, d.max_code + 1); // every neighbour pair, the top one included
    }
}

// Floats sampled across the whole f32 range (every exponent, both signs, subnormals) against the oracle.
TEST(Fp8, SampledFloatsMatchTheNearestValueOracle) {
    for (const auto& d : kDefs) {
        const auto table = value_table(d);
        int checked = 0;
        for (uint64_t b = 0; b <= 0xffffffffull; b += 2039) { // a prime stride: ~2.1M floats, all exponents
            const float x = from_bits(static_cast<uint32_t>(b));
            if (std::isnan(x)) continue;
            const uint8_t want = expected_code(x, d, table);
            const uint8_t got = encode_fp8(x, d.format);
            if (got != want) {
                ADD_FAILURE() << "x = " << std::hexfloat << x << ": encoder 0x" << std::hex << int(got)
                              << ", nearest value 0x" << int(want);
                return;
            }
            ++checked;
        }
        EXPECT_GT(checked, 2000000);
    }
}

TEST(Fp8, RoundsOnceFromTheExactFloat) {
    // E4M3FN values near 1: 1.0 (0x38) and 1.125 (0x39), midpoint 1.0625. The float just above the midpoint must
    // go up. Rounding first to f16 (1.0625 + 2^-23 -> 1.0625, a tie) and then to fp8 would give 1.0: the double
    // rounding the contract forbids.
    const float just_above = std::nextafter(1.0625f, 2.0f);
    EXPECT_EQ(f16_value(f16_bits(just_above)), 1.0625f); // the f16 detour loses the information
    EXPECT_EQ(encode_e4m3fn(just_above), 0x39);
    EXPECT_EQ(encode_e4m3fn(1.0625f), 0x38); // the exact tie: mantissa 000 is even
    // Subnormals: E4M3FN 2^-9 * {1, 2}; midpoint 1.5 * 2^-9 goes to the even 2 * 2^-9 = 0x02.
    EXPECT_EQ(encode_e4m3fn(std::ldexp(1.5f, -9)), 0x02);
    EXPECT_EQ(encode_e4m3fn(std::ldexp(0.5f, -9)), 0x00);  // half the smallest subnormal: tie to 0
    EXPECT_EQ(encode_e4m3fn(-std::ldexp(0.5f, -9)), 0x80); // ... keeping the sign
    EXPECT_EQ(encode_e4m3fn(std::nextafter(std::ldexp(0.5f, -9), 1.0f)), 0x01);
    EXPECT_EQ(encode_e5m2(from_bits(1)), 0x00); // the smallest f32 subnormal
    EXPECT_EQ(encode_e5m2(-1e-30f), 0x80);
}

TEST(Fp8, SaturatesAndKeepsNaN) {
    // E4M3FN: max finite 448 (0x7e); 464 is the midpoint to the would-be 480 (0x7f is NaN).
    EXPECT_EQ(encode_e4m3fn(448.0f), 0x7e);
    EXPECT_EQ(encode_e4m3fn(448.0001f), 0x7e);
    EXPECT_EQ(encode_e4m3fn(464.0f), 0x7e);
    EXPECT_EQ(encode_e4m3fn(std::nextafter(464.0f, kInf)), 0x7e);
    EXPECT_EQ(encode_e4m3fn(1e30f), 0x7e);
    EXPECT_EQ(encode_e4m3fn(FLT_MAX), 0x7e);
    EXPECT_EQ(encode_e4m3fn(kInf), 0x7e);
    EXPECT_EQ(encode_e4m3fn(-448.0001f), 0xfe);
    EXPECT_EQ(encode_e4m3fn(-1e30f), 0xfe);
    EXPECT_EQ(encode_e4m3fn(-kInf), 0xfe);
    // E5M2: max finite 57344 (0x7b); 61440 is the midpoint to the would-be 65536 (0x7c is infinity).
    EXPECT_EQ(encode_e5m2(57344.0f * 1.1f), 0x7b);
    EXPECT_EQ(encode_e5m2(61440.0f), 0x7b);
    EXPECT_EQ(encode_e5m2(kInf), 0x7b);
    EXPECT_EQ(encode_e5m2(-57344.0f * 1.1f), 0xfb);
    EXPECT_EQ(encode_e5m2(-kInf), 0xfb);
    // NaN stays NaN with its sign: E4M3FN 0x7f / 0xff, E5M2 the quiet NaN 0x7e / 0xfe.
    EXPECT_EQ(encode_e4m3fn(kNaN), 0x7f);
    EXPECT_EQ(encode_e4m3fn(-kNaN), 0xff);
    EXPECT_EQ(encode_e5m2(kNaN), 0x7e);
    EXPECT_EQ(encode_e5m2(-kNaN), 0xfe);
    EXPECT_EQ(encode_e5m2(from_bits(0x7f800001u)), 0x7e); // a signalling f32 NaN becomes the quiet one
}

// ---- fp8 with a scale ----

TEST(Fp8Scaled, HandComputedRoundTrips) {
    // E4M3FN, scale 0.5: 3 / 0.5 = 6 = 1.5 * 2^2 -> exponent 2 + 7 = 9, mantissa 100 -> 0 1001 100 = 0x4c.
    EXPECT_EQ(encode_fp8_scaled(3.0f, 0.5f, Fp8::E4M3FN), 0x4c);
    EXPECT_EQ(decode_fp8_scaled(0x4c, 0.5f, Fp8::E4M3FN), 3.0f);
    // scale 0.25: 1.1f / 0.25 = 4.4000001; the E4M3FN values around it are 4.0 and 4.5 (quantum 0.5 in [4, 8)),
    // so 4.5 = 1.125 * 2^2 -> 0 1001 001 = 0x49, and back 4.5 * 0.25 = 1.125.
    EXPECT_EQ(encode_fp8_scaled(1.1f, 0.25f, Fp8::E4M3FN), 0x49);
    EXPECT_EQ(decode_fp8_scaled(0x49, 0.25f, Fp8::E4M3FN), 1.125f);
    // E5M2, scale 1000: 123456 / 1000 = 123.456; E5M2 values in [64, 128) step by 16: 112, 128 -> 128 = 2^7 ->
    // exponent 7 + 15 = 22 = 10110, mantissa 00 -> 0 10110 00 = 0x58, and back 128 * 1000 = 128000.
    EXPECT_EQ(encode_fp8_scaled(123456.0f, 1000.0f, Fp8::E5M2), 0x58);
    EXPECT_EQ(decode_fp8_scaled(0x58, 1000.0f, Fp8::E5M2), 128000.0f);
    // Saturation applies after the division: 1000 / 2 = 500 > 448 -> 0x7e, back 448 * 2 = 896.
    EXPECT_EQ(encode_fp8_scaled(1000.0f, 2.0f, Fp8::E4M3FN), 0x7e);
    EXPECT_EQ(decode_fp8_scaled(0x7e, 2.0f, Fp8::E4M3FN), 896.0f);
}

TEST(Fp8Scaled, DividesAsWrittenNotByAReciprocal) {
    // scale 3, x = 1.78125 - 2^-23 (0x1.c7fffep+0). In f32:
    //   x / 3       = 0.59374996 -> rounds to 0x1.2ffffep-1, one f32 step below 0.59375
    //   x * (1/3.f) = 0.59374998 -> rounds to 0x1.3p-1 = 0.59375 exactly
    // and 0.59375 is the E4M3FN midpoint of 0.5625 (0x31) and 0.625 (0x32). The division gives 0x31; the
    // reciprocal lands on the tie and goes to the even 0x32. The reference divides.
    const float x = 0x1.c7fffep+0f;
    ASSERT_EQ(x / 3.0f, 0x1.2ffffep-1f);
    ASSERT_EQ(x * (1.0f / 3.0f), 0x1.3p-1f);
    EXPECT_EQ(encode_fp8_scaled(x, 3.0f, Fp8::E4M3FN), 0x31);
    EXPECT_EQ(encode_e4m3fn(x * (1.0f / 3.0f)), 0x32); // what a reciprocal-multiplying kernel would store
    // Dequantizing multiplies in f32: 0.5625 * 3 = 1.6875 exactly.
    EXPECT_EQ(decode_fp8_scaled(0x31, 3.0f, Fp8::E4M3FN), 1.6875f);
}

TEST(Fp8Scaled, PerKvHeadRows) {
    // One token, 2 KV heads x head_dim 2, per-KV-head scales {2, 0.125}; the same values land on different codes.
    const float x[4] = {3.0f, -0.75f, 3.0f, -0.75f};
    const float scales[2] = {2.0f, 0.125f};
    uint8_t codes[4];
    float back[4];
    for (int h = 0; h < 2; ++h) {
        quantize_fp8_row(x + 2 * h, 2, scales[h], Fp8::E4M3FN, codes + 2 * h);
        dequantize_fp8_row(codes + 2 * h, 2, scales[h], Fp8::E4M3FN, back + 2 * h);
    }
    // head 0: 3/2 = 1.5 -> 0 0111 100 = 0x3c; -0.75/2 = -0.375 = -1.5 * 2^-2 -> 1 0101 100 = 0xac
    // head 1: 3/0.125 = 24 = 1.5 * 2^4 -> 0 1011 100 = 0x5c; -0.75/0.125 = -6 -> 1 1001 100 = 0xcc
    EXPECT_EQ(codes[0], 0x3c);
    EXPECT_EQ(codes[1], 0xac);
    EXPECT_EQ(codes[2], 0x5c);
    EXPECT_EQ(codes[3], 0xcc);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], x[i]); // all exact in fp8
}

TEST(Fp8Scaled, RejectsABadScale) {
    EXPECT_THROW(encode_fp8_scaled(1.0f, 0.0f, Fp8::E4M3FN), std::invalid_argument);
    EXPECT_THROW(encode_fp8_scaled(1.0f, -1.0f, Fp8::E5M2), std::invalid_argument);
    EXPECT_THROW(decode_fp8_scaled(0x38, kInf, Fp8::E4M3FN), std::invalid_argument);
    EXPECT_THROW(decode_fp8_scaled(0x38, kNaN, Fp8::E4M3FN), std::invalid_argument);
}

// ---- int8 symmetric, per token per KV head ----

TEST(Int8, HandComputedRowRoundsHalfToEven) {
    // absmax 127 -> scale 127 / 127 = 1 exactly, so code = round_half_even(x).
    const float x[8] = {127.0f, 2.5f, -2.5f, 3.5f, 0.5f, -1.5f, 1.4f, 0.0f};
    int8_t codes[8];
    const float scale = quantize_int8_row(x, 8, ScaleDtype::F32, codes);
    EXPECT_EQ(scale, 1.0f);
    const int8_t want[8] = {127, 2, -2, 4, 0, -2, 1, 0};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(codes[i], want[i]) << "x = " << x[i];
    float back[8];
    dequantize_int8_row(codes, 8, scale, back);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(back[i], static_cast<float>(want[i]));
}

TEST(Int8, NegativeExtremeIsMinus127) {
    // absmax from a negative value: -254 -> scale 2; -254 / 2 = -127 (never -128); 3 / 2 = 1.5 -> 2 (even);
    // 1 / 2 = 0.5 -> 0 (even); -5 / 2 = -2.5 -> -2 (even).
    const float x[4] = {-254.0f, 3.0f, 1.0f, -5.0f};
    int8_t codes[4];
    EXPECT_EQ(quantize_int8_row(x, 4, ScaleDtype::F32, codes), 2.0f);
    const int8_t want[4] = {-127, 2, 0, -2};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(codes[i], want[i]) << "x = " << x[i];
}

TEST(Int8, AbsmaxZeroGivesScaleZeroAndZeroCodes) {
    const float x[4] = {0.0f, -0.0f, 0.0f, 0.0f};
    int8_t codes[4] = {1, 1, 1, 1};
    float back[4];
    for (const ScaleDtype sd : {ScaleDtype::F32, ScaleDtype::F16}) {
        EXPECT_EQ(quantize_int8_row(x, 4, sd, codes), 0.0f);
        dequantize_int8_row(codes, 4, 0.0f, back);
        for (int i = 0; i < 4; ++i) {
            EXPECT_EQ(codes[i], 0);
            EXPECT_EQ(back[i], 0.0f);
        }
    }
}

TEST(Int8, TinyRowsClampOrZero) {
    // absmax 190 * 2^-149 (an f32 subnormal): 190 / 127 = 1.496 rounds to 1, so the scale is 2^-149 and
    // x / scale = 190, clamped to 127.
    const float big[2] = {std::ldexp(190.0f, -149), -std::ldexp(190.0f, -149)};
    int8_t codes[2];
    EXPECT_EQ(quantize_int8_row(big, 2, ScaleDtype::F32, codes), std::ldexp(1.0f, -149));
    EXPECT_EQ(codes[0], 127);
    EXPECT_EQ(codes[1], -127);
    // absmax 63 * 2^-149: 63 / 127 = 0.496 rounds to 0 -> kept scale 0 -> all codes 0.
    const float tiny[2] = {std::ldexp(63.0f, -149), 0.0f};
    EXPECT_EQ(quantize_int8_row(tiny, 2, ScaleDtype::F32, codes), 0.0f);
    EXPECT_EQ(codes[0], 0);
    EXPECT_EQ(codes[1], 0);
}

TEST(Int8, F16ScaleComputesCodesWithTheRoundedScale) {
    // absmax 1: f32 scale 1/127 = 0x1.020408p-7; kept in f16 it is 0x1.02p-7 (bits 0x2008, 0.00787353515625).
    // x = 0x1.52a54ap-4 is 10.5 f32 scales: with the f32 scale 10.5 -> 10 (half to even); with the f16 scale
    // x / 0x1.02p-7 = 10.5006 -> 11.
    const float x[2] = {1.0f, 0x1.52a54ap-4f};
    ASSERT_EQ(x[1] / 0x1.020408p-7f, 10.5f);
    int8_t codes[2];
    EXPECT_EQ(quantize_int8_row(x, 2, ScaleDtype::F32, codes), 0x1.020408p-7f);
    EXPECT_EQ(codes[0], 127);
    EXPECT_EQ(codes[1], 10);
    const float kept = quantize_int8_row(x, 2, ScaleDtype::F16, codes);
    EXPECT_EQ(kept, 0x1.02p-7f);
    EXPECT_EQ(f16_bits(kept), 0x2008);
    EXPECT_EQ(codes[0], 127); // 1 / 0.00787353515625 = 127.0077 -> 127
    EXPECT_EQ(codes[1], 11);
    float back[2];
    dequantize_int8_row(codes, 2, kept, back);
    EXPECT_EQ(back[0], 127.0f * 0x1.02p-7f);
    EXPECT_EQ(back[1], 11.0f * 0x1.02p-7f);
}

TEST(Int8, OneScalePerKvHeadOfAToken) {
    // 2 KV heads x head_dim 2: head 0 absmax 127 (scale 1), head 1 absmax 254 (scale 2).
    const float x[4] = {127.0f, 2.5f, 254.0f, 5.0f};
    int8_t codes[4];
    float scales[2];
    quantize_int8_token(x, 2, 2, ScaleDtype::F32, codes, scales);
    EXPECT_EQ(scales[0], 1.0f);
    EXPECT_EQ(scales[1], 2.0f);
    const int8_t want[4] = {127, 2, 127, 2}; // 2.5 -> 2 and 5 / 2 = 2.5 -> 2
    for (int i = 0; i < 4; ++i) EXPECT_EQ(codes[i], want[i]);
}

TEST(Int8, RejectsNonFiniteInputAndF16Overflow) {
    int8_t codes[2];
    const float inf_row[2] = {1.0f, kInf};
    const float nan_row[2] = {kNaN, 1.0f};
    EXPECT_THROW(quantize_int8_row(inf_row, 2, ScaleDtype::F32, codes), std::invalid_argument);
    EXPECT_THROW(quantize_int8_row(nan_row, 2, ScaleDtype::F16, codes), std::invalid_argument);
    const float huge[2] = {1e7f, 0.0f}; // 1e7 / 127 = 78740 > 65504
    EXPECT_THROW(quantize_int8_row(huge, 2, ScaleDtype::F16, codes), std::invalid_argument);
    EXPECT_NO_THROW(quantize_int8_row(huge, 2, ScaleDtype::F32, codes));
}

// ---- q8_0 (llama.cpp) ----

std::vector<float> block_of(std::initializer_list<float> head) {
    std::vector<float> x(QK8_0, 0.0f);
    std::copy(head.begin(), head.end(), x.begin());
    return x;
}

TEST(Q8_0, HandComputedBlockRoundsHalfAwayFromZero) {
    // amax 127 -> d = 1, id = 1; roundf: 2.5 -> 3, -2.5 -> -3, 3.5 -> 4, 0.5 -> 1, -1.5 -> -2 (int8 above: 2, -2,
    // 4, 0, -2). d is stored as f16 1.0 = 0x3c00.
    const auto x = block_of({127.0f, 2.5f, -2.5f, 3.5f, 0.5f, -1.5f, 1.4f, -127.0f});
    BlockQ8_0 y;
    quantize_row_q8_0(x.data(), QK8_0, &y);
    EXPECT_EQ(y.d, 0x3c00);
    const int8_t want[8] = {127, 3, -3, 4, 1, -2, 1, -127};
    for (int j = 0; j < 8; ++j) EXPECT_EQ(y.qs[j], want[j]) << "x = " << x[j];
    for (int j = 8; j < QK8_0; ++j) EXPECT_EQ(y.qs[j], 0);
    std::vector<float> back(QK8_0);
    dequantize_row_q8_0(&y, QK8_0, back.data());
    for (int j = 0; j < 8; ++j) EXPECT_EQ(back[j], static_cast<float>(want[j]));
}

TEST(Q8_0, MultipliesByTheF32ReciprocalLikeGgml) {
    // amax 3: d = 3/127 = 0x1.83060cp-6, id = 1/d = 0x1.52aaaap+5. x = d/2 exactly (0x1.83060cp-7):
    //   ggml: x * id = 0x1.fffffep-2 (just below 0.5) -> roundf -> 0
    //   x / d = 0.5 exactly -> roundf -> 1 (a kernel dividing would store 1)
    const auto x = block_of({3.0f, 0x1.83060cp-7f});
    const float d = 3.0f / 127.0f, id = 1.0f / d;
    ASSERT_EQ(d, 0x1.83060cp-6f);
    ASSERT_EQ(x[1] * id, 0x1.fffffep-2f);
    ASSERT_EQ(x[1] / d, 0.5f);
    BlockQ8_0 y;
    quantize_row_q8_0(x.data(), QK8_0, &y);
    EXPECT_EQ(y.qs[0], 127);
    EXPECT_EQ(y.qs[1], 0);
    EXPECT_EQ(y.d, f16_bits(d));
    EXPECT_EQ(y.d, 0x260c);
}

TEST(Q8_0, CodesUseTheF32ScaleNotTheStoredF16One) {
    // amax 1: d = 0x1.020408p-7, id = 127 exactly, stored f16 d = 0x1.02p-7 (0x2008). x = 0.3425:
    //   ggml: 0.3425 * 127 = 43.4975 -> 43;   with the f16 d: 0.3425 / 0.00787353515625 = 43.5002 -> 44.
    const auto x = block_of({1.0f, 0.3425f});
    ASSERT_EQ(1.0f / (1.0f / 127.0f), 127.0f);
    BlockQ8_0 y;
    quantize_row_q8_0(x.data(), QK8_0, &y);
    EXPECT_EQ(y.d, 0x2008);
    EXPECT_EQ(y.qs[1], 43);
    std::vector<float> back(QK8_0);
    dequantize_row_q8_0(&y, QK8_0, back.data());
    EXPECT_EQ(back[0], 127.0f * 0x1.02p-7f); // dequantized with the stored f16 d
    EXPECT_EQ(back[1], 43.0f * 0x1.02p-7f);
}

// ggml's SIMD kernels, which write llama.cpp's cache, round differently from quantize_row_q8_0_ref (the numbers
// below were worked out by hand from the kernels' formulas, in f32):
TEST(Q8_0, TheSimdKernelsRoundTiesToEven) {
    // amax 127: d = 1, and both reciprocals (1/d, 127/amax) are 1, so x * id = x: the ties themselves.
    const auto x = block_of({127.0f, 2.5f, -2.5f, 3.5f, 0.5f, -1.5f, 126.5f});
    const int8_t ref[7] = {127, 3, -3, 4, 1, -2, 127};  // half away from zero
    const int8_t even[7] = {127, 2, -2, 4, 0, -2, 126}; // half to even
    for (const Q8_0Rounding r : {Q8_0Rounding::RecipAmaxEven, Q8_0Rounding::RecipDEven}) {
        BlockQ8_0 y, yr;
        quantize_row_q8_0(x.data(), QK8_0, &y, r);
        quantize_row_q8_0(x.data(), QK8_0, &yr);
        EXPECT_EQ(y.d, 0x3c00);
        EXPECT_EQ(y.d, yr.d) << "the scale is the same in every kernel";
        for (int j = 0; j < 7; ++j) {
            EXPECT_EQ(yr.qs[j], ref[j]) << "x = " << x[j];
            EXPECT_EQ(y.qs[j], even[j]) << "x = " << x[j];
        }
    }
}

TEST(Q8_0, TheX86KernelMultipliesBy127OverAmax) {
    // amax 11: d = 11/127 = 0x1.62c58cp-4, 1/d = 0x1.71745cp+3, but 127/11 = 0x1.71745ep+3 (one ulp more).
    // x = 0x1.418306p+0: x * (1/d) = 0x1.cffffep+3 (14.4999..) -> 14 in the reference and on NEON,
    //                    x * (127/amax) = 0x1.d00002p+3 (14.5000..) -> 15 on x86 (not a tie: the reciprocal).
    const auto x = block_of({11.0f, 0x1.418306p+0f});
    ASSERT_EQ(11.0f / 127.0f, 0x1.62c58cp-4f);
    ASSERT_EQ(1.0f / (11.0f / 127.0f), 0x1.71745cp+3f);
    ASSERT_EQ(127.0f / 11.0f, 0x1.71745ep+3f);
    BlockQ8_0 ref, x86, neon;
    quantize_row_q8_0(x.data(), QK8_0, &ref);
    quantize_row_q8_0(x.data(), QK8_0, &x86, Q8_0Rounding::RecipAmaxEven);
    quantize_row_q8_0(x.data(), QK8_0, &neon, Q8_0Rounding::RecipDEven);
    EXPECT_EQ(ref.qs[1], 14);
    EXPECT_EQ(neon.qs[1], 14);
    EXPECT_EQ(x86.qs[1], 15);
    EXPECT_EQ(ref.qs[0], 127);
    EXPECT_EQ(x86.qs[0], 127);
    EXPECT_EQ(x86.d, ref.d);
}

TEST(Q8_0, ZeroTinyAndSeveralBlocks) {
    // Block 0 all zero: d = 0, codes 0. Block 1: negative extreme -254 -> d = 2 (0x4000), -254 * 0.5 = -127,
    // 5 * 0.5 = 2.5 -> 3 (away from zero). Block 2 tiny (amax 1e-37, d below FLT_MIN): d = 0, codes 0.
    std::vector<float> x(3 * QK8_0, 0.0f);
    x[QK8_0 + 0] = -254.0f;
    x[QK8_0 + 1] = 5.0f;
    x[2 * QK8_0 + 0] = 1e-37f;
    x[2 * QK8_0 + 1] = -1e-37f;
    BlockQ8_0 y[3];
    quantize_row_q8_0(x.data(), 3 * QK8_0, y);
    EXPECT_EQ(y[0].d, 0x0000);
    EXPECT_EQ(y[1].d, 0x4000);
    EXPECT_EQ(y[1].qs[0], -127);
    EXPECT_EQ(y[1].qs[1], 3);
    EXPECT_EQ(y[2].d, 0x0000);
    for (int j = 0; j < QK8_0; ++j) {
        EXPECT_EQ(y[0].qs[j], 0);
        EXPECT_EQ(y[2].qs[j], 0);
    }
    std::vector<float> back(3 * QK8_0);
    dequantize_row_q8_0(y, 3 * QK8_0, back.data());
    EXPECT_EQ(back[QK8_0 + 0], -254.0f);
    EXPECT_EQ(back[QK8_0 + 1], 6.0f);
    EXPECT_EQ(back[2 * QK8_0 + 0], 0.0f);
    EXPECT_EQ(sizeof(BlockQ8_0), 34u); // ggml's block_q8_0 layout
}

TEST(Q8_0, RejectsBadLengthsAndNonFiniteInput) {
    std::vector<float> x(QK8_0, 1.0f);
    BlockQ8_0 y[2];
    EXPECT_THROW(quantize_row_q8_0(x.data(), 31, y), std::invalid_argument);
    x[5] = kNaN;
    EXPECT_THROW(quantize_row_q8_0(x.data(), QK8_0, y), std::invalid_argument);
}

// ---- the E4M3FNUZ confusion ----

// E4M3FNUZ (AMD's fp8, ml_dtypes float8_e4m3fnuz) has the same bit layout as E4M3FN but exponent bias 8. A test
// helper, not a product function: the code of a normal x (exactly representable, |x| within both formats' normal
// range) with a given bias.
uint8_t e4m3_normal_code_with_bias(float x, int bias) {
    const int e = std::ilogb(x);                            // x = 1.m * 2^e
    const int mant = static_cast<int>(std::ldexp(x, -e) * 8.0f) - 8; // the 3 fraction bits
    return static_cast<uint8_t>(((e + bias) << 3) | mant);
}

TEST(Fp8, E4M3FnuzBytesReadAsE4M3FnAreOneExponentOff) {
    // The bug class: a kernel writes E4M3FNUZ bytes (bias 8) into a cache declared E4M3FN (bias 7). The code is
    // one exponent step (+0x08) higher, and every value reads back doubled. 1.0: FN 0x38, FNUZ 0x40 = 2.0 as FN.
    EXPECT_EQ(e4m3_normal_code_with_bias(1.0f, 7), 0x38);
    EXPECT_EQ(e4m3_normal_code_with_bias(1.0f, 8), 0x40);
    EXPECT_EQ(decode_e4m3fn(0x40), 2.0f);
    for (const float x : {1.0f, 1.5f, 0.75f, 3.0f, 0.0625f, 13.0f, 224.0f}) {
        const uint8_t fn = encode_e4m3fn(x), fnuz = e4m3_normal_code_with_bias(x, 8);
        EXPECT_EQ(fn, e4m3_normal_code_with_bias(x, 7)) << x; // the helper agrees with the encoder for FN
        EXPECT_EQ(fnuz, fn + 0x08) << x;
        EXPECT_EQ(decode_e4m3fn(fnuz), 2.0f * x) << x;
    }
}

TEST(RoundHalfEven, Ties) {
    EXPECT_EQ(round_half_even(2.5), 2.0);
    EXPECT_EQ(round_half_even(3.5), 4.0);
    EXPECT_EQ(round_half_even(-2.5), -2.0);
    EXPECT_EQ(round_half_even(-3.5), -4.0);
    EXPECT_EQ(round_half_even(0.5), 0.0);
    EXPECT_EQ(round_half_even(2.4999999), 2.0);
    EXPECT_EQ(round_half_even(-0.75), -1.0);
}

} // namespace
