// Quantized caches (ABI 1.2): the cache model's codes, scales, values and live bytes for every quantized dtype, the
// JSON form of a quantized case, the capabilities it needs, the diagnosis of each bug class by name, and the
// doubles of tests/doubles/quant_cache.cpp end to end: the correct ones pass, each broken one fails its property
// with its mechanism named.
#include "doubles.hpp"
#include "kvcheck/abi.hpp"
#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/output_grade.hpp"
#include "kvcheck/properties/tolerance.hpp"
#include "kvcheck/properties/quant_rows.hpp"
#include "kvcheck/properties/target.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/quantize.hpp"
#include "kvcheck/reference/rope.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

using namespace kvc::prop;
using kvc::dtype_is_fp8;
namespace ref = kvc::ref;

const uint32_t kQuantized[] = {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2, KVC_DTYPE_INT8_TOKEN, KVC_DTYPE_Q8_0};

CaseConfig config(uint32_t dtype, uint32_t head_dim = 64, uint32_t n_kv = 2) {
    CaseConfig c;
    c.n_layers = 2;
    c.n_kv_heads = n_kv;
    c.n_q_heads = 2 * n_kv;
    c.head_dim = head_dim;
    c.cache_dtype = dtype;
    if (dtype_is_fp8(dtype)) {
        c.kv_scale_mode = KVC_SCALE_KV_HEAD;
        for (uint32_t i = 0; i < c.n_layers * n_kv; ++i) {
            c.k_scales.push_back(std::ldexp(1.0f, -4) * (1.0f + 0.37f * static_cast<float>(i)));
            c.v_scales.push_back(0.0123f * (1.0f + 0.5f * static_cast<float>(i)));
        }
    }
    return c;
}

std::vector<float> row_values(uint32_t n, uint32_t seed) {
    std::vector<float> x(n);
    for (uint32_t i = 0; i < n; ++i) x[i] = input_value(seed, 0, 0, 0, 0, 1, i);
    return x;
}

// ---- the model ----

TEST(QuantModel, ExpectedRowsAreTheReferenceQuantizersCodesScalesAndValues) {
    for (uint32_t dt : kQuantized) {
        const CaseConfig c = config(dt);
        const uint32_t d = c.head_dim, R = c.n_kv_heads * d;
        const std::vector<float> k = row_values(R, 1), v = row_values(R, 2);
        const StoredRows r = expected_new_rows(c, 0, 1, k.data(), v.data(), 1);
        ASSERT_EQ(r.k_bits.size(), R) << kvc::dtype_name(dt);
        ASSERT_EQ(r.k_scale_bits.size(), c.n_kv_heads * scale_bytes_per_head_row(c));
        for (uint32_t h = 0; h < c.n_kv_heads; ++h) {
            const float* x = v.data() + h * d;
            const uint8_t* codes = r.v_bits.data() + h * d;
            const uint8_t* sb = r.v_scale_bits.data() + h * scale_bytes_per_head_row(c);
            std::vector<float> want(d);
            if (dtype_is_fp8(dt)) {
                const ref::Fp8 f = dt == KVC_DTYPE_FP8_E5M2 ? ref::Fp8::E5M2 : ref::Fp8::E4M3FN;
                const float s = c.v_scales[1 * c.n_kv_heads + h]; // layer 1, KV head h
                float stored;
                std::memcpy(&stored, sb, 4);
                EXPECT_EQ(stored, s);
                for (uint32_t i = 0; i < d; ++i) EXPECT_EQ(codes[i], ref::encode_fp8_scaled(x[i], s, f));
                ref::dequantize_fp8_row(codes, static_cast<int>(d), s, f, want.data());
            } else if (dt == KVC_DTYPE_INT8_TOKEN) {
                std::vector<int8_t> q(d);
                const float s = ref::quantize_int8_row(x, static_cast<int>(d), ref::ScaleDtype::F32, q.data());
                float stored;
                std::memcpy(&stored, sb, 4);
                EXPECT_EQ(stored, s);
                EXPECT_EQ(std::memcmp(codes, q.data(), d), 0);
                ref::dequantize_int8_row(q.data(), static_cast<int>(d), s, want.data());
            } else {
                std::vector<ref::BlockQ8_0> b(d / 32);
                ref::quantize_row_q8_0(x, static_cast<int>(d), b.data());
                for (size_t i = 0; i < b.size(); ++i) {
                    EXPECT_EQ(std::memcmp(codes + 32 * i, b[i].qs, 32), 0);
                    EXPECT_EQ(std::memcmp(sb + 2 * i, &b[i].d, 2), 0);
                }
                ref::dequantize_row_q8_0(b.data(), static_cast<int>(d), want.data());
            }
            for (uint32_t i = 0; i < d; ++i) EXPECT_EQ(r.v[h * d + i], want[i]) << kvc::dtype_name(dt) << " " << i;
        }
    }
}

