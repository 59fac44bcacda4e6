// The engine's quantizers (optimized/src/quantize.cpp) against kvc::ref's (reference/src/quantize.cpp), bitwise:
// the two are written independently, and a quantized cache is judged on its stored bytes. fp8: every code, every
// rounding boundary between two codes (the midpoint and its neighbouring floats), saturation, NaN, signed zeros and
// a million random f32 bit patterns; rows with scales (saturating ones too); int8 with f32 and f16 scales, q8_0:
// random rows, exact ties, zero, tiny and huge rows. Dequantizers: bitwise equal to the reference's.
#include "engine_test_util.hpp"

#include "kvcheck/reference/quantize.hpp"
#include "dtype_convert.hpp"
#include "quantize.hpp"

#include <cfloat>
#include <limits>

namespace kvc::test {
namespace {

using ref::Fp8;

struct Fp8Case {
    uint32_t dtype;
    Fp8 format;
    uint8_t (*encode)(float);
    float (*decode)(uint8_t);
};
const Fp8Case kFp8[] = {{KVC_DTYPE_FP8_E4M3, Fp8::E4M3FN, opt::fp8_e4m3_encode, opt::fp8_e4m3_decode},
                        {KVC_DTYPE_FP8_E5M2, Fp8::E5M2, opt::fp8_e5m2_encode, opt::fp8_e5m2_decode}};

bool same_float(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
    return std::memcmp(&a, &b, 4) == 0;
}

void expect_encodes_like_ref(const Fp8Case& f, float x) {
    EXPECT_EQ(f.encode(x), ref::encode_fp8(x, f.format)) << "x = " << x << " (bits 0x" << std::hex
                                                           << opt::float_bits(x) << ")";
}

TEST(Quantize, Fp8EveryCodeDecodesAndReencodesLikeTheReference) {
    for (const Fp8Case& f : kFp8)
        for (int c = 0; c < 256; ++c) {
            const auto code = static_cast<uint8_t>(c);
            const float want = ref::decode_fp8(code, f.format), got = f.decode(code);
            EXPECT_TRUE(same_float(got, want)) << "code 0x" << std::hex << c << ": " << got << " vs " << want;
            if (!std::isnan(want) && !std::isinf(want)) {
                EXPECT_EQ(f.encode(got), code) << "code 0x" << std::hex << c;
            }
            expect_encodes_like_ref(f, want);
        }
}

TEST(Quantize, Fp8EveryRoundingBoundaryMatchesTheReference) {
    for (const Fp8Case& f : kFp8) {
        const float max = ref::fp8_max_finite(f.format);
        std::vector<float> values; // every positive finite value, then one step past max
        for (int c = 0; c < 128; ++c) {
            const float v = ref::decode_fp8(static_cast<uint8_t>(c), f.format);
            if (std::isfinite(v)) values.push_back(v);
        }
        values.push_back(2.0f * max); // beyond: the would-be next binade
        int checked = 0;
        for (size_t i = 0; i + 1 < values.size(); ++i) {
            const float mid = static_cast<float>((static_cast<double>(values[i]) + values[i + 1]) / 2); // exact
            for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), values[i],
                            std::nextafter(values[i], INFINITY)})
                for (float s : {1.0f, -1.0f}) {
                    expect_encodes_like_ref(f, s * x);
                    ++checked;
                }
        }
        for (float x : {max, std::nextafter(max, INFINITY), max * 1.0625f, max * 1.125f, max * 1.25f, 1e30f,
                        FLT_MAX, INFINITY, 0.0f, 1e-30f, FLT_MIN, FLT_TRUE_MIN,
                        std::numeric_limits<float>::quiet_NaN()})
            for (float s : {1.0f, -1.0f}) expect_encodes_like_ref(f, s * x);
        EXPECT_GT(checked, 1000);
    }
}

TEST(Quantize, Fp8RandomBitPatternsMatchTheReference) {
    Rng rng(test_seed(3901));
    for (const Fp8Case& f : kFp8)
        for (int i = 0; i < 1000000; ++i) {
            const float x = opt::bits_float(static_cast<uint32_t>(rng.gen()));
            const uint8_t got = f.encode(x), want = ref::encode_fp8(x, f.format);
            if (got != want) {
                ADD_FAILURE() << "x = " << x << ": " << int(got) << " vs " << int(want);
                return;
            }
        }
}

// Random rows of each quantized format (values of several magnitudes, ties, zeros, tiny rows), quantized by both.
std::vector<std::vector<float>> test_rows(Rng& rng, uint32_t d) {
    std::vector<std::vector<float>> rows;
    for (float sigma : {1.0f, 1e-3f, 300.0f, 1e5f, 1e-30f}) {
        for (int i = 0; i < 40; ++i) rows.push_back(rng.normal(d, sigma));
    }
    rows.push_back(std::vector<float>(d, 0.0f));
    std::vector<float> neg_zero(d, -0.0f);
    rows.push_back(neg_zero);
    std::vector<float> tiny(d, 0.0f);
    tiny[d / 2] = FLT_TRUE_MIN * 5;
    rows.push_back(tiny);
    // ties: absmax 127 (int8 scale and q8_0 d exactly 1), values k + 1/2
    std::vector<float> ties(d);
    for (uint32_t i = 0; i < d; ++i) ties[i] = (i % 2 ? -1.0f : 1.0f) * (static_cast<float>(i % 20) + 0.5f);
    for (uint32_t b = 0; b < d; b += 32) ties[b] = 127.0f;
    ties[0] = 127.0f;
    rows.push_back(ties);
    // integers times an exact scale, and a row with one huge value
    std::vector<float> ints(d);
    for (uint32_t i = 0; i < d; ++i) ints[i] = static_cast<float>(static_cast<int>(i % 255) - 127) * 0.25f;
    rows.push_back(ints);
    auto huge = rng.normal(d);
    huge[1] = 3e9f;
    rows.push_back(huge);
    return rows;
}

