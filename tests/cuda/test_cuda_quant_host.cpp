// The CUDA engine's quantizers and dequantizers (optimized/include/kvcheck/optimized/quant_math.hpp, the functions
// its append and attention kernels call) run on the CPU, bitwise against kvc::ref (the contract:
// reference/include/kvcheck/reference/quantize.hpp) and against the CPU engine's own quantizers
// (optimized/src/quantize.cpp): every fp8 code, every rounding boundary between two codes (the midpoint and its
// neighbouring floats), saturation, NaN, signed zeros, a sweep of f32 bit patterns; fp8 with scales; int8 rows with
// f32 and f16 scales and q8_0 rows: random, exact ties, zero, tiny and huge; the rows' scale bytes and layout; the
// input refusals; the 16-code staging of fp8 rows. g++ only: runs on every machine, with or without a GPU.
#include "kvcheck/abi.hpp"
#include "kvcheck/optimized/kv_layout.h"
#include "kvcheck/optimized/quant_math.hpp"
#include "kvcheck/reference/quantize.hpp"

#include "quantize.hpp" // the CPU engine's (optimized/src)

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

namespace m = kvc::opt::math;
using kvc::ref::Fp8;

struct Fp8Case {
    uint32_t dtype;
    Fp8 format;
};
const Fp8Case kFp8[] = {{KVC_DTYPE_FP8_E4M3, Fp8::E4M3FN}, {KVC_DTYPE_FP8_E5M2, Fp8::E5M2}};

uint32_t bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
float from_bits(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

bool same_float(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
    return bits(a) == bits(b);
}

uint8_t cpu_encode(const Fp8Case& f, float x) {
    return f.dtype == KVC_DTYPE_FP8_E4M3 ? kvc::opt::fp8_e4m3_encode(x) : kvc::opt::fp8_e5m2_encode(x);
}

// Encodes x (and -x) like the reference and the CPU engine; returns false after the first failure.
bool encodes_like_ref(const Fp8Case& f, float x) {
    for (const float y : {x, -x}) {
        const uint8_t got = m::fp8_encode(y, f.dtype), want = kvc::ref::encode_fp8(y, f.format);
        EXPECT_EQ(got, want) << "x = " << y << " (bits 0x" << std::hex << bits(y) << ")";
        EXPECT_EQ(got, cpu_encode(f, y)) << "vs the CPU engine, x = " << y;
        if (got != want) return false;
    }
    return true;
}

TEST(CudaQuantHost, Fp8EveryCodeDecodesLikeTheReference) {
    for (const Fp8Case& f : kFp8)
        for (int c = 0; c < 256; ++c) {
            const auto code = static_cast<uint8_t>(c);
            const float want = kvc::ref::decode_fp8(code, f.format), got = m::fp8_decode(code, f.dtype);
            EXPECT_TRUE(same_float(got, want)) << "code 0x" << std::hex << c << ": " << got << " vs " << want;
            if (std::isfinite(want)) {
                EXPECT_EQ(m::fp8_encode(got, f.dtype), code) << "code 0x" << std::hex << c;
            }
            encodes_like_ref(f, want);
        }
}

TEST(CudaQuantHost, Fp8EveryRoundingBoundaryMatchesTheReference) {
    for (const Fp8Case& f : kFp8) {
        const float max = kvc::ref::fp8_max_finite(f.format);
        std::vector<float> values; // every non-negative finite value, then the would-be next binade
        for (int c = 0; c < 128; ++c) {
            const float v = kvc::ref::decode_fp8(static_cast<uint8_t>(c), f.format);
            if (std::isfinite(v)) values.push_back(v);
        }
        values.push_back(2.0f * max);
        for (size_t i = 0; i + 1 < values.size(); ++i) {
            const float a = values[i], b = values[i + 1], mid = a + (b - a) / 2; // exact: fp8 values have few bits
            for (const float x : {a, b, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                                  std::nextafter(a, INFINITY), std::nextafter(b, 0.0f)})
                if (!encodes_like_ref(f, x)) return;
        }
        for (const float x : {max, std::nextafter(max, INFINITY), 1.5f * max, 3.0e38f, INFINITY, 0.0f, 1e-45f,
                              FLT_MIN, std::nextafter(FLT_MIN, 0.0f)})
            encodes_like_ref(f, x);
        for (const uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fffffffu})
            EXPECT_EQ(m::fp8_encode(from_bits(nan), f.dtype), kvc::ref::encode_fp8(from_bits(nan), f.format))
                << "NaN 0x" << std::hex << nan;
    }
}

