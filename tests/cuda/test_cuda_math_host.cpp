// The CUDA engine's math that is not launch geometry (dtype_math.hpp, rope_math.hpp, the element-wise merge of
// softmax_state.hpp), run here on the CPU exactly as the kernels run it, and judged against the reference
// (kvc::ref: Eigen's half/bfloat16, long-double RoPE and softmax) and the CPU engine's own conversions and RoPE.
// Built with g++ only, so CI runs it without a GPU. Random cases print their seed (KVCHECK_SEED=N replays).
#include "kvcheck/optimized/dtype_math.hpp"
#include "kvcheck/optimized/kv_layout.h"
#include "kvcheck/optimized/rope_math.hpp"
#include "kvcheck/optimized/softmax_state.hpp"

#include "dtype_convert.hpp" // the CPU engine's conversions (optimized/src)
#include "rope.hpp"          // the CPU engine's RoPE (optimized/src)

#include "kvcheck/reference/config.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

namespace {

namespace m = kvc::opt::math;

uint64_t test_seed(uint64_t fallback) {
    uint64_t seed = fallback;
    if (const char* env = std::getenv("KVCHECK_SEED")) seed = std::strtoull(env, nullptr, 0);
    std::cout << "[ seed     ] KVCHECK_SEED=" << seed << "\n";
    ::testing::Test::RecordProperty("seed", std::to_string(seed));
    return seed;
}

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

// Distance in units in the last place between two finite floats of the same sign region.
int64_t ulps(float a, float b) {
    auto key = [](float x) {
        const int32_t i = static_cast<int32_t>(bits(x));
        return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
    };
    return std::llabs(key(a) - key(b));
}

// ---- dtypes ----

TEST(CudaMathDtype, EveryHalfWidensAsTheReferenceAndTheCpuEngine) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float got = m::f16_bits_to_f32(static_cast<uint16_t>(h));
        const float ref = kvc::ref::f16_value(static_cast<uint16_t>(h));
        if (std::isnan(ref)) {
            EXPECT_TRUE(std::isnan(got)) << "f16 0x" << std::hex << h;
            continue;
        }
        ASSERT_EQ(bits(got), bits(ref)) << "f16 0x" << std::hex << h;
        ASSERT_EQ(bits(got), bits(kvc::opt::f16_to_f32(static_cast<uint16_t>(h)))) << "f16 0x" << std::hex << h;
    }
}

TEST(CudaMathDtype, EveryBfloat16WidensAsTheReference) {
    for (uint32_t b = 0; b < 65536; ++b) {
        const float got = m::bf16_bits_to_f32(static_cast<uint16_t>(b));
        const float ref = kvc::ref::bf16_value(static_cast<uint16_t>(b));
        if (std::isnan(ref)) {
            EXPECT_TRUE(std::isnan(got)) << "bf16 0x" << std::hex << b;
            continue;
        }
        ASSERT_EQ(bits(got), bits(ref)) << "bf16 0x" << std::hex << b;
    }
}

// Narrowing, over a sweep of float bit patterns (every 251st, plus every pattern around the f16 rounding and range
// boundaries): the bits equal Eigen's (round to nearest even), NaN stays a quiet NaN of the same sign.
void check_narrowing(uint32_t x) {
    const float f = from_bits(x);
    const uint16_t h = m::f32_to_f16_bits(f), b = m::f32_to_bf16_bits(f);
    if (std::isnan(f)) {
        ASSERT_EQ(h & 0x7e00u, 0x7e00u) << std::hex << x;
        ASSERT_EQ(b & 0x7fc0u, 0x7fc0u) << std::hex << x;
        ASSERT_EQ(h >> 15, x >> 31);
        ASSERT_EQ(b >> 15, x >> 31);
        return;
    }
    ASSERT_EQ(h, kvc::ref::f16_bits(f)) << "f32 0x" << std::hex << x;
    ASSERT_EQ(b, kvc::ref::bf16_bits(f)) << "f32 0x" << std::hex << x;
    ASSERT_EQ(h, kvc::opt::f32_to_f16(f)) << "f32 0x" << std::hex << x;
    ASSERT_EQ(b, kvc::opt::f32_to_bf16(f)) << "f32 0x" << std::hex << x;
}

TEST(CudaMathDtype, NarrowingEqualsTheReferenceBitForBit) {
    for (uint64_t x = 0; x <= 0xffffffffull; x += 251) check_narrowing(static_cast<uint32_t>(x));
    // every pattern near the boundaries: 2^-25 (rounds to zero or not), 2^-14 (subnormal/normal), 65520 (infinity)
    for (uint32_t sign : {0u, 0x80000000u})
        for (uint32_t edge : {0x33000000u, 0x38800000u, 0x477ff000u, 0x7f800000u})
            for (uint32_t d = 0; d < 4096; ++d) {
                check_narrowing(sign | (edge + d));
                check_narrowing(sign | (edge - d));
            }
}