TEST(QuantModel, LiveBytesCountTheScalesStoredWithEachRow) {
    const std::vector<std::vector<uint32_t>> lens = {{3, 5}, {0, 7}}; // 15 rows of (seq, layer)
    const uint64_t rows = 15, Hkv = 2, d = 64;
    EXPECT_EQ(live_bytes(config(KVC_DTYPE_FP8_E4M3), lens), 2 * rows * Hkv * d);
    EXPECT_EQ(live_bytes(config(KVC_DTYPE_FP8_E5M2), lens), 2 * rows * Hkv * d);
    EXPECT_EQ(live_bytes(config(KVC_DTYPE_INT8_TOKEN), lens), 2 * rows * Hkv * (d + 4));
    CaseConfig f16 = config(KVC_DTYPE_INT8_TOKEN);
    f16.int8_scale_dtype = KVC_DTYPE_F16;
    EXPECT_EQ(live_bytes(f16, lens), 2 * rows * Hkv * (d + 2));
    EXPECT_EQ(live_bytes(config(KVC_DTYPE_Q8_0), lens), 2 * rows * Hkv * (d + 2 * d / 32));
    EXPECT_NE(std::string(kLiveBytesRule).find("scale bytes"), std::string::npos);
}

// A correct cache's rows are accepted and attended dequantized; a changed code or scale is a mismatch, and a row
// that changes later is caught by first_changed (APPEND-ONLY), scales included.
TEST(QuantModel, StoreAcceptsTheReferenceRowsAndCatchesChangedCodesAndScales) {
    for (uint32_t dt : kQuantized) {
        const CaseConfig c = config(dt);
        const uint32_t R = c.n_kv_heads * c.head_dim;
        const std::vector<float> k = row_values(2 * R, 3), v = row_values(2 * R, 4);
        const StoredRows r = expected_new_rows(c, 0, 2, k.data(), v.data(), 0);
        CacheModel m(c);
        std::string why;
        EXPECT_FALSE(m.store(0, 0, 2, k.data(), v.data(), r.k_bits.data(), r.v_bits.data(), KVC_ROUND_F32,
                             r.k_scale_bits.data(), r.v_scale_bits.data(), &why))
            << kvc::dtype_name(dt) << ": " << why;
        EXPECT_EQ(m.stream(0, 0).v_eff, r.v);
        EXPECT_FALSE(m.first_changed(0, 0, r.k_bits.data(), r.v_bits.data(), r.k_scale_bits.data(),
                                     r.v_scale_bits.data()));
        std::vector<uint8_t> vs = r.v_scale_bits;
        vs.back() ^= 1;
        const auto changed = m.first_changed(0, 0, r.k_bits.data(), r.v_bits.data(), r.k_scale_bits.data(), vs.data());
        ASSERT_TRUE(changed) << kvc::dtype_name(dt);
        EXPECT_EQ(changed->what, "v scale byte");
        std::vector<uint8_t> kb = r.k_bits;
        kb[5] ^= 1;
        CacheModel m2(c);
        const auto bad = m2.store(0, 0, 2, k.data(), v.data(), kb.data(), r.v_bits.data(), KVC_ROUND_F32,
                                  r.k_scale_bits.data(), r.v_scale_bits.data(), &why);
        ASSERT_TRUE(bad) << kvc::dtype_name(dt);
        EXPECT_EQ(bad->what, "k");
        EXPECT_EQ(bad->dim, 5);
        EXPECT_NE(why.find("stored code"), std::string::npos) << why;
    }
}

// RoPE: keys rotated in float by the implementation, then quantized, are accepted (the interval rule), at
// positions far from 0 where the float rotation differs from the exact one.
TEST(QuantModel, KeysRotatedInFloatThenQuantizedAreAccepted) {
    for (uint32_t dt : kQuantized)
        for (uint32_t rope : {KVC_ROPE_NEOX, KVC_ROPE_GPTJ}) {
            CaseConfig c = config(dt);
            c.rope = rope;
            const uint32_t d = c.head_dim, R = c.n_kv_heads * d, n = 40;
            const std::vector<float> k = row_values(n * R, 5), v = row_values(n * R, 6);
            const size_t sb = scale_bytes_per_head_row(c);
            std::vector<uint8_t> kc(n * R), vc(n * R), ks(n * c.n_kv_heads * sb), vs(ks.size());
            for (uint32_t i = 0; i < n; ++i)
                for (uint32_t h = 0; h < c.n_kv_heads; ++h) {
                    std::vector<float> x(k.begin() + i * R + h * d, k.begin() + i * R + h * d + d);
                    ref::apply_rope(x.data(), static_cast<int>(d), 3000 + 97 * i, static_cast<ref::Rope>(rope),
                                    c.rope_theta);
                    const size_t hr = static_cast<size_t>(i) * c.n_kv_heads + h;
                    quantize_head_row(c, c.fp8_scale(1, 0, h), x.data(), kc.data() + hr * d, ks.data() + hr * sb);
                    quantize_head_row(c, c.fp8_scale(2, 0, h), v.data() + i * R + h * d, vc.data() + hr * d,
                                      vs.data() + hr * sb);
                }
            // each row judged at its own position by the rule store() applies (the oracle's interval, then
            // quantized_row_acceptable)
            for (uint32_t i = 0; i < n; ++i) {
                const size_t hr = static_cast<size_t>(i) * c.n_kv_heads;
                // the oracle's interval at the row's position, then the acceptance rule itself
                for (uint32_t h = 0; h < c.n_kv_heads; ++h) {
                    std::vector<float> rotated(R), lo(d), hi(d);
                    expected_rotated_key(c, k.data() + i * R, 3000 + 97 * i, rotated.data());
                    for (uint32_t x = 0; x < d; ++x) {
                        const KeyInterval iv = rotated_key_interval(c, KVC_ROUND_F32, k.data() + i * R,
                                                                    3000 + 97 * i, h * d + x, rotated[h * d + x]);
                        lo[x] = iv.lo;
                        hi[x] = iv.hi;
                    }
                    EXPECT_TRUE(quantized_row_acceptable(c, c.fp8_scale(1, 0, h), lo.data(), hi.data(),
                                                         kc.data() + (hr + h) * d, ks.data() + (hr + h) * sb))
                        << kvc::dtype_name(dt) << " rope " << rope << " row " << i << " head " << h;
                }
            }
        }
}

