// The engine's own quantizers and dequantizers for the quantized cache dtypes: fp8 E4M3FN / E5M2 with a scale,
// int8 per token per KV head, llama.cpp's q8_0. The formats are docs/quantized.md's (the contract in
// reference/include/kvcheck/reference/quantize.hpp); this is an independent implementation at the bit level, and
// tests/engine/test_quantize.cpp proves it bitwise equal to kvc::ref's. A stored row is its head_dim codes, then
// its scales (kv_layout.h: scale_bytes): none for fp8, one f32 or f16 for int8, head_dim / 32 f16 for q8_0.
#pragma once

#include "kvcheck/abi.h"

#include <cstdint>

namespace kvc::opt {

// How one head row of a quantized dtype is stored.
struct QuantFormat {
    uint32_t dtype = 0; // a quantized kvc_dtype
    uint32_t head_dim = 0;
    bool f16_scale = false; // INT8_TOKEN: its scale kept in f16 (else f32)
};

constexpr uint32_t kQ8Block = 32; // values per q8_0 scale

// Scale bytes stored after a row's codes.
uint32_t row_scale_bytes(const QuantFormat& f);

// fp8, saturating (SATFINITE), round to nearest even, NaN kept with its sign.
uint8_t fp8_e4m3_encode(float x);
uint8_t fp8_e5m2_encode(float x);
// Exact. NaN codes decode to NaN.
float fp8_e4m3_decode(uint8_t code);
float fp8_e5m2_decode(uint8_t code);

// The x86 kernels' direct path over an fp8 cache (attention_kernel_x86.hpp) reads each code as decode(code) / fold,
// exactly (E4M3FN: its fields in an f16, 2^-8 times its value; E5M2: an f16's high byte, fold 1), and applies the
// fold with the scales once per head, FlashInfer's way: scores are dot(q, code values) times
// softmax scale * k_scale * fold, and a split's V sum is multiplied by v_scale * fold. Each product is rounded once
// in f32, which moves a score or an output by at most about one f32 ulp against dequantizing every element first (the
// tolerance's f32 dot-product term is min(d, 6 sqrt d) ulps: docs/tolerance.md).
constexpr float kFp8FoldE4M3 = 256.0f;
inline float fp8_fold(uint32_t dtype) { return dtype == KVC_DTYPE_FP8_E4M3 ? kFp8FoldE4M3 : 1.0f; }
inline float fp8_fused_k_scale(uint32_t dtype, float softmax_scale, float k_scale) {
    return softmax_scale * k_scale * fp8_fold(dtype);
}
inline float fp8_fused_v_scale(uint32_t dtype, float v_scale) { return v_scale * fp8_fold(dtype); }
// Whether every fused scale of an fp8 cache is a normal f32 (n scales of K and of V), so that the fused path stays
// within an ulp of the exact one; otherwise (scales near the ends of the f32 range) the kernels dequantize exactly.
bool fp8_scales_fuse(uint32_t dtype, float softmax_scale, const float* k_scales, const float* v_scales, uint64_t n);

// Why x [head_dim] cannot be stored (int8 and q8_0 take finite values only, and an int8 f16 scale must not
// overflow), or nullptr when it can. fp8 stores anything (saturation; NaN stays NaN).
const char* unquantizable(const float* x, const QuantFormat& f);

// x [head_dim] -> the row's codes and scales at dst. fp8_scale: the scale of the row's (layer, KV head), fp8 only.
void quantize_row(const float* x, const QuantFormat& f, float fp8_scale, uint8_t* dst);
// A stored row -> head_dim floats, each decode(code) * its scale rounded once in f32 (what the reference's
// dequantizers give).
void dequantize_row(const uint8_t* src, const QuantFormat& f, float fp8_scale, float* out);
// The scales of a stored row as read_kv_scales returns them: fp8 one f32 (fp8_scale), int8 its f32 or f16 bits,
// q8_0 head_dim / 32 f16 bits.
void row_scales(const uint8_t* src, const QuantFormat& f, float fp8_scale, uint8_t* out);
// Bytes row_scales writes.
uint32_t row_scales_bytes(const QuantFormat& f);

} // namespace kvc::opt
