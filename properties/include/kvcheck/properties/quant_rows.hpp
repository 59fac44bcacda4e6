// The stored form of one head row of a quantized cache (ABI 1.2, docs/quantized.md), as the harness models it with
// the reference quantizers (reference/quantize.hpp), the one source of truth for codes and scales:
//   codes   head_dim bytes, what read_kv returns (fp8 codes, int8 codes as two's complement bytes)
//   scales  the bytes read_kv_scales returns for the row: fp8 1 f32 (the config's scale), INT8_TOKEN 1 f32 or f16,
//           Q8_0 head_dim / 32 f16, block by block
// and the values an oracle attends: the row dequantized from its codes and scales.
#pragma once

#include "kvcheck/properties/case.hpp"
#include "kvcheck/reference/quantize.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvc::prop {

// The reference's rounding of q8_0 codes for a declared flag (CaseConfig::q8_0_rounding, Pipeline::q8_0_rounding):
// 0 GgmlRef, KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN RecipAmaxEven, KVC_PIPELINE_Q8_0_RECIP_D_EVEN RecipDEven.
ref::Q8_0Rounding q8_0_rounding(uint32_t flag);

// Bytes of the scales stored with one head row (read_kv_scales): scales_per_head_row * scale_size.
size_t scale_bytes_per_head_row(const CaseConfig& cfg);

// x [head_dim] -> codes [head_dim], scales [scale_bytes_per_head_row]. fp8_scale: the config's scale of the row's
// tensor, layer and KV head (CaseConfig::fp8_scale); ignored for int8 and q8_0. q8_0 codes are rounded as
// cfg.q8_0_rounding declares.
void quantize_head_row(const CaseConfig& cfg, float fp8_scale, const float* x, uint8_t* codes, uint8_t* scales);

// codes, scales -> out [head_dim], as the reference dequantizes.
void dequantize_head_row(const CaseConfig& cfg, const uint8_t* codes, const uint8_t* scales, float* out);

// Whether codes and scales are what the reference quantizer gives for SOME x with lo[i] <= x[i] <= hi[i]: how a key
// the implementation rotated itself is judged (docs/conformance.md, CACHE-CONTENT). Each quantizer is monotone, so
//   fp8    the stored scale is the config's, and each code lies between encode(lo / s) and encode(hi / s);
//   int8   the stored scale lies between the kept scales of the smallest and largest absmax the intervals allow,
//          and each code between round(lo / s) and round(hi / s) under the row's stored scale s;
//   q8_0   per block: the stored d between the f16 d of those absmax ends, and each code between the roundings of
//          lo * id and hi * id for every id the absmax ends allow: id = 1 / d of the f32 d (ggml's reference, NEON)
//          or 127 / amax (x86), rounded as cfg.q8_0_rounding declares (half away from zero, or ties to even).
// The per-element conditions ignore that one x fixes every code and the scale together: the rule accepts a
// superset of what any rotation inside the intervals stores, so it never rejects a correct cache.
bool quantized_row_acceptable(const CaseConfig& cfg, float fp8_scale, const float* lo, const float* hi,
                              const uint8_t* codes, const uint8_t* scales);

// Equal as stored: codes and scales bitwise, except a q8_0 block whose stored d is zero on both sides (the
// reference writes d = 0 for tiny blocks; every value dequantizes to 0 whatever its codes).
bool quantized_row_equal(const CaseConfig& cfg, const uint8_t* want_codes, const uint8_t* want_scales,
                         const uint8_t* got_codes, const uint8_t* got_scales);

// ---- diagnosis (quant_diagnosis.cpp) ----

// One head row stored unlike the reference, and what is known about it.
struct QuantEvidence {
    const CaseConfig* cfg = nullptr;
    uint32_t which = 1;   // 1: K, 2: V
    uint32_t layer = 0;
    uint32_t kv_head = 0;
    const float* x = nullptr;     // [head_dim] the value quantized (the key rotated by the oracle, or v)
    const uint8_t* want_codes = nullptr;
    const uint8_t* want_scales = nullptr;
    const uint8_t* got_codes = nullptr;
    const uint8_t* got_scales = nullptr;
};

// The first difference and, where it is recognised, the mechanism behind it.
struct QuantFinding {
    bool scale = false;  // a scale differs (else a code)
    uint32_t index = 0;  // the element (code) or the block (q8_0 scale) within the head row
    double expected = 0, actual = 0; // the codes as numbers (fp8: the byte; int8, q8_0: the signed code), or scales
    std::string text;    // "stored code 0x7e where the reference quantizer gives 0x3e: the E4M3FNUZ bias"
};
QuantFinding diagnose_quantized_row(const QuantEvidence& e);

} // namespace kvc::prop
