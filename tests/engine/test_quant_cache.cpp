// Quantized caches in the CPU engine (fp8 E4M3FN / E5M2 under every scale mode, int8 per token with f32 and f16
// scales, q8_0): what read_kv and read_kv_scales return for appended rows is, bitwise, what kvc::ref's quantizers
// give for the rotated rows; every output is within the f32 tolerance of kvc::ref::attend_heads<long double> over the
// DEQUANTIZED rows (the rows as stored, the call's own new rows included); memory is exactly codes + scales; fork and
// release share and copy quantized blocks with their scales; bad configs and rows are refused; and each kernel path
// (portable, AVX2, AVX-512; for fp8 the exact and the fused-scale paths) attends over the same quantized blocks alike
// (AVX2 and AVX-512 bitwise).
#include "engine_test_util.hpp"

#include "attention_kernel.hpp"
#include "kvcheck/optimized/cpu_engine.h"
#include "kvcheck/reference/quantize.hpp"
#include "quantize.hpp"
#include "simd.hpp"

#include <limits>

namespace kvc::test {
namespace {

struct QCase {
    const char* name;
    uint32_t dtype;
    uint32_t scale_mode = KVC_SCALE_NONE;
    bool f16_scale = false;
    float scale_base = 1.0f; // fp8: the config's scales are scale_base * (1 + index / 4) (V: 1.5 + index / 4)
    float v_scale_base = 0;  // fp8: V's base when not scale_base
    float v_sigma = 1.0f;    // spread of the V rows appended
};

const QCase kCases[] = {
    {"e4m3_none", KVC_DTYPE_FP8_E4M3},
    {"e4m3_tensor", KVC_DTYPE_FP8_E4M3, KVC_SCALE_TENSOR, false, 0.02f},
    {"e4m3_kv_head_saturating", KVC_DTYPE_FP8_E4M3, KVC_SCALE_KV_HEAD, false, 0.003f}, // |x| > ~1.3 saturates
    {"e5m2_kv_head", KVC_DTYPE_FP8_E5M2, KVC_SCALE_KV_HEAD, false, 0.5f},
    {"e5m2_none", KVC_DTYPE_FP8_E5M2},
    {"int8_f32", KVC_DTYPE_INT8_TOKEN},
    {"int8_f16", KVC_DTYPE_INT8_TOKEN, KVC_SCALE_NONE, true},
    {"q8_0", KVC_DTYPE_Q8_0},
    // V scales so large that v_scale * 256 overflows: no fused path, every row dequantized exactly (V rows of 1e35:
    // a split sums up to 256 of them unnormalized, and must stay finite)
    {"e4m3_unfused", KVC_DTYPE_FP8_E4M3, KVC_SCALE_KV_HEAD, false, 0.05f, 1.4e36f, 1e35f},
};

// A config of the case with its fp8 scales (kept in `scales` until create() has copied them).
struct QConfig {
    kvc_config c;
    std::vector<float> k_scales, v_scales;
    QConfig(const QCase& q, uint32_t n_q, uint32_t n_kv, uint32_t d, uint32_t block, uint32_t rope, uint32_t layers = 1) {
        c = make_config(n_q, n_kv, d, q.dtype, block, rope, layers);
        c.kv_scale_mode = q.scale_mode;
        c.int8_scale_dtype = q.f16_scale ? KVC_DTYPE_F16 : KVC_DTYPE_F32;
        const uint32_t n = q.scale_mode == KVC_SCALE_KV_HEAD ? layers * n_kv : layers;
        for (uint32_t i = 0; i < n && q.scale_mode != KVC_SCALE_NONE; ++i) {
            k_scales.push_back(q.scale_base * (1.0f + 0.25f * static_cast<float>(i)));
            v_scales.push_back((q.v_scale_base != 0 ? q.v_scale_base : q.scale_base) * (1.5f + 0.25f * static_cast<float>(i)));
        }
        c.k_scales = k_scales.empty() ? nullptr : k_scales.data();
        c.v_scales = v_scales.empty() ? nullptr : v_scales.data();
    }
    float fp8_scale(bool k, uint32_t layer, uint32_t h) const {
        const auto& s = k ? k_scales : v_scales;
        if (c.kv_scale_mode == KVC_SCALE_NONE) return 1.0f;
        return s[c.kv_scale_mode == KVC_SCALE_KV_HEAD ? layer * c.n_kv_heads + h : layer];
    }
};

// What the reference quantizers make of one (rotated) head row: the codes, the scales as read_kv_scales returns
// them, the dequantized values.
struct RefRow {
    std::vector<uint8_t> codes, scales;
    std::vector<float> deq;
};

RefRow ref_row(const QConfig& qc, const float* x, bool k, uint32_t layer, uint32_t h) {
    const kvc_config& c = qc.c;
    const int d = static_cast<int>(c.head_dim);
    RefRow r;
    r.codes.resize(d);
    r.deq.resize(d);
    if (kvc::dtype_is_fp8(c.cache_dtype)) {
        const auto f = c.cache_dtype == KVC_DTYPE_FP8_E4M3 ? ref::Fp8::E4M3FN : ref::Fp8::E5M2;
        const float s = qc.fp8_scale(k, layer, h);
        ref::quantize_fp8_row(x, d, s, f, r.codes.data());
        ref::dequantize_fp8_row(r.codes.data(), d, s, f, r.deq.data());
        r.scales.resize(4);
        std::memcpy(r.scales.data(), &s, 4);
    } else if (c.cache_dtype == KVC_DTYPE_INT8_TOKEN) {
        auto* codes = reinterpret_cast<int8_t*>(r.codes.data());
        const bool f16 = c.int8_scale_dtype == KVC_DTYPE_F16;
        const float s = ref::quantize_int8_row(x, d, f16 ? ref::ScaleDtype::F16 : ref::ScaleDtype::F32, codes);
        ref::dequantize_int8_row(codes, d, s, r.deq.data());
        if (f16) {
            const uint16_t b = ref::f16_bits(s);
            r.scales.resize(2);
            std::memcpy(r.scales.data(), &b, 2);
        } else {
            r.scales.resize(4);
            std::memcpy(r.scales.data(), &s, 4);
        }
    } else {
        std::vector<ref::BlockQ8_0> blocks(d / 32);
        ref::quantize_row_q8_0(x, d, blocks.data());
        ref::dequantize_row_q8_0(blocks.data(), d, r.deq.data());
        for (const auto& b : blocks) {
            r.codes.insert(r.codes.end(), reinterpret_cast<const uint8_t*>(b.qs), reinterpret_cast<const uint8_t*>(b.qs) + 32);
            r.scales.push_back(static_cast<uint8_t>(b.d & 0xff));
            r.scales.push_back(static_cast<uint8_t>(b.d >> 8));
        }
        r.codes.erase(r.codes.begin(), r.codes.begin() + d); // the resize above
    }
    return r;
}

// One (sequence, layer) as the reference sees it: codes and scales per row, and the dequantized history the oracle
// attends over.
struct QHistory {
    QHistory(const QConfig& q, uint32_t l) : qc(&q), layer(l), h(q.c) {}
    void add(const std::vector<float>& k, const std::vector<float>& v) {
        const kvc_config& c = qc->c;
        const size_t d = c.head_dim, row = size_t{c.n_kv_heads} * d, n = k.size() / row;
        std::vector<long double> kr(d);
        std::vector<float> kf(d);
        for (size_t t = 0; t < n; ++t, ++h.len)
            for (uint32_t hh = 0; hh < c.n_kv_heads; ++hh) {
                for (size_t i = 0; i < d; ++i) kr[i] = k[t * row + hh * d + i];
                ref::apply_rope(kr.data(), static_cast<int>(d), h.len, static_cast<ref::Rope>(c.rope), c.rope_theta);
                for (size_t i = 0; i < d; ++i) kf[i] = static_cast<float>(kr[i]);
                const RefRow kq = ref_row(*qc, kf.data(), true, layer, hh);
                const RefRow vq = ref_row(*qc, v.data() + t * row + hh * d, false, layer, hh);
                h.K.insert(h.K.end(), kq.deq.begin(), kq.deq.end());
                h.V.insert(h.V.end(), vq.deq.begin(), vq.deq.end());
                k_codes.insert(k_codes.end(), kq.codes.begin(), kq.codes.end());
                v_codes.insert(v_codes.end(), vq.codes.begin(), vq.codes.end());
                k_scales.insert(k_scales.end(), kq.scales.begin(), kq.scales.end());
                v_scales.insert(v_scales.end(), vq.scales.begin(), vq.scales.end());
            }
    }
    const QConfig* qc;
    uint32_t layer;
    History h; // K, V: the dequantized rows
    std::vector<uint8_t> k_codes, v_codes, k_scales, v_scales; // [len][n_kv_heads][...]
};

// read_kv and read_kv_scales of rows pos .. pos + n - 1 equal the reference's, bitwise.
void expect_stored(opt::Engine& e, uint32_t seq, const QHistory& q, uint32_t pos, uint32_t n, const std::string& what) {
    const kvc_config& c = q.qc->c;
    const size_t codes = size_t{c.n_kv_heads} * c.head_dim;
    const size_t scales = size_t{c.n_kv_heads} * kvc::scales_per_head_row(c.cache_dtype, c.head_dim) *
                          kvc::scale_size(c.cache_dtype, c.int8_scale_dtype);
    std::vector<uint8_t> k(n * codes), v(n * codes), ks(n * scales), vs(n * scales);
    ASSERT_EQ(e.read_kv(seq, q.layer, pos, n, k.data(), v.data()), KVC_OK) << e.last_error();
    ASSERT_EQ(e.read_kv_scales(seq, q.layer, pos, n, ks.data(), vs.data()), KVC_OK) << e.last_error();
    auto part = [&](const std::vector<uint8_t>& all, size_t per) {
        return std::vector<uint8_t>(all.begin() + pos * per, all.begin() + (pos + n) * per);
    };
    EXPECT_TRUE(k == part(q.k_codes, codes)) << what << ": K codes differ from the reference quantizer's";
    EXPECT_TRUE(v == part(q.v_codes, codes)) << what << ": V codes differ";
    EXPECT_TRUE(ks == part(q.k_scales, scales)) << what << ": K scales differ";
    EXPECT_TRUE(vs == part(q.v_scales, scales)) << what << ": V scales differ";
}

void expect_memory(opt::Engine& e, const kvc_config& c, uint64_t tokens, uint64_t blocks) {
    kvc_memory m{};
    m.struct_size = sizeof m;
    ASSERT_EQ(e.memory(&m), KVC_OK);
    const uint64_t row = kvc::head_row_bytes(c.cache_dtype, c.head_dim, c.int8_scale_dtype);
    EXPECT_EQ(m.live_bytes, 2 * tokens * c.n_kv_heads * row);
    EXPECT_EQ(m.capacity_bytes, blocks * 2 * c.n_kv_heads * uint64_t{e.block_size()} * row);
    EXPECT_EQ(m.workspace_bytes, kvc::dtype_is_fp8(c.cache_dtype) ? 2 * uint64_t{c.n_layers} * c.n_kv_heads * 4 : 0);
}

class Quant : public ::testing::TestWithParam<QCase> {};

// Prefill, decode and chunks of both plans over GQA 6:2, RoPE, 7-token blocks, two layers; head_dim 40 (a tail
// after whole chunks of 8) where the dtype allows, 64 for q8_0.
void drive(const QCase& qcase, const opt::EngineOptions& o, uint64_t seed) {
    const uint32_t d = qcase.dtype == KVC_DTYPE_Q8_0 ? 64 : 40;
    QConfig qc(qcase, 6, 2, d, 7, KVC_ROPE_NEOX, 2);
    auto e = make_engine(qc.c, o);
    ASSERT_TRUE(e);
    // the config's arrays are the caller's: the engine must have copied them
    std::fill(qc.k_scales.begin(), qc.k_scales.end(), NAN);
    QConfig fresh(qcase, 6, 2, d, 7, KVC_ROPE_NEOX, 2);
    Rng rng(seed);
    std::vector<QHistory> hist{QHistory(fresh, 0), QHistory(fresh, 1)};
    const size_t qrow = size_t{6} * d, kvrow = size_t{2} * d;
    uint64_t tokens = 0;
    for (int chunk : {20, 1, 1, 3, 17, 1, 4, 5, 300, 1, 2}) {
        for (uint32_t layer = 0; layer < 2; ++layer) {
            const auto n = static_cast<uint32_t>(chunk);
            const auto q = rng.normal(n * qrow), k = rng.normal(n * kvrow), v = rng.normal(n * kvrow, qcase.v_sigma);
            std::vector<float> out(n * qrow, -7.0f);
            const uint32_t before = static_cast<uint32_t>(hist[layer].h.len);
            ASSERT_EQ(e->append_attend(0, layer, n, q.data(), k.data(), v.data(), out.data()), KVC_OK) << e->last_error();
            hist[layer].add(k, v);
            tokens += n;
            const std::string what = std::string(qcase.name) + ", layer " + std::to_string(layer) + ", " +
                                     std::to_string(hist[layer].h.len) + " tokens";
            expect_stored(*e, 0, hist[layer], before, n, what);
            std::vector<double> want = oracle(hist[layer].h, q);
            for (size_t i = 0; i < out.size(); ++i) { // unit scale for the tolerance (V rows of spread v_sigma)
                out[i] /= qcase.v_sigma;
                want[i] /= qcase.v_sigma;
            }
            expect_close(out, want, what);
            if (::testing::Test::HasFailure()) return;
        }
    }
    const uint64_t len = static_cast<uint64_t>(hist[0].h.len);
    expect_memory(*e, fresh.c, tokens, 2 * ((len + 6) / 7));
}

TEST_P(Quant, StoresTheReferenceCodesAndAttendsOverThemSimd) { drive(GetParam(), {}, test_seed(3910)); }

TEST_P(Quant, PortableKernelAttendsOverTheSameCodes) {
    opt::EngineOptions o;
    o.simd = false;
    drive(GetParam(), o, test_seed(3911));
}

TEST_P(Quant, SealedPoisonedSingleThreaded) {
    opt::EngineOptions o;
    o.seal_full_blocks = true;
    o.poison_unused = true;
    o.threads = 1;
    drive(GetParam(), o, test_seed(3912));
}

// Fork inside a partly filled block, then both sequences go on: the child's first append copies the shared block
// (codes and scales) before writing; release of the parent leaves the child's rows intact.
TEST_P(Quant, ForkAndReleaseKeepEveryRow) {
    const QCase& qcase = GetParam();
    const uint32_t d = 32;
    QConfig qc(qcase, 4, 2, d, 7, KVC_ROPE_GPTJ);
    auto e = make_engine(qc.c, opt::EngineOptions{true, true});
    ASSERT_TRUE(e);
    Rng rng(test_seed(3913));
    const size_t qrow = size_t{4} * d, kvrow = size_t{2} * d;
    QHistory parent(qc, 0);
    auto step = [&](uint32_t seq, QHistory& h, uint32_t n) {
        const auto q = rng.normal(n * qrow), k = rng.normal(n * kvrow), v = rng.normal(n * kvrow);
        std::vector<float> out(n * qrow);
        ASSERT_EQ(e->append_attend(seq, 0, n, q.data(), k.data(), v.data(), out.data()), KVC_OK) << e->last_error();
        h.add(k, v);
        expect_close(out, oracle(h.h, q), std::string(qcase.name) + " seq " + std::to_string(seq));
    };
    step(0, parent, 10);
    ASSERT_EQ(e->fork(0, 1), KVC_OK);
    QHistory child = parent;
    step(1, child, 3);
    step(0, parent, 2);
    step(1, child, 9);
    expect_stored(*e, 0, parent, 0, 12, "parent");
    expect_stored(*e, 1, child, 0, 22, "child");
    expect_memory(*e, qc.c, 12 + 22, 5); // the shared first block, each its own second, the child's third and fourth
    ASSERT_EQ(e->release(0), KVC_OK);
    expect_stored(*e, 1, child, 0, 22, "child after the parent's release");
    step(1, child, 1);
    expect_memory(*e, qc.c, 23, 4);
}

// The determinism contract holds for quantized caches too: a decode step's output has the same bits however the
// history was chunked, on one thread or all, with the heads of a call walked together or one by one.
TEST_P(Quant, DecodeBitsDoNotDependOnChunkingThreadsOrGrouping) {
    const QCase& qcase = GetParam();
    const uint32_t d = 64;
    QConfig qc(qcase, 8, 2, d, 16, KVC_ROPE_NEOX);
    Rng rng(test_seed(3915));
    const uint32_t total = 600;
    const auto k = rng.normal(size_t{total} * 2 * d), v = rng.normal(size_t{total} * 2 * d, qcase.v_sigma);
    const auto q = rng.normal(size_t{total} * 8 * d);
    auto decode_after = [&](const std::vector<uint32_t>& chunks, const opt::EngineOptions& o) {
        auto e = make_engine(qc.c, o);
        uint32_t at = 0;
        std::vector<float> out;
        for (uint32_t n : chunks) {
            out.assign(size_t{n} * 8 * d, 0.0f);
            EXPECT_EQ(e->append_attend(0, 0, n, q.data() + size_t{at} * 8 * d, k.data() + size_t{at} * 2 * d,
                                       v.data() + size_t{at} * 2 * d, out.data()),
                      KVC_OK);
            at += n;
        }
        return std::vector<float>(out.end() - 8 * d, out.end()); // the last token's outputs
    };
    opt::EngineOptions serial;
    serial.threads = 1;
    serial.group_heads = false;
    const auto a = decode_after({599, 1}, {});
    EXPECT_TRUE(bitwise_equal(a, decode_after({300, 7, 292, 1}, {}))) << qcase.name << ": chunking";
    EXPECT_TRUE(bitwise_equal(a, decode_after({599, 1}, serial))) << qcase.name << ": threads, grouping";
    EXPECT_TRUE(bitwise_equal(a, decode_after({256, 343, 1}, serial))) << qcase.name << ": both";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Quant, ::testing::ValuesIn(kCases), [](const auto& info) { return info.param.name; });

// fp8 keeps NaN (its NaN code), and every path decodes that code to NaN: a head whose V holds one gives NaN outputs
// from that token on, the other heads stay finite. (E4M3FN's NaN code is the one magnitude that needs its own step in
// the kernels' decode. Only V: a NaN score is dropped by the x86 kernels' maximum and exp, for every dtype alike.)
TEST(QuantNaN, Fp8NaNCodesDecodeToNaNOnEveryPath) {
    for (uint32_t dtype : {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2})
        for (bool simd : {true, false})
            {
                const uint32_t d = 48;
                QConfig qc(QCase{"fp8", dtype, KVC_SCALE_KV_HEAD, false, 0.5f}, 4, 2, d, 16, KVC_ROPE_NONE);
                opt::EngineOptions o;
                o.simd = simd;
                auto e = make_engine(qc.c, o);
                Rng rng(test_seed(3916));
                auto k = rng.normal(40 * 2 * d), v = rng.normal(40 * 2 * d);
                v[(17 * 2 + 1) * d + 21] = -std::numeric_limits<float>::quiet_NaN(); // token 17, KV head 1
                const auto q = rng.normal(40 * 4 * d);
                std::vector<float> out(q.size());
                ASSERT_EQ(e->append_attend(0, 0, 40, q.data(), k.data(), v.data(), out.data()), KVC_OK);
                for (uint32_t t = 0; t < 40; ++t)
                    for (uint32_t h = 0; h < 4; ++h)
                        for (uint32_t i = 0; i < d; ++i) {
                            // query heads 2, 3 read KV head 1, whose V element 21 of token 17 is NaN: that output
                            // element is NaN from token 17 on, every other one finite
                            const bool nan_expected = h >= 2 && t >= 17 && i == 21;
                            ASSERT_EQ(std::isnan(out[(t * 4 + h) * d + i]), nan_expected)
                                << kvc::dtype_name(dtype) << (simd ? " simd" : " portable")
                                << ": token " << t << ", head " << h << ", element " << i;
                        }
            }
}

TEST(QuantConfig, RefusalsAndCaps) {
    kvc_status s = KVC_OK;
    std::string err;
    QConfig q8(QCase{"q8_0", KVC_DTYPE_Q8_0}, 2, 2, 40, 16, KVC_ROPE_NONE);
    EXPECT_FALSE(opt::Engine::create(q8.c, {}, &s, &err));
    EXPECT_EQ(s, KVC_ERR_UNSUPPORTED);
    EXPECT_NE(err.find("multiple of 32"), std::string::npos) << err;
    QConfig fp8(QCase{"e4m3", KVC_DTYPE_FP8_E4M3, KVC_SCALE_KV_HEAD, false, 1.0f}, 2, 2, 16, 16, KVC_ROPE_NONE);
    fp8.k_scales[1] = 0.0f;
    EXPECT_FALSE(opt::Engine::create(fp8.c, {}, &s, &err));
    EXPECT_EQ(s, KVC_ERR_INVALID_ARGUMENT) << err;
    QConfig i8(QCase{"int8", KVC_DTYPE_INT8_TOKEN}, 2, 2, 16, 16, KVC_ROPE_NONE);
    i8.c.int8_scale_dtype = KVC_DTYPE_BF16;
    EXPECT_FALSE(opt::Engine::create(i8.c, {}, &s, &err));
    EXPECT_EQ(s, KVC_ERR_UNSUPPORTED) << err;

    // a non-finite int8 row is refused before anything changes
    i8.c.int8_scale_dtype = KVC_DTYPE_F32;
    auto e = make_engine(i8.c);
    ASSERT_TRUE(e);
    std::vector<float> q(32, 0.5f), k(32, 1.0f), v(32, 1.0f), out(32);
    v[20] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(e->append_attend(0, 0, 1, q.data(), k.data(), v.data(), out.data()), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e->last_error()).find("V row"), std::string::npos) << e->last_error();
    uint32_t len = 7;
    ASSERT_EQ(e->seq_length(0, 0, &len), KVC_OK);
    EXPECT_EQ(len, 0u);
    // scales of a 16-bit cache: UNSUPPORTED
    auto f16 = make_engine(make_config(2, 2, 16, KVC_DTYPE_F16, 16));
    EXPECT_EQ(f16->read_kv_scales(0, 0, 0, 0, nullptr, nullptr), KVC_ERR_UNSUPPORTED);