// The informative loss travels with a case result (the case processes send results as JSON), only when measured.
TEST(QuantPipeline, TheQuantizationLossRoundTripsThroughACaseResult) {
    CaseResult r;
    r.id = "EQUIV/3";
    r.property = "EQUIV";
    EXPECT_FALSE(to_json(r).contains("quantization_loss"));
    EXPECT_EQ(case_result_from_json(to_json(r)).quant_loss, -1.0);
    r.quant_loss = 0.0123;
    EXPECT_EQ(case_result_from_json(to_json(r)).quant_loss, 0.0123);
}

// ---- the declared fp8 query (pipeline.q = KVC_ROUND_FP8_*) ----

TEST(QuantPipeline, AnFp8QueryIsRoundedExactlyByTheReferenceEncoder) {
    Pipeline p;
    const std::vector<float> q = {0.3f, -1000.0f, 1e-6f, 17.3f, -0.0f, 500.0f};
    EXPECT_EQ(queries_as_rounded(p, q.data(), q.size()), q); // f32: as given
    p.q = KVC_ROUND_FP8_E4M3;
    const std::vector<float> r = queries_as_rounded(p, q.data(), q.size());
    for (size_t i = 0; i < q.size(); ++i)
        EXPECT_EQ(r[i], ref::decode_fp8(ref::encode_fp8(q[i], ref::Fp8::E4M3FN), ref::Fp8::E4M3FN));
    EXPECT_EQ(r[1], -448.0f); // saturating
    EXPECT_EQ(r[5], 448.0f);
    p.q = KVC_ROUND_FP8_E5M2;
    EXPECT_EQ(queries_as_rounded(p, q.data(), q.size())[1], -1024.0f);
    // the declaration: fp8 only for q, in the ABI and in JSON
    kvc_caps caps{};
    caps.struct_size = sizeof caps;
    caps.pipeline.flags = KVC_PIPELINE_DECLARED;
    caps.pipeline.q = KVC_ROUND_FP8_E5M2;
    EXPECT_EQ(declared_pipeline(caps).q, uint32_t{KVC_ROUND_FP8_E5M2});
    EXPECT_EQ(pipeline_from_json(nlohmann::json{{"q", "fp8_e4m3"}}).q, uint32_t{KVC_ROUND_FP8_E4M3});
    EXPECT_THROW(pipeline_from_json(nlohmann::json{{"accum", "fp8_e4m3"}}), std::invalid_argument);
    EXPECT_EQ(to_json(pipeline_from_json(to_json(declared_pipeline(caps)))), to_json(declared_pipeline(caps)));
    // no tolerance is added for it: the bound equals the f32 pipeline's on the same expectation
    const CaseConfig c = config(KVC_DTYPE_FP8_E4M3, 8, 1);
    const std::vector<float> qq = row_values(2 * 8, 9), k = row_values(8, 10), v = row_values(8, 11);
    const Expected e = expect_outputs(c, qq.data(), 1, k, v, 1);
    Pipeline f32, fp8;
    fp8.q = KVC_ROUND_FP8_E4M3;
    EXPECT_EQ(allowed_errors(c, f32, e), allowed_errors(c, fp8, e));
}

// ---- the case: JSON, validation, capabilities ----

Case quantized_case(uint32_t dt) {
    Case c;
    c.cfg = config(dt);
    if (dt == KVC_DTYPE_INT8_TOKEN) c.cfg.int8_scale_dtype = KVC_DTYPE_F16;
    if (dtype_is_fp8(dt)) c.cfg.k_scales[1] = 0x1p-9f * 1.1f; // not a short decimal
    Op op;
    op.appends.push_back({0, 3, false});
    c.ops.push_back(op);
    c.data_seed = 7;
    return c;
}