TEST(CudaMathDtype, StoreAndLoadRoundTripThroughTheCacheElement) {
    const uint64_t seed = test_seed(20261130);
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (int i = 0; i < 100000; ++i) {
        const float x = dist(gen);
        for (uint32_t dt : {0u, 1u, 2u}) {
            uint8_t slot[4] = {};
            m::store_elem(x, dt, slot);
            ASSERT_EQ(bits(m::load_elem(slot, dt)), bits(kvc::ref::round_to_dtype(x, dt))) << x << " dtype " << dt;
        }
    }
}

// The CUDA kernel's 16-byte staging: four words widened in address order equal the elements loaded one by one.
TEST(CudaMathDtype, SixteenBytePiecesWidenAsTheirElements) {
    const uint64_t seed = test_seed(20261204);
    std::mt19937_64 gen(seed);
    for (int i = 0; i < 100000; ++i) {
        uint8_t bytes[16];
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(gen());
        uint32_t w[4];
        std::memcpy(w, bytes, sizeof w); // what a 16-byte load gives, on this little-endian host as on the device
        for (uint32_t dt : {0u, 1u, 2u}) {
            const uint32_t es = dt == 0 ? 4 : 2;
            float wide[8] = {};
            m::widen_words(w, dt, wide);
            for (uint32_t e = 0; e < 16 / es; ++e)
                ASSERT_EQ(bits(wide[e]), bits(m::load_elem(bytes + e * es, dt))) << "dtype " << dt << " element " << e;
        }
    }
}

// ---- RoPE ----

TEST(CudaMathRope, InverseFrequenciesAreTheReferenceExpressionRoundedToDouble) {
    for (float theta : {10000.0f, 500000.0f, 1.5f})
        for (uint32_t d : {2u, 16u, 128u, 256u})
            for (uint32_t j = 0; j < d / 2; ++j) {
                const long double ref = std::pow(static_cast<long double>(static_cast<double>(theta)),
                                                 -2.0L * static_cast<int>(j) / static_cast<int>(d));
                EXPECT_EQ(m::rope_inv_freq(theta, d, j), static_cast<double>(ref)) << theta << " " << d << " " << j;
            }
}

// The device path (double angles) rotates every element to within one ulp of the reference (long double), and
// to the same float as the CPU engine (long double angles, double rotation) in all but rare ties.
TEST(CudaMathRope, RotationMatchesTheReferenceAndTheCpuEngine) {
    const uint64_t seed = test_seed(20261130);
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    int64_t worst_ref = 0, worst_cpu = 0, differ_cpu = 0, total = 0;
    for (uint32_t variant : {m::kRopeNeox, m::kRopeGptj})
        for (float theta : {10000.0f, 500000.0f})
            for (uint32_t d : {2u, 8u, 64u, 128u, 256u})
                for (uint64_t pos : {0ull, 1ull, 2ull, 7ull, 255ull, 256ull, 1023ull, 4095ull, 65535ull, 1000003ull,
                                     16777219ull}) {
                    std::vector<float> x(d);
                    for (float& e : x) e = dist(gen);
                    // the device path, as append_kernel and attend_kernel run it
                    std::vector<float> dev = x;
                    for (uint32_t j = 0; j < d / 2; ++j) {
                        uint32_t a, b;
                        m::rope_pair(variant, d, j, &a, &b);
                        double c, s;
                        m::rope_cos_sin(pos, m::rope_inv_freq(theta, d, j), &c, &s);
                        m::rope_rotate(&dev[a], &dev[b], c, s);
                    }
                    // the reference in long double, rounded once
                    std::vector<long double> ref(x.begin(), x.end());
                    kvc::ref::apply_rope<long double>(ref.data(), static_cast<int>(d), static_cast<long>(pos),
                                                      variant == m::kRopeNeox ? kvc::ref::Rope::NeoX
                                                                              : kvc::ref::Rope::GptJ,
                                                      theta);
                    // the CPU engine
                    kvc::opt::Rope cpu_rope(variant, theta, d);
                    std::vector<double> cs(d);
                    cpu_rope.angles(pos, cs.data());
                    std::vector<float> cpu = x;
                    cpu_rope.apply(cpu.data(), cs.data());
                    for (uint32_t c = 0; c < d; ++c, ++total) {
                        const int64_t ur = ulps(dev[c], static_cast<float>(ref[c]));
                        const int64_t uc = ulps(dev[c], cpu[c]);
                        worst_ref = std::max(worst_ref, ur);
                        worst_cpu = std::max(worst_cpu, uc);
                        differ_cpu += uc != 0;
                        ASSERT_LE(ur, 1) << "variant " << variant << " d " << d << " pos " << pos << " elem " << c;
                        ASSERT_LE(uc, 1) << "variant " << variant << " d " << d << " pos " << pos << " elem " << c;
                    }
                }
    std::cout << "[ rope     ] " << total << " elements: worst " << worst_ref << " ulp from the reference, "
              << worst_cpu << " ulp from the CPU engine, " << differ_cpu << " differ from the CPU engine\n";
    EXPECT_LE(differ_cpu * 1000, total) << "more than 0.1 % of rotated elements differ from the CPU engine";
}