    const kvc_plugin_api* api = kvc_cpu_engine_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    ASSERT_TRUE(api);
    EXPECT_TRUE(KVC_API_HAS(api, read_kv_scales));
    const kvc_caps caps = kvc::query_caps(api);
    for (uint32_t dt : {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2, KVC_DTYPE_INT8_TOKEN, KVC_DTYPE_Q8_0})
        EXPECT_TRUE(caps.dtypes & (1u << dt)) << dt;
    EXPECT_EQ(caps.quant, KVC_QUANT_FP8_SCALE_TENSOR | KVC_QUANT_FP8_SCALE_KV_HEAD | KVC_QUANT_INT8_SCALE_F16);
    EXPECT_EQ(caps.precision, uint32_t{KVC_PRECISION_F32});
}

// The three kernels on the same random quantized blocks: AVX2 and AVX-512 give the same bits (where the CPU has
// them), and each is within a loose bound of the portable kernel.
TEST(QuantKernelPaths, EveryPathAgrees) {
    if (!opt::cpu_has_avx2_f16c()) GTEST_SKIP() << "no AVX2/F16C";
    Rng rng(test_seed(3914));
    const uint32_t dtypes[] = {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2, KVC_DTYPE_INT8_TOKEN, KVC_DTYPE_Q8_0};
    for (int iter = 0; iter < 300; ++iter) {
        const uint32_t dtype = dtypes[rng.below(4)];
        const bool f16_scale = rng.below(2) != 0;
        const uint32_t dims_any[] = {1, 5, 8, 12, 40, 64, 100, 128, 256}, dims_q8[] = {32, 64, 96, 128, 256};
        const uint32_t d = dtype == KVC_DTYPE_Q8_0 ? dims_q8[rng.below(5)] : dims_any[rng.below(9)];
        const uint32_t block = 1 + rng.below(rng.below(2) ? 300 : 40);
        const int n = 1 + static_cast<int>(rng.below(opt::kTileRows));
        const uint32_t nh = 1 + rng.below(opt::max_call_heads(n)), heads = nh + rng.below(2);
        const opt::QuantFormat f{dtype, d, dtype == KVC_DTYPE_INT8_TOKEN && f16_scale};
        kvc_kv_layout l = kvc_kv_layout_make_scaled(block, heads, d, 1, opt::row_scale_bytes(f));
        const uint32_t k0 = opt::kSplitKeys * rng.below(2), last = k0 + 1 + rng.below(opt::kSplitKeys + 30);
        const uint32_t n_blocks = (last + block - 1) / block;
        std::vector<uint8_t> pool(size_t{n_blocks} * kvc_kv_block_bytes(&l));
        std::vector<uint8_t*> bases;
        std::vector<uint32_t> table;
        for (uint32_t b = 0; b < n_blocks; ++b) table.push_back(n_blocks - 1 - b);
        for (uint32_t b = 0; b < n_blocks; ++b) bases.push_back(pool.data() + size_t{b} * kvc_kv_block_bytes(&l));
        l.block_base = bases.data();
        std::vector<float> scales(heads);
        for (float& s : scales) s = 0.05f + 0.1f * static_cast<float>(rng.below(20));
        for (uint32_t b = 0; b < n_blocks; ++b)
            for (uint32_t p = 0; p < 2; ++p)
                for (uint32_t h = 0; h < heads; ++h)
                    for (uint32_t s = 0; s < block; ++s) {
                        const auto x = rng.normal(d);
                        opt::quantize_row(x.data(), f, scales[h], bases[b] + kvc_kv_block_offset(&l, s, p, h, 0));
                    }
        const uint32_t dq = opt::padded_dim(d);
        std::vector<float> q(size_t{nh} * n * dq, 0.0f);
        opt::RowTile tiles[opt::kMaxCallRows];
        // half the cases with a sliding window (each row's own) and sinks
        const uint32_t window = rng.below(2) ? 0 : 1 + rng.below(300), sinks = window ? rng.below(20) : 0;
        for (uint32_t h = 0; h < nh; ++h) {
            tiles[h].n = n;
            for (int r = 0; r < n; ++r) {
                const auto v = rng.normal(d, 3.0f);
                std::copy(v.begin(), v.end(), q.begin() + (size_t{h} * n + r) * dq);
                tiles[h].q[r] = q.data() + (size_t{h} * n + r) * dq;
                const auto back = static_cast<uint32_t>(n - 1 - r); // rows in token order, none before key 0
                tiles[h].limit[r] = last > back ? last - back : 1;
                tiles[h].from[r] = window && tiles[h].limit[r] > window ? tiles[h].limit[r] - window : 0;
                tiles[h].sinks = sinks;
            }
        }
        const opt::SplitArgs args{&l, table.data(), heads - nh, 1.0f / std::sqrt(float(d)), scales.data(),
                                  scales.data()};
        auto run = [&](opt::SplitKernel kernel) {
            std::vector<float> o(size_t{nh} * opt::kTileRows * dq, NAN);
            opt::SoftmaxState st[opt::kMaxCallRows * opt::kTileRows];
            for (uint32_t i = 0; i < nh * opt::kTileRows; ++i) st[i].o = o.data() + size_t{i} * dq;
            kernel(args, nh, tiles, k0, st);
            std::vector<float> flat;
            for (uint32_t h = 0; h < nh; ++h)
                for (int r = 0; r < n; ++r) {
                    const opt::SoftmaxState& s = st[h * opt::kTileRows + r];
                    flat.push_back(s.m);
                    flat.push_back(s.l);
                    flat.insert(flat.end(), s.o, s.o + d);
                }
            return flat;
        };
        const std::string what = "dtype " + std::to_string(dtype) + ", d " + std::to_string(d) + ", block " +
                                 std::to_string(block) + ", rows " + std::to_string(n) + ", heads " +
                                 std::to_string(nh) + ", k0 " + std::to_string(k0) + ", last " + std::to_string(last) +
                                 ", window " + std::to_string(window) + ", sinks " + std::to_string(sinks);
        const auto portable = run(opt::split_kernel_scalar(dtype));
        // fp8: the exact path (dequantized pieces) and the fused one (codes in place, scales per head)
        for (bool fused : {false, true}) {
            if (fused && !kvc::dtype_is_fp8(dtype)) continue;
            const auto avx2 = run(opt::split_kernel_avx2(dtype, fused));
            ASSERT_EQ(portable.size(), avx2.size());
            for (size_t i = 0; i < avx2.size(); ++i)
                if (avx2[i] != portable[i]) { // (an empty split's m is -inf in both)
                    ASSERT_NEAR(avx2[i], portable[i], 1e-4 * (1 + std::abs(portable[i])))
                        << what << (fused ? ", fused" : "") << ", element " << i;
                }
            if (opt::cpu_has_avx512()) {
                ASSERT_TRUE(bitwise_equal(run(opt::split_kernel_avx512(dtype, fused)), avx2)) << what << fused;
            }
        }
    }
}

} // namespace
} // namespace kvc::test