TEST(QuantCase, JsonRoundTripIsExact) {
    for (uint32_t dt : kQuantized) {
        const Case c = quantized_case(dt);
        const Case back = case_from_json(nlohmann::json::parse(to_json(c).dump()));
        EXPECT_EQ(back.cfg.cache_dtype, dt);
        EXPECT_EQ(back.cfg.kv_scale_mode, c.cfg.kv_scale_mode);
        EXPECT_EQ(back.cfg.int8_scale_dtype, c.cfg.int8_scale_dtype);
        // bit for bit (an empty vector's data() may be null: memcmp must not see it, even for 0 bytes)
        const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
            return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
        };
        EXPECT_TRUE(same_bits(back.cfg.k_scales, c.cfg.k_scales));
        EXPECT_TRUE(same_bits(back.cfg.v_scales, c.cfg.v_scales));
        EXPECT_EQ(to_json(back), to_json(c));
        EXPECT_NE(describe(c).find(kvc::dtype_name(dt)), std::string::npos);
    }
    EXPECT_NE(describe(quantized_case(KVC_DTYPE_FP8_E4M3)).find("k_scales=["), std::string::npos);
    // to_abi points into the case's vectors
    const Case c = quantized_case(KVC_DTYPE_FP8_E5M2);
    const kvc_config a = c.cfg.to_abi();
    EXPECT_EQ(a.k_scales, c.cfg.k_scales.data());
    EXPECT_EQ(a.kv_scale_mode, uint32_t{KVC_SCALE_KV_HEAD});
}

TEST(QuantCase, OldFilesLoadAndBadQuantizationIsRefused) {
    nlohmann::json j = to_json(quantized_case(KVC_DTYPE_FP8_E4M3));
    nlohmann::json old = j;
    old["config"].erase("kv_scale_mode");
    old["config"].erase("k_scales");
    old["config"].erase("v_scales");
    const Case o = case_from_json(old); // a file from before ABI 1.2's fields: no scales
    EXPECT_EQ(o.cfg.kv_scale_mode, uint32_t{KVC_SCALE_NONE});
    EXPECT_TRUE(o.cfg.k_scales.empty());
    // a 16-bit case's JSON carries none of the new fields
    Case plain = quantized_case(KVC_DTYPE_FP8_E4M3);
    plain.cfg = CaseConfig{};
    EXPECT_FALSE(to_json(plain)["config"].contains("kv_scale_mode"));
    EXPECT_FALSE(to_json(plain)["config"].contains("int8_scale_dtype"));
    const auto refused = [](nlohmann::json x, const char* what) {
        EXPECT_THROW(case_from_json(x), std::invalid_argument) << what;
    };
    nlohmann::json z = j;
    z["config"]["k_scales"][0] = 0;
    refused(z, "zero scale");
    z = j;
    z["config"]["v_scales"][1] = -1.5;
    refused(z, "negative scale");
    z = j;
    z["config"]["k_scales"].erase(0);
    refused(z, "too few scales");
    z = j;
    z["config"]["k_scales"][0] = "x";
    refused(z, "a string");
    z = j;
    z["config"]["kv_scale_mode"] = "tensor"; // 4 scales where tensor needs 2
    refused(z, "sizes of another mode");
    z = to_json(quantized_case(KVC_DTYPE_Q8_0));
    z["config"]["head_dim"] = 48;
    refused(z, "q8_0 with head_dim 48");
    z = to_json(quantized_case(KVC_DTYPE_INT8_TOKEN));
    z["config"]["int8_scale_dtype"] = "bf16";
    refused(z, "int8 scales in bf16");
    z = to_json(quantized_case(KVC_DTYPE_INT8_TOKEN));
    z["config"]["kv_scale_mode"] = "tensor";
    refused(z, "scales for int8");
}

TEST(QuantCase, RequiredCapsNameTheDtypeAndTheScaleForm) {
    kvc_caps have{};
    have.struct_size = sizeof have;
    have.dtypes = 1u << KVC_DTYPE_FP8_E4M3;
    have.features = KVC_FEATURE_GQA; // the case has 4 query heads on 2 KV heads
    const Case c = quantized_case(KVC_DTYPE_FP8_E4M3);
    const kvc_caps need = required_caps(c);
    EXPECT_EQ(need.quant, uint32_t{KVC_QUANT_FP8_SCALE_KV_HEAD});
    std::vector<std::string> m = missing_caps(need, have); // a plugin whose quant is 0 (ABI 1.0/1.1 read as zeros)
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0], "fp8 scale per kv head");
    have.quant = KVC_QUANT_FP8_SCALE_KV_HEAD;
    EXPECT_TRUE(missing_caps(need, have).empty());
    have.dtypes = 0x7;
    m = missing_caps(need, have);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0], "dtype fp8_e4m3");
    const kvc_caps int8 = required_caps(quantized_case(KVC_DTYPE_INT8_TOKEN));
    EXPECT_EQ(int8.quant, uint32_t{KVC_QUANT_INT8_SCALE_F16});
    EXPECT_EQ(int8.dtypes, 1u << KVC_DTYPE_INT8_TOKEN);
}