// A sweep of f32 patterns (a prime stride over all 2^32) and every pattern whose low 16 bits are zero (every
// exponent, the top of every mantissa).
TEST(CudaQuantHost, Fp8F32PatternSweepMatchesTheReference) {
    for (const Fp8Case& f : kFp8) {
        uint64_t bad = 0;
        for (uint64_t u = 0; u < (1ull << 32) && bad < 5; u += 4093) {
            const float x = from_bits(static_cast<uint32_t>(u));
            const uint8_t got = m::fp8_encode(x, f.dtype), want = kvc::ref::encode_fp8(x, f.format);
            if (got != want || got != cpu_encode(f, x)) {
                ++bad;
                ADD_FAILURE() << "bits 0x" << std::hex << u << ": " << int{got} << " vs " << int{want};
            }
        }
        for (uint64_t hi = 0; hi < 65536 && bad < 5; ++hi) {
            const float x = from_bits(static_cast<uint32_t>(hi << 16));
            if (m::fp8_encode(x, f.dtype) != kvc::ref::encode_fp8(x, f.format)) {
                ++bad;
                ADD_FAILURE() << "bits 0x" << std::hex << (hi << 16);
            }
        }
    }
}

// code = encode(x / scale), x' = decode(code) * scale, both rounded once in f32 (never x * (1 / scale)).
TEST(CudaQuantHost, Fp8WithAScaleMatchesTheReference) {
    std::mt19937_64 gen(20261206);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> expo(-12.0f, 12.0f);
    for (const Fp8Case& f : kFp8)
        for (const float scale : {1.0f, 0.5f, 3.0f, 1.0f / 3.0f, 1e-3f, 7.1e5f, 0.0173f, 2.5e-30f}) {
            for (int i = 0; i < 20000; ++i) {
                const float x = normal(gen) * std::exp2(expo(gen)) * scale;
                const uint8_t code = m::fp8_code(x, scale, f.dtype);
                ASSERT_EQ(code, kvc::ref::encode_fp8_scaled(x, scale, f.format)) << x << " / " << scale;
                ASSERT_TRUE(same_float(m::dequantize_code(code, f.dtype, scale),
                                       kvc::ref::decode_fp8_scaled(code, scale, f.format)))
                    << "code " << int{code} << " * " << scale;
            }
            // rows: the serial quantize_row (what the append kernel splits over threads) and the CPU engine's
            std::vector<float> row(96);
            for (float& x : row) x = normal(gen) * 300.0f * scale; // some saturate (E4M3: |x / scale| > 448)
            std::vector<uint8_t> got(96), want(96), cpu(96);
            m::quantize_row(row.data(), f.dtype, 96, false, scale, got.data());
            kvc::ref::quantize_fp8_row(row.data(), 96, scale, f.format, want.data());
            kvc::opt::quantize_row(row.data(), kvc::opt::QuantFormat{f.dtype, 96, false}, scale, cpu.data());
            EXPECT_EQ(got, want);
            EXPECT_EQ(got, cpu);
            std::vector<float> deq(96);
            kvc::ref::dequantize_fp8_row(want.data(), 96, scale, f.format, deq.data());
            for (uint32_t i = 0; i < 96; ++i)
                ASSERT_TRUE(same_float(m::dequantize_elem(got.data(), f.dtype, 96, false, scale, i), deq[i])) << i;
        }
}

// ---- int8 per token ----

