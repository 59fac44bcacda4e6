// The engine's f16/bf16 conversions give the same bits as the reference's (Eigen's round-to-nearest-even), in the
// portable code and in the F16C/AVX2 rows, at every rounding boundary.
#include "dtype_convert.hpp"
#include "simd.hpp"

#include "kvcheck/reference/dtype.hpp"

#include "engine_test_util.hpp"

#include <cmath>

namespace kvc::test {
namespace {

using opt::bits_float;
using opt::float_bits;

// Floats where rounding to 16 bits is decided: every 16-bit value, the midpoints to its neighbours, and one float
// ulp on either side of those midpoints.
std::vector<float> boundary_floats(bool bf16) {
    std::vector<float> xs;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float x = bf16 ? ref::bf16_value(static_cast<uint16_t>(h)) : ref::f16_value(static_cast<uint16_t>(h));
        if (std::isnan(x)) continue;
        xs.push_back(x);
        const float next = bf16 ? ref::bf16_value(static_cast<uint16_t>(h + 1)) : ref::f16_value(static_cast<uint16_t>(h + 1));
        if (h + 1 < 0x10000 && std::isfinite(x) && std::isfinite(next) && std::signbit(x) == std::signbit(next)) {
            const float mid = static_cast<float>((static_cast<double>(x) + next) / 2);
            xs.push_back(mid);
            xs.push_back(std::nextafter(mid, 0.0f));
            xs.push_back(std::nextafter(mid, INFINITY * (mid < 0 ? -1 : 1)));
        }
    }
    for (float x : {65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e10f, INFINITY, -INFINITY, 5.96e-8f, 2.98e-8f, 2.9802322e-8f,
                    1e-45f, -0.0f, 3.0e38f})
        xs.push_back(x);
    return xs;
}

TEST(Dtype, F16RoundingEqualsReferenceEverywhere) {
    for (float x : boundary_floats(false))
        ASSERT_EQ(opt::f32_to_f16(x), ref::f16_bits(x)) << "x = " << x << " (bits 0x" << std::hex << float_bits(x) << ")";
    Rng rng(test_seed(11));
    for (int i = 0; i < 1000000; ++i) {
        const float x = bits_float(static_cast<uint32_t>(rng.gen()));
        if (!std::isnan(x)) {
            ASSERT_EQ(opt::f32_to_f16(x), ref::f16_bits(x)) << "x = " << x;
        }
    }
}

TEST(Dtype, Bf16RoundingEqualsReferenceEverywhere) {
    for (float x : boundary_floats(true)) ASSERT_EQ(opt::f32_to_bf16(x), ref::bf16_bits(x)) << "x = " << x;
    Rng rng(test_seed(12));
    for (int i = 0; i < 1000000; ++i) {
        const float x = bits_float(static_cast<uint32_t>(rng.gen()));
        ASSERT_EQ(opt::f32_to_bf16(x), ref::bf16_bits(x)) << "x = " << x;
    }
}

TEST(Dtype, WideningIsExact) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const auto b = static_cast<uint16_t>(h);
        const float a = opt::f16_to_f32(b), r = ref::f16_value(b);
        if (std::isnan(r)) {
            EXPECT_TRUE(std::isnan(a));
            continue;
        }
        ASSERT_EQ(float_bits(a), float_bits(r)) << "f16 0x" << std::hex << h;
        ASSERT_EQ(float_bits(opt::bf16_to_f32(b)), float_bits(ref::bf16_value(b))) << "bf16 0x" << std::hex << h;
    }
}

TEST(Dtype, SimdRowsEqualPortableRows) {
    if (!opt::cpu_has_avx2_f16c()) GTEST_SKIP() << "this CPU has no AVX2/F16C";
    std::vector<float> xs = boundary_floats(false);
    const std::vector<float> more = boundary_floats(true);
    xs.insert(xs.end(), more.begin(), more.end());
    xs.push_back(std::nanf("")); // NaN stays NaN (payload aside)
    const uint32_t n = static_cast<uint32_t>(xs.size());
    for (uint32_t dtype : {uint32_t(KVC_DTYPE_F16), uint32_t(KVC_DTYPE_BF16)}) {
        std::vector<uint16_t> simd(n), portable(n);
        opt::store_row(xs.data(), dtype, simd.data(), n, true);
        opt::store_row(xs.data(), dtype, portable.data(), n, false);
        for (uint32_t i = 0; i + 1 < n; ++i) ASSERT_EQ(simd[i], portable[i]) << dtype_name(dtype) << " x = " << xs[i];
        const float back = opt::load_elem(&simd[n - 1], dtype);
        EXPECT_TRUE(std::isnan(back));
        std::vector<float> w1(n), w2(n);
        opt::load_row(simd.data(), dtype, w1.data(), n, true);
        opt::load_row(simd.data(), dtype, w2.data(), n, false);
        for (uint32_t i = 0; i + 1 < n; ++i) ASSERT_EQ(float_bits(w1[i]), float_bits(w2[i]));
    }
}

} // namespace
} // namespace kvc::test