// ---- the diagnosis, mechanism by mechanism ----

struct Row {
    CaseConfig cfg;
    std::vector<float> x;
    std::vector<uint8_t> want_c, want_s, got_c, got_s;
    uint32_t which = 1, kv_head = 0;
    QuantFinding diagnose() const {
        QuantEvidence e;
        e.cfg = &cfg;
        e.which = which;
        e.layer = 0;
        e.kv_head = kv_head;
        e.x = x.data();
        e.want_codes = want_c.data();
        e.want_scales = want_s.data();
        e.got_codes = got_c.data();
        e.got_scales = got_s.data();
        return diagnose_quantized_row(e);
    }
};

// A row of `dt` quantized right (want) and with `got_scale` for fp8 (got), x ~ N(0, 1) times `amp`.
Row fp8_row(uint32_t dt, uint32_t which, uint32_t kv_head, float amp = 1.0f) {
    Row r;
    r.cfg = config(dt, 64, 3);
    r.which = which;
    r.kv_head = kv_head;
    r.x = row_values(64, 11);
    for (float& v : r.x) v *= amp;
    r.want_c.resize(64);
    r.want_s.resize(4);
    quantize_head_row(r.cfg, r.cfg.fp8_scale(which, 0, kv_head), r.x.data(), r.want_c.data(), r.want_s.data());
    r.got_c = r.want_c;
    r.got_s = r.want_s;
    return r;
}

using kvc::testing::contains;

TEST(QuantDiagnosis, Fp8Mechanisms) {
    for (uint32_t dt : {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2}) {
        const ref::Fp8 f = dt == KVC_DTYPE_FP8_E5M2 ? ref::Fp8::E5M2 : ref::Fp8::E4M3FN;
        Row r = fp8_row(dt, 2, 1);
        const float s = r.cfg.fp8_scale(2, 0, 1), ks = r.cfg.fp8_scale(1, 0, 1), s0 = r.cfg.fp8_scale(2, 0, 0);
        for (uint32_t i = 0; i < 64; ++i) r.got_c[i] = ref::encode_fp8(r.x[i] / s / s, f);
        contains(r.diagnose().text, "the scale applied twice");
        for (uint32_t i = 0; i < 64; ++i) r.got_c[i] = ref::encode_fp8(r.x[i] / ks, f);
        contains(r.diagnose().text, "k_scale used for V");
        for (uint32_t i = 0; i < 64; ++i) r.got_c[i] = ref::encode_fp8(r.x[i] / s0, f);
        contains(r.diagnose().text, "per-head scale indexed by query head");
        for (uint32_t i = 0; i < 64; ++i) r.got_c[i] = ref::encode_fp8(r.x[i], f);
        contains(r.diagnose().text, "the scale not applied");
    }
    // saturation: values far past 448 (E4M3FN) and 57344 (E5M2) written as NaN / infinity
    Row r = fp8_row(KVC_DTYPE_FP8_E4M3, 1, 0, 100.0f);
    uint32_t i = 0;
    while (r.want_c[i] != 0x7e && r.want_c[i] != 0xfe) ++i;
    r.got_c[i] = r.want_c[i] | 0x01; // 0x7f / 0xff: NaN
    QuantFinding f = r.diagnose();
    contains(f.text, "NaN where the reference saturates to");
    contains(f.text, "448");
    contains(f.text, "stored code 0x");
    Row e5 = fp8_row(KVC_DTYPE_FP8_E5M2, 1, 0, 1e4f);
    e5.cfg.k_scales.assign(e5.cfg.k_scales.size(), 0x1p-4f);
    quantize_head_row(e5.cfg, 0x1p-4f, e5.x.data(), e5.want_c.data(), e5.want_s.data());
    e5.got_c = e5.want_c;
    e5.got_s = e5.want_s;
    i = 0;
    while (e5.want_c[i] != 0x7b && e5.want_c[i] != 0xfb) ++i;
    e5.got_c[i] = static_cast<uint8_t>((e5.want_c[i] & 0x80) | 0x7c); // infinity
    contains(e5.diagnose().text, "an infinity where the reference saturates to");
    // FNUZ: every code the FN code of twice the value
    Row z = fp8_row(KVC_DTYPE_FP8_E4M3, 1, 2);
    const float sz = z.cfg.fp8_scale(1, 0, 2);
    for (uint32_t k = 0; k < 64; ++k) z.got_c[k] = ref::encode_fp8(2.0f * (z.x[k] / sz), ref::Fp8::E4M3FN);
    f = z.diagnose();
    contains(f.text, "the E4M3FNUZ bias");
    contains(f.text, "where the reference quantizer gives 0x");
}