TEST(CudaMathRope, PairsAreNeoxHalvesAndGptjNeighbours) {
    uint32_t a, b;
    m::rope_pair(m::kRopeNeox, 8, 3, &a, &b);
    EXPECT_EQ(a, 3u);
    EXPECT_EQ(b, 7u);
    m::rope_pair(m::kRopeGptj, 8, 3, &a, &b);
    EXPECT_EQ(a, 6u);
    EXPECT_EQ(b, 7u);
}

// ---- online softmax, element by element (how the kernels hold o spread over threads) ----

// One split's exact state, in the kernel's order (scores, max, p and sum, o), for keys [k0, k1).
void split_state(const std::vector<float>& s, const std::vector<float>& v, uint32_t d, uint32_t k0, uint32_t k1,
                 float* mm, float* l, float* o) {
    *mm = -INFINITY;
    *l = 0.0f;
    for (uint32_t c = 0; c < d; ++c) o[c] = 0.0f;
    if (k0 >= k1) return;
    for (uint32_t j = k0; j < k1; ++j) *mm = std::max(*mm, s[j]);
    for (uint32_t j = k0; j < k1; ++j) {
        const float p = std::exp(s[j] - *mm);
        *l = *l + p;
        for (uint32_t c = 0; c < d; ++c) o[c] = o[c] + p * v[j * d + c];
    }
}

TEST(CudaMathSoftmax, FoldedSplitsEqualTheReferenceSoftmax) {
    const uint64_t seed = test_seed(20261130);
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const uint32_t d = 16;
    for (uint32_t n : {1u, 5u, 255u, 256u, 257u, 1023u, 1024u, 1025u, 3000u}) {
        std::vector<float> s(n), v(static_cast<size_t>(n) * d);
        for (float& x : s) x = dist(gen) * 3.0f;
        for (float& x : v) x = dist(gen);
        // the kernel's structure: splits of 256 in segments of 1024, both folded left to right, element-wise merge
        float tm = -INFINITY, tl = 0.0f;
        std::vector<float> to(d, 0.0f);
        for (uint32_t sg0 = 0; sg0 < n; sg0 += 1024) {
            float gm = -INFINITY, gl = 0.0f;
            std::vector<float> go(d, 0.0f), so(d);
            for (uint32_t k0 = sg0; k0 < std::min(n, sg0 + 1024); k0 += 256) {
                float sm, sl;
                split_state(s, v, d, k0, std::min(n, k0 + 256), &sm, &sl, so.data());
                const kvc::opt::MergeScales sc = kvc::opt::merge_scales(gm, sm);
                for (uint32_t c = 0; c < d; ++c) go[c] = kvc::opt::merge_apply(sc, go[c], so[c]);
                gl = kvc::opt::merge_apply(sc, gl, sl);
                gm = kvc::opt::merge_max(sc, gm, sm);
            }
            const kvc::opt::MergeScales sc = kvc::opt::merge_scales(tm, gm);
            for (uint32_t c = 0; c < d; ++c) to[c] = kvc::opt::merge_apply(sc, to[c], go[c]);
            tl = kvc::opt::merge_apply(sc, tl, gl);
            tm = kvc::opt::merge_max(sc, tm, gm);
        }
        // the reference: softmax(s) . v in long double
        long double ref_m = -INFINITY, ref_l = 0.0L;
        for (float x : s) ref_m = std::max<long double>(ref_m, x);
        std::vector<long double> ref(d, 0.0L);
        for (uint32_t j = 0; j < n; ++j) {
            const long double p = std::exp(static_cast<long double>(s[j]) - ref_m);
            ref_l += p;
            for (uint32_t c = 0; c < d; ++c) ref[c] += p * v[j * d + c];
        }
        for (uint32_t c = 0; c < d; ++c) {
            const long double want = ref[c] / ref_l;
            const float got = kvc::opt::normalize_elem(tm, tl, to[c]);
            EXPECT_LE(std::fabs(static_cast<long double>(got) - want), 5e-6L + 1e-5L * std::fabs(want))
                << "n " << n << " elem " << c;
        }
    }
}