// One row through quant_math, kvc::ref and the CPU engine: the same codes and scale bytes; dequantized alike.
void expect_int8_row(const std::vector<float>& x, bool f16, const std::string& what) {
    const auto d = static_cast<uint32_t>(x.size());
    const uint32_t sb = m::row_scale_bytes(KVC_DTYPE_INT8_TOKEN, d, f16);
    std::vector<uint8_t> got(d + sb), cpu(d + sb), want(d + sb);
    m::quantize_row(x.data(), KVC_DTYPE_INT8_TOKEN, d, f16, 1.0f, got.data());
    kvc::opt::quantize_row(x.data(), kvc::opt::QuantFormat{KVC_DTYPE_INT8_TOKEN, d, f16}, 1.0f, cpu.data());
    std::vector<int8_t> codes(d);
    const float scale = kvc::ref::quantize_int8_row(x.data(), static_cast<int>(d),
                                                    f16 ? kvc::ref::ScaleDtype::F16 : kvc::ref::ScaleDtype::F32,
                                                    codes.data());
    std::memcpy(want.data(), codes.data(), d);
    if (f16) {
        const uint16_t h = m::f32_to_f16_bits(scale);
        ASSERT_EQ(m::f16_bits_to_f32(h), scale) << what << ": the reference's kept scale is an f16";
        std::memcpy(want.data() + d, &h, 2);
    } else {
        std::memcpy(want.data() + d, &scale, 4);
    }
    ASSERT_EQ(got, want) << what << (f16 ? " (f16 scale)" : " (f32 scale)");
    ASSERT_EQ(got, cpu) << what << ": vs the CPU engine";
    std::vector<float> deq(d);
    kvc::ref::dequantize_int8_row(codes.data(), static_cast<int>(d), scale, deq.data());
    for (uint32_t i = 0; i < d; ++i)
        ASSERT_TRUE(same_float(m::dequantize_elem(got.data(), KVC_DTYPE_INT8_TOKEN, d, f16, 1.0f, i), deq[i]))
            << what << " element " << i;
}

TEST(CudaQuantHost, Int8RandomRowsMatchTheReference) {
    std::mt19937_64 gen(20261206);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> expo(-20.0f, 20.0f);
    for (const uint32_t d : {1u, 7u, 32u, 64u, 128u, 256u})
        for (int r = 0; r < 300; ++r) {
            const float mag = std::exp2(expo(gen));
            std::vector<float> x(d);
            for (float& e : x) e = normal(gen) * mag;
            expect_int8_row(x, false, "d " + std::to_string(d) + " row " + std::to_string(r));
            expect_int8_row(x, true, "d " + std::to_string(d) + " row " + std::to_string(r));
        }
}

// Exact ties x / scale = k + 1/2 round to even (2.5 -> 2, -2.5 -> -2, 3.5 -> 4); a zero row; tiny rows (a subnormal
// f32 scale whose quotients pass 127 and are clamped; an f16 scale that rounds to 0 or to an f16 subnormal); a
// huge row (f32 scale), and one whose f16 scale overflows (refused, like the CPU engine).
TEST(CudaQuantHost, Int8TiesZeroTinyAndHugeRowsMatchTheReference) {
    std::vector<float> ties;
    for (int k = -127; k < 127; ++k) ties.push_back((static_cast<float>(k) + 0.5f) * 0.125f); // scale 2^-3 exactly
    ties.push_back(127.0f * 0.125f);
    for (const bool f16 : {false, true}) {
        expect_int8_row(ties, f16, "ties");
        std::vector<uint8_t> row(ties.size() + 4);
        m::quantize_row(ties.data(), KVC_DTYPE_INT8_TOKEN, static_cast<uint32_t>(ties.size()), f16, 1.0f, row.data());
        EXPECT_EQ(static_cast<int8_t>(row[127 + 2]), 2) << "2.5 -> 2";
        EXPECT_EQ(static_cast<int8_t>(row[127 + 3]), 4) << "3.5 -> 4";
        EXPECT_EQ(static_cast<int8_t>(row[127 - 3]), -2) << "-2.5 -> -2";
        expect_int8_row(std::vector<float>(64, 0.0f), f16, "zero");
        expect_int8_row(std::vector<float>(64, -0.0f), f16, "negative zero");
        for (const float tiny : {1e-45f, 1e-40f, 1.5e-38f, 1e-36f, 1e-7f, 6e-6f, 127.0f * 6.1e-5f}) {
            std::vector<float> x(48);
            for (size_t i = 0; i < x.size(); ++i) x[i] = tiny * (static_cast<float>(i % 11) - 5.0f) / 5.0f;
            expect_int8_row(x, f16, "tiny " + std::to_string(tiny));
        }
        std::vector<float> huge(32);
        for (size_t i = 0; i < huge.size(); ++i) huge[i] = 3.0e38f * ((static_cast<float>(i) - 16.0f) / 16.0f);
        if (!f16) expect_int8_row(huge, false, "huge");
        const int why = m::unquantizable(huge.data(), KVC_DTYPE_INT8_TOKEN, 32, f16);
        EXPECT_EQ(why, f16 ? 2 : 0);
        EXPECT_EQ(why != 0, kvc::opt::unquantizable(huge.data(), kvc::opt::QuantFormat{KVC_DTYPE_INT8_TOKEN, 32, f16}) !=
                                nullptr);
        // the largest row whose f16 scale does not overflow, and the first that does
        std::vector<float> edge(32, 0.0f);
        for (const float amax : {65504.0f * 127.0f, 65519.0f * 127.0f, 65520.0f * 127.0f}) {
            edge[5] = amax;
            const bool refused = m::unquantizable(edge.data(), KVC_DTYPE_INT8_TOKEN, 32, true) != 0;
            EXPECT_EQ(refused, kvc::opt::unquantizable(edge.data(), kvc::opt::QuantFormat{KVC_DTYPE_INT8_TOKEN, 32,
                                                                                            true}) != nullptr)
                << amax;
            if (!refused) expect_int8_row(edge, true, "f16 edge " + std::to_string(amax));
        }
    }
}