TEST(QuantDiagnosis, Int8AndQ8_0Mechanisms) {
    Row r;
    r.cfg = config(KVC_DTYPE_INT8_TOKEN);
    r.x = row_values(64, 12);
    r.want_c.resize(64);
    r.want_s.resize(4);
    quantize_head_row(r.cfg, 1.0f, r.x.data(), r.want_c.data(), r.want_s.data());
    r.got_c = r.want_c;
    r.got_s = r.want_s;
    float s;
    std::memcpy(&s, r.want_s.data(), 4);
    for (uint32_t i = 0; i < 64; ++i)
        r.got_c[i] = static_cast<uint8_t>(static_cast<int8_t>(std::trunc(r.x[i] / s)));
    contains(r.diagnose().text, "int8 rounded toward zero");

    Row q;
    q.cfg = config(KVC_DTYPE_Q8_0, 128);
    q.x = row_values(128, 13);
    for (uint32_t i = 32; i < 64; ++i) q.x[i] *= 3; // blocks of different magnitudes
    q.want_c.resize(128);
    q.want_s.resize(8);
    quantize_head_row(q.cfg, 1.0f, q.x.data(), q.want_c.data(), q.want_s.data());
    q.got_c = q.want_c;
    q.got_s = q.want_s;
    // block 0 made with block 1's d
    float amax1 = 0;
    for (uint32_t i = 32; i < 64; ++i) amax1 = std::max(amax1, std::fabs(q.x[i]));
    const float d1 = amax1 / 127.0f;
    const uint16_t d1h = ref::f16_bits(d1);
    std::memcpy(q.got_s.data(), &d1h, 2);
    for (uint32_t i = 0; i < 32; ++i) q.got_c[i] = static_cast<uint8_t>(static_cast<int8_t>(std::round(q.x[i] * (1.0f / d1))));
    const QuantFinding f = q.diagnose();
    EXPECT_TRUE(f.scale);
    contains(f.text, "a block scale from the wrong block");
}


// ---- q8_0 as ggml's kernels round it (KVC_PIPELINE_Q8_0_*), and the q8_0 query (pipeline.q = KVC_ROUND_Q8_0) ----

TEST(QuantQ8_0Rounding, TheDeclarationInTheAbiAndInJson) {
    kvc_caps caps{};
    caps.struct_size = sizeof caps;
    caps.pipeline.flags = KVC_PIPELINE_DECLARED | KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN;
    caps.pipeline.q = KVC_ROUND_Q8_0;
    const Pipeline p = declared_pipeline(caps);
    EXPECT_EQ(p.q, uint32_t{KVC_ROUND_Q8_0});
    EXPECT_EQ(p.q8_0_rounding, uint32_t{KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN});
    EXPECT_EQ(to_abi(p).flags, KVC_PIPELINE_DECLARED | KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN);
    const nlohmann::json j = to_json(p);
    EXPECT_EQ(j["q"], "q8_0");
    EXPECT_EQ(j["q8_0_rounding"], "x86");
    EXPECT_EQ(pipeline_from_json(j), p);
    contains(pipeline_name(p), "q=q8_0");
    contains(pipeline_name(p), "q8_0-rounding=x86");
    EXPECT_EQ(pipeline_from_json(nlohmann::json{{"q8_0_rounding", "neon"}}).q8_0_rounding,
              uint32_t{KVC_PIPELINE_Q8_0_RECIP_D_EVEN});
    EXPECT_EQ(pipeline_from_json(nlohmann::json{{"q8_0_rounding", "ref"}}).q8_0_rounding, 0u);
    EXPECT_THROW(pipeline_from_json(nlohmann::json{{"q8_0_rounding", "avx"}}), std::invalid_argument);
    EXPECT_THROW(pipeline_from_json(nlohmann::json{{"accum", "q8_0"}}), std::invalid_argument);
    EXPECT_FALSE(to_json(Pipeline{}).contains("q8_0_rounding")); // absent when none is declared
    // a q8_0 query needs whole blocks per head: cases are drawn (and filtered) with head_dim a multiple of 32
    EXPECT_EQ(head_dim_multiple(caps, false), 32u);
    caps.head_dim_multiple = 48;
    EXPECT_EQ(head_dim_multiple(caps, false), 96u);
    caps.pipeline.q = KVC_ROUND_F32;
    EXPECT_EQ(head_dim_multiple(caps, false), 48u);
}

// A plugin table whose pipeline declares both q8_0 roundings.
void both_roundings_caps(kvc_caps* out) {
    kvc_caps c{};
    c.struct_size = sizeof c;
    c.dtypes = 1u << KVC_DTYPE_F32;
    c.pipeline.flags = KVC_PIPELINE_DECLARED | KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN | KVC_PIPELINE_Q8_0_RECIP_D_EVEN;
    std::memcpy(out, &c, std::min<size_t>(out->struct_size, sizeof c));
}