TEST(Quantize, Fp8RowsWithScalesMatchTheReference) {
    Rng rng(test_seed(3902));
    const uint32_t d = 40;
    for (const Fp8Case& f : kFp8)
        for (const auto& x : test_rows(rng, d))
            for (float scale : {1.0f, 0.5f, 0.1f, 3.0f, 1e-4f, 1e-20f, 7e5f, 1e30f}) {
                std::vector<uint8_t> got(d), want(d);
                opt::quantize_row(x.data(), opt::QuantFormat{f.dtype, d, false}, scale, got.data());
                ref::quantize_fp8_row(x.data(), static_cast<int>(d), scale, f.format, want.data());
                ASSERT_EQ(got, want) << "scale " << scale;
                std::vector<float> back(d), back_ref(d);
                opt::dequantize_row(got.data(), opt::QuantFormat{f.dtype, d, false}, scale, back.data());
                ref::dequantize_fp8_row(want.data(), static_cast<int>(d), scale, f.format, back_ref.data());
                for (uint32_t i = 0; i < d; ++i) ASSERT_TRUE(same_float(back[i], back_ref[i])) << i;
            }
}

TEST(Quantize, Int8RowsMatchTheReference) {
    Rng rng(test_seed(3903));
    for (uint32_t d : {5u, 40u, 128u})
        for (bool f16 : {false, true})
            for (const auto& x : test_rows(rng, d)) {
                const opt::QuantFormat qf{KVC_DTYPE_INT8_TOKEN, d, f16};
                if (opt::unquantizable(x.data(), qf)) { // only an f16 scale of the huge row overflows
                    EXPECT_TRUE(f16);
                    EXPECT_THROW(ref::quantize_int8_row(x.data(), static_cast<int>(d), ref::ScaleDtype::F16,
                                                        std::vector<int8_t>(d).data()),
                                 std::invalid_argument);
                    continue;
                }
                std::vector<uint8_t> got(d + opt::row_scale_bytes(qf));
                std::vector<int8_t> want(d);
                opt::quantize_row(x.data(), qf, 1.0f, got.data());
                const float scale = ref::quantize_int8_row(x.data(), static_cast<int>(d),
                                                           f16 ? ref::ScaleDtype::F16 : ref::ScaleDtype::F32, want.data());
                ASSERT_EQ(0, std::memcmp(got.data(), want.data(), d)) << "d " << d << " f16 " << f16;
                float stored;
                if (f16) {
                    uint16_t b;
                    std::memcpy(&b, got.data() + d, 2);
                    EXPECT_EQ(b, ref::f16_bits(scale));
                    stored = opt::f16_to_f32(b);
                } else {
                    std::memcpy(&stored, got.data() + d, 4);
                }
                ASSERT_TRUE(same_float(stored, scale));
                std::vector<float> back(d), back_ref(d);
                opt::dequantize_row(got.data(), qf, 1.0f, back.data());
                ref::dequantize_int8_row(want.data(), static_cast<int>(d), scale, back_ref.data());
                for (uint32_t i = 0; i < d; ++i) ASSERT_TRUE(same_float(back[i], back_ref[i])) << i;
            }
}

TEST(Quantize, Q8_0RowsMatchTheReference) {
    Rng rng(test_seed(3904));
    for (uint32_t d : {32u, 64u, 256u})
        for (const auto& x : test_rows(rng, d)) {
            const opt::QuantFormat qf{KVC_DTYPE_Q8_0, d, false};
            ASSERT_EQ(opt::unquantizable(x.data(), qf), nullptr);
            std::vector<uint8_t> got(d + opt::row_scale_bytes(qf));
            std::vector<ref::BlockQ8_0> want(d / 32);
            opt::quantize_row(x.data(), qf, 1.0f, got.data());
            ref::quantize_row_q8_0(x.data(), static_cast<int>(d), want.data());
            for (uint32_t b = 0; b < d / 32; ++b) {
                uint16_t db;
                std::memcpy(&db, got.data() + d + 2 * b, 2);
                ASSERT_EQ(db, want[b].d) << "block " << b;
                ASSERT_EQ(0, std::memcmp(got.data() + 32 * b, want[b].qs, 32)) << "block " << b;
            }
            std::vector<float> back(d), back_ref(d);
            opt::dequantize_row(got.data(), qf, 1.0f, back.data());
            ref::dequantize_row_q8_0(want.data(), static_cast<int>(d), back_ref.data());
            for (uint32_t i = 0; i < d; ++i) ASSERT_TRUE(same_float(back[i], back_ref[i])) << i;
        }
}

TEST(Quantize, NonFiniteRowsAreRefusedForInt8AndQ8_0Only) {
    std::vector<float> x(32, 1.0f);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_NE(opt::unquantizable(x.data(), opt::QuantFormat{KVC_DTYPE_INT8_TOKEN, 32, false}), nullptr);
    EXPECT_NE(opt::unquantizable(x.data(), opt::QuantFormat{KVC_DTYPE_Q8_0, 32, false}), nullptr);
    EXPECT_EQ(opt::unquantizable(x.data(), opt::QuantFormat{KVC_DTYPE_FP8_E4M3, 32, false}), nullptr);
    x[3] = INFINITY;
    EXPECT_NE(opt::unquantizable(x.data(), opt::QuantFormat{KVC_DTYPE_Q8_0, 32, false}), nullptr);
}

} // namespace
} // namespace kvc::test