TEST(CudaMathSoftmax, EmptyStatesAreExactNoOpsAndNeverNaN) {
    const float o = 0.375f;
    kvc::opt::MergeScales s = kvc::opt::merge_scales(2.0f, -INFINITY); // from empty: keep into, bit for bit
    EXPECT_EQ(bits(kvc::opt::merge_apply(s, o, NAN)), bits(o));
    EXPECT_EQ(kvc::opt::merge_max(s, 2.0f, -INFINITY), 2.0f);
    s = kvc::opt::merge_scales(-INFINITY, 1.5f); // into empty: copy from
    EXPECT_EQ(bits(kvc::opt::merge_apply(s, 0.0f, o)), bits(o));
    EXPECT_EQ(kvc::opt::merge_max(s, -INFINITY, 1.5f), 1.5f);
    s = kvc::opt::merge_scales(-INFINITY, -INFINITY); // both empty: stays empty, no exp(-inf - -inf)
    EXPECT_FALSE(std::isnan(kvc::opt::merge_apply(s, 0.0f, 0.0f)));
    EXPECT_EQ(kvc::opt::merge_max(s, -INFINITY, -INFINITY), -INFINITY);
    EXPECT_EQ(kvc::opt::normalize_elem(-INFINITY, 0.0f, 0.0f), 0.0f);
    s = kvc::opt::merge_scales(1.0f, 3.0f); // the side with the max gets exactly 1
    EXPECT_EQ(s.b, 1.0f);
    EXPECT_EQ(s.m, 3.0f);
    EXPECT_EQ(bits(s.a), bits(std::exp(-2.0f)));
}

// The element-wise merge the kernels run equals the CPU engine's row merge (state_merge) bit for bit.
TEST(CudaMathSoftmax, ElementWiseMergeEqualsTheCpuEnginesRowMerge) {
    const uint64_t seed = test_seed(20261130);
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    for (int i = 0; i < 1000; ++i) {
        float ao[8], bo[8], eo[8];
        for (int c = 0; c < 8; ++c) {
            ao[c] = dist(gen);
            bo[c] = dist(gen);
            eo[c] = ao[c];
        }
        kvc::opt::SoftmaxState a{i % 7 == 0 ? -INFINITY : dist(gen), std::fabs(dist(gen)), ao};
        const kvc::opt::SoftmaxState b{i % 5 == 0 ? -INFINITY : dist(gen), std::fabs(dist(gen)), bo};
        const kvc::opt::MergeScales sc = kvc::opt::merge_scales(a.m, b.m);
        float el = kvc::opt::merge_apply(sc, a.l, b.l), em = kvc::opt::merge_max(sc, a.m, b.m);
        for (int c = 0; c < 8; ++c) eo[c] = kvc::opt::merge_apply(sc, eo[c], bo[c]);
        kvc::opt::state_merge(a, b, 8);
        ASSERT_EQ(bits(a.m), bits(em));
        ASSERT_EQ(bits(a.l), bits(el));
        for (int c = 0; c < 8; ++c) ASSERT_EQ(bits(a.o[c]), bits(eo[c]));
    }
}

// ---- addressing: the device arena's arrangement (block b at base + b * block_bytes) through kvc_kv_address ----

TEST(CudaMathLayout, ArenaAddressesEqualTheDocumentedFormula) {
    const uint32_t B = 7, H = 3, D = 5;
    kvc_kv_layout l = kvc_kv_layout_make(B, H, D, 2);
    const uint64_t bb = kvc_kv_block_bytes(&l);
    EXPECT_EQ(bb, 2ull * H * B * D * 2);
    std::vector<uint8_t> arena(6 * bb);
    std::vector<uint8_t*> base(6);
    for (uint32_t b = 0; b < 6; ++b) base[b] = arena.data() + b * bb;
    l.block_base = base.data();
    const uint32_t table[] = {4, 0, 5, 2};
    for (uint64_t pos = 0; pos < 4 * B; ++pos)
        for (uint32_t plane = 0; plane < 2; ++plane)
            for (uint32_t h = 0; h < H; ++h)
                for (uint32_t x = 0; x < D; ++x) {
                    const uint64_t want = table[pos / B] * bb + plane * (H * B * D * 2ull) + h * (B * D * 2ull) +
                                          (pos % B) * (D * 2ull) + x * 2ull;
                    ASSERT_EQ(static_cast<uint64_t>(kvc_kv_address(&l, table, pos, plane, h, x) - arena.data()), want);
                }
}

} // namespace