TEST(QuantQ8_0Rounding, BothFlagsAreRefusedAtLoad) {
    static kvc_plugin_api api = *kvc::testing::load_implementation("example").api;
    api.get_caps = both_roundings_caps;
    const kvc_entry_fn entry = [](uint32_t, uint32_t) -> const kvc_plugin_api* { return &api; };
    try {
        (void)target_from_entry(entry, "both");
        ADD_FAILURE() << "a table declaring both q8_0 roundings was loaded";
    } catch (const LoadError& e) {
        contains(e.what(), "both KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN and KVC_PIPELINE_Q8_0_RECIP_D_EVEN");
    }
}

TEST(QuantQ8_0Rounding, AQ8_0QueryIsRoundedExactlyWithTheDeclaredRounding) {
    std::vector<float> q = row_values(64, 21);
    q[5] = 0.5f * q[0]; // a few exact ties under some reciprocal are not needed: the comparison is bitwise
    for (uint32_t flag : {0u, unsigned{KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN}, unsigned{KVC_PIPELINE_Q8_0_RECIP_D_EVEN}}) {
        Pipeline p;
        p.q = KVC_ROUND_Q8_0;
        p.q8_0_rounding = flag;
        std::vector<ref::BlockQ8_0> b(2);
        ref::quantize_row_q8_0(q.data(), 64, b.data(), q8_0_rounding(flag));
        std::vector<float> want(64);
        ref::dequantize_row_q8_0(b.data(), 64, want.data());
        EXPECT_EQ(queries_as_rounded(p, q.data(), q.size()), want) << q8_0_rounding_name(flag);
    }
    Pipeline p;
    p.q = KVC_ROUND_Q8_0;
    EXPECT_THROW(queries_as_rounded(p, q.data(), 48), std::invalid_argument);
    // no tolerance is added for it
    const CaseConfig c = config(KVC_DTYPE_Q8_0, 32, 1);
    const std::vector<float> qq = row_values(2 * 32, 9), k = row_values(32, 10), v = row_values(32, 11);
    const Expected e = expect_outputs(c, qq.data(), 1, k, v, 1);
    EXPECT_EQ(allowed_errors(c, p, e), allowed_errors(c, Pipeline{}, e));
}

// A block of values with exact ties under x86's 127 / amax: amax 127 gives id 1 exactly, and x = k + 1/2.
std::vector<float> tie_row(uint32_t d) {
    std::vector<float> x = row_values(d, 31);
    for (uint32_t b = 0; b < d / 32; ++b) {
        x[b * 32] = 127.0f;
        for (uint32_t i = 1; i < 32; ++i) x[b * 32 + i] = std::round(x[b * 32 + i] * 30.0f) + 0.5f; // ties
    }
    return x;
}

TEST(QuantQ8_0Rounding, TheExpectedCodesFollowTheDeclaredRoundingAndTheDiagnosisNamesIt) {
    Row r;
    r.cfg = config(KVC_DTYPE_Q8_0, 64);
    r.x = tie_row(64);
    r.want_c.resize(64);
    r.want_s.resize(4);
    quantize_head_row(r.cfg, 1.0f, r.x.data(), r.want_c.data(), r.want_s.data()); // the reference: away from zero
    std::vector<ref::BlockQ8_0> b(2);
    ref::quantize_row_q8_0(r.x.data(), 64, b.data(), ref::Q8_0Rounding::RecipAmaxEven);
    r.got_c.resize(64);
    r.got_s.resize(4);
    for (uint32_t k = 0; k < 2; ++k) {
        std::memcpy(r.got_c.data() + 32 * k, b[k].qs, 32);
        std::memcpy(r.got_s.data() + 2 * k, &b[k].d, 2);
    }
    ASSERT_NE(r.got_c, r.want_c);
    EXPECT_FALSE(quantized_row_equal(r.cfg, r.want_c.data(), r.want_s.data(), r.got_c.data(), r.got_s.data()));
    // undeclared: both kernels reproduce an exact tie (127 / amax = 1 / d = 1 here), both are named
    std::string text = r.diagnose().text;
    contains(text, "ggml's x86 kernel does (x * 127/amax, ties to even): declare KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN");
    contains(text, "KVC_PIPELINE_Q8_0_RECIP_D_EVEN");
    // the RoPE interval rule with the reference's rounding: a tie at a point interval is not x86's code
    EXPECT_FALSE(quantized_row_acceptable(r.cfg, 1.0f, r.x.data(), r.x.data(), r.got_c.data(), r.got_s.data()));
    // declared: the expected codes are x86's, and the interval rule accepts them
    r.cfg.q8_0_rounding = KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN;
    std::vector<uint8_t> c2(64), s2(4);
    quantize_head_row(r.cfg, 1.0f, r.x.data(), c2.data(), s2.data());
    EXPECT_EQ(c2, r.got_c);
    EXPECT_EQ(s2, r.got_s);
    EXPECT_TRUE(quantized_row_acceptable(r.cfg, 1.0f, r.x.data(), r.x.data(), r.got_c.data(), r.got_s.data()));
    EXPECT_FALSE(quantized_row_acceptable(r.cfg, 1.0f, r.x.data(), r.x.data(), r.want_c.data(), r.want_s.data()));
    // declared x86, stored as the reference: the diagnosis says to drop the flag
    Row back = r;
    back.want_c = c2;
    back.want_s = s2;
    back.got_c = r.want_c;
    back.got_s = r.want_s;
    contains(back.diagnose().text, "ggml's reference quantize_row_q8_0_ref");
    contains(back.diagnose().text, "drop the KVC_PIPELINE_Q8_0_* flag");
}