// ---- q8_0 ----

void expect_q8_0_row(const std::vector<float>& x, const std::string& what) {
    const auto d = static_cast<uint32_t>(x.size()), nb = d / 32;
    std::vector<uint8_t> got(d + 2 * nb), cpu(d + 2 * nb), want(d + 2 * nb);
    m::quantize_row(x.data(), KVC_DTYPE_Q8_0, d, false, 1.0f, got.data());
    kvc::opt::quantize_row(x.data(), kvc::opt::QuantFormat{KVC_DTYPE_Q8_0, d, false}, 1.0f, cpu.data());
    std::vector<kvc::ref::BlockQ8_0> blocks(nb);
    kvc::ref::quantize_row_q8_0(x.data(), static_cast<int>(d), blocks.data());
    for (uint32_t b = 0; b < nb; ++b) { // ggml's [d][32 codes] blocks as a cache row: the codes, then the d's
        std::memcpy(want.data() + 32 * b, blocks[b].qs, 32);
        std::memcpy(want.data() + d + 2 * b, &blocks[b].d, 2);
    }
    ASSERT_EQ(got, want) << what;
    ASSERT_EQ(got, cpu) << what << ": vs the CPU engine";
    std::vector<float> deq(d);
    kvc::ref::dequantize_row_q8_0(blocks.data(), static_cast<int>(d), deq.data());
    for (uint32_t i = 0; i < d; ++i)
        ASSERT_TRUE(same_float(m::dequantize_elem(got.data(), KVC_DTYPE_Q8_0, d, false, 1.0f, i), deq[i]))
            << what << " element " << i;
}

TEST(CudaQuantHost, Q8_0RandomRowsMatchGgmlsReference) {
    std::mt19937_64 gen(20261206);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> expo(-30.0f, 30.0f);
    for (const uint32_t d : {32u, 64u, 128u, 256u})
        for (int r = 0; r < 300; ++r) {
            std::vector<float> x(d);
            for (uint32_t b = 0; b < d / 32; ++b) { // every block its own magnitude
                const float mag = std::exp2(expo(gen));
                for (uint32_t j = 0; j < 32; ++j) x[b * 32 + j] = normal(gen) * mag;
            }
            expect_q8_0_row(x, "d " + std::to_string(d) + " row " + std::to_string(r));
        }
}

// Ties x * id = k + 1/2 round half away from zero (roundf: 2.5 -> 3, -2.5 -> -3); zero blocks; tiny blocks (d below
// the smallest normal f32: d = 0 and codes 0); a d that is an f16 subnormal; a d above f16's range (stored inf).
TEST(CudaQuantHost, Q8_0TiesZeroTinyAndHugeBlocksMatchGgmlsReference) {
    std::vector<float> x(128);
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) + 0.5f; // block 0: d = 1 when amax = 127
    x[31] = 127.0f;
    for (int j = 0; j < 32; ++j) x[32 + j] = (static_cast<float>(j - 16) + 0.5f) * 0.5f; // block 1: d = 0.5
    x[63] = 63.5f;
    for (int j = 0; j < 32; ++j) x[64 + j] = 0.0f; // block 2: zero
    for (int j = 0; j < 32; ++j) x[96 + j] = 1e-37f * static_cast<float>(j - 16) / 16.0f; // block 3: tiny
    expect_q8_0_row(x, "ties, zero, tiny");
    std::vector<uint8_t> row(128 + 8);
    m::quantize_row(x.data(), KVC_DTYPE_Q8_0, 128, false, 1.0f, row.data());
    EXPECT_EQ(static_cast<int8_t>(row[18]), 3) << "2.5 -> 3";
    EXPECT_EQ(static_cast<int8_t>(row[13]), -3) << "-2.5 -> -3";
    for (int j = 96; j < 128; ++j) EXPECT_EQ(row[j], 0) << "a tiny block's codes are 0";
    for (const float amax : {127.0f * FLT_MIN, 127.0f * std::nextafter(FLT_MIN, 0.0f), 1e-6f, 127.0f * 6.0e-8f,
                             65504.0f * 127.0f, 65520.0f * 127.0f, 3.0e38f}) {
        std::vector<float> y(32);
        for (int j = 0; j < 32; ++j) y[j] = amax * (static_cast<float>(j - 16) / 16.0f);
        expect_q8_0_row(y, "amax " + std::to_string(amax));
    }
    std::vector<float> bad(64, 1.0f);
    bad[40] = NAN;
    EXPECT_EQ(m::unquantizable(bad.data(), KVC_DTYPE_Q8_0, 64, false), 1);
    bad[40] = -INFINITY;
    EXPECT_EQ(m::unquantizable(bad.data(), KVC_DTYPE_INT8_TOKEN, 64, false), 1);
    EXPECT_EQ(m::unquantizable(bad.data(), KVC_DTYPE_FP8_E4M3, 64, false), 0) << "fp8 stores anything";
    EXPECT_NE(kvc::opt::unquantizable(bad.data(), kvc::opt::QuantFormat{KVC_DTYPE_INT8_TOKEN, 64, false}), nullptr);
}

// ---- rows in the layout, the staging of fp8 rows ----

TEST(CudaQuantHost, RowScaleBytesAreTheLayoutsAndTheAbis) {
    for (const uint32_t dtype : {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2, KVC_DTYPE_INT8_TOKEN, KVC_DTYPE_Q8_0})
        for (const uint32_t d : {32u, 64u, 96u, 256u})
            for (const bool f16 : {false, true}) {
                if (f16 && dtype != KVC_DTYPE_INT8_TOKEN) continue;
                const uint32_t sb = m::row_scale_bytes(dtype, d, f16);
                EXPECT_EQ(sb, kvc::opt::row_scale_bytes(kvc::opt::QuantFormat{dtype, d, f16}));
                const uint32_t scale_dtype = f16 ? KVC_DTYPE_F16 : KVC_DTYPE_F32;
                EXPECT_EQ(m::read_scale_bytes(dtype, d, f16),
                          kvc::scales_per_head_row(dtype, d) * kvc::scale_size(dtype, scale_dtype));
                EXPECT_EQ(m::read_scale_bytes(dtype, d, f16),
                          kvc::opt::row_scales_bytes(kvc::opt::QuantFormat{dtype, d, f16}));
                if (!m::is_fp8(dtype)) {
                    EXPECT_EQ(d + sb, kvc::head_row_bytes(dtype, d, scale_dtype));
                }
                const kvc_kv_layout l = kvc_kv_layout_make_scaled(16, 2, d, 1, sb);
                EXPECT_EQ(l.row_bytes, d + sb);
                EXPECT_EQ(kvc_kv_scale_offset(&l), d);
            }
}

TEST(CudaQuantHost, Fp8StagingOf16CodesIsTheDequantizer) {
    std::mt19937_64 gen(20261206);
    for (const Fp8Case& f : kFp8)
        for (const float scale : {1.0f, 0.37f, 1e-3f})
            for (int r = 0; r < 2000; ++r) {
                uint32_t w[4];
                uint8_t bytes[16];
                for (uint32_t& x : w) x = static_cast<uint32_t>(gen());
                std::memcpy(bytes, w, 16); // the machine's (and the device's) little-endian order
                float out[16];
                m::widen_fp8_words(w, f.dtype, scale, out);
                for (int i = 0; i < 16; ++i)
                    ASSERT_TRUE(same_float(out[i], kvc::ref::decode_fp8_scaled(bytes[i], scale, f.format)))
                        << "code " << int{bytes[i]};
            }
}

} // namespace