// ---- the doubles, end to end ----

using kvc::testing::first_failure;
using kvc::testing::load_implementation;

TEST(QuantDoubles, CorrectQuantizedCachesPass) {
    for (const char* name : {"double-quant_correct", "double-quant_fused_scale"}) {
        const auto t = load_implementation(name);
        for (const char* id : {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "NO-Q", "MEMORY", "GQA", "FORK", "RELEASE"}) {
            int passed = 0;
            const auto r = first_failure(t, id, 24, &passed);
            EXPECT_FALSE(r.has_value()) << name << " " << id << ": " << (r ? r->reason : "");
            EXPECT_GT(passed, 0) << name << " " << id;
        }
    }
}

// Each bug class fails CACHE-CONTENT with its mechanism named (and EQUIV, which attends the rows as they should be
// stored, names the storage as the cause).
TEST(QuantDoubles, EachStorageBugFailsCacheContentByName) {
    const std::pair<const char*, const char*> cases[] = {
        {"scale_twice", "the scale applied twice"},
        {"k_scale_for_v", "k_scale used for V"},
        {"no_saturation", "where the reference saturates to"},
        {"fnuz", "the E4M3FNUZ bias"},
        {"head_by_query", "per-head scale indexed by query head"},
        {"int8_trunc", "int8 rounded toward zero"},
        {"q8_wrong_block", "a block scale from the wrong block"},
    };
    for (const auto& [name, mechanism] : cases) {
        const auto t = load_implementation(std::string("double-quant_") + name);
        const auto r = first_failure(t, "CACHE-CONTENT", 40);
        ASSERT_TRUE(r.has_value()) << name << " was not caught";
        EXPECT_EQ(r->verdict, Verdict::Fail) << name;
        EXPECT_EQ(r->failed_property, "CACHE-CONTENT") << name;
        contains(r->reason, mechanism);
        const auto e = first_failure(t, "EQUIV", 40);
        ASSERT_TRUE(e.has_value()) << name;
        contains(e->reason, "a storage error");
    }
}

TEST(QuantDoubles, NewRowsAttendedBeforeQuantizationFailEquivByName) {
    const auto t = load_implementation("double-quant_new_rows_raw");
    const auto r = first_failure(t, "EQUIV", 40);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->failed_property, "EQUIV");
    contains(r->reason, "new rows were attended before quantization");
    int passed = 0;
    EXPECT_FALSE(first_failure(t, "CACHE-CONTENT", 20, &passed).has_value());
    EXPECT_GT(passed, 0);
}

} // namespace

namespace {

TEST(QuantDoubles, Q8_0RoundedAsX86PassesOnlyWhenDeclared) {
    const auto t = load_implementation("double-quant_q8_x86");
    for (const char* id : {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY"}) {
        int passed = 0;
        const auto r = first_failure(t, id, 24, &passed);
        EXPECT_FALSE(r.has_value()) << id << ": " << (r ? r->reason : "");
        EXPECT_GT(passed, 0) << id;
    }
    const auto u = load_implementation("double-quant_q8_x86_undeclared");
    const auto r = first_failure(u, "CACHE-CONTENT", 200); // differences are rare: ties, or a reciprocal ulp
    ASSERT_TRUE(r.has_value()) << "x86 rounding undeclared was not caught";
    EXPECT_EQ(r->failed_property, "CACHE-CONTENT");
    contains(r->reason, "declare KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN");
}

TEST(QuantDoubles, AQ8_0QueryPassesEquivOnlyWhenDeclared) {
    const auto t = load_implementation("double-quant_q8_query");
    for (const char* id : {"EQUIV", "CACHE-CONTENT", "GQA"}) {
        int passed = 0;
        const auto r = first_failure(t, id, 24, &passed);
        EXPECT_FALSE(r.has_value()) << id << ": " << (r ? r->reason : "");
        EXPECT_GT(passed, 0) << id;
    }
    const auto u = load_implementation("double-quant_q8_query_undeclared");
    const auto r = first_failure(u, "EQUIV", 40);
    ASSERT_TRUE(r.has_value()) << "a q8_0 query declared f32 was not caught";
    EXPECT_EQ(r->failed_property, "EQUIV");
}

} // namespace
