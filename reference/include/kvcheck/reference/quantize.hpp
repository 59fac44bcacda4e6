// Quantized KV-cache formats, as the reference defines them: fp8 E4M3FN and E5M2, fp8 with an f32 scale, int8
// symmetric per token per KV head, and llama.cpp's q8_0. A quantized cache is judged EXACTLY: the same input must
// give the same stored bytes, so every rounding step below is spelled out and happens once.
//
// Contract
// ========
// fp8 (1 sign bit, then exponent and mantissa fields; code 0x80 is -0):
//
//   format   exp/mant  bias  max finite            specials                       smallest subnormal
//   E4M3FN   4 / 3     7     448   = 0x7e / 0xfe   no infinities; NaN = S.1111.111 2^-9
//   E5M2     5 / 2     15    57344 = 0x7b / 0xfb   +-inf = 0x7c / 0xfc;           2^-16
//                                                  NaN = exponent 11111, mantissa != 0
//
//   encode: the exact f32 value is rounded ONCE to the nearest fp8 value, ties to even (the code with mantissa LSB 0).
//     No intermediate format (f16, bf16) is rounded through: that double rounding moves ties.
//   Out of range: SATURATION, as NVIDIA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) does (cuda_fp8.hpp, CUDA
//     12.2 host path, and PTX cvt.rn.satfinite): any finite x whose rounding would exceed max finite becomes
//     +-max finite (0x7e/0xfe, 0x7b/0xfb), and so does +-infinity. (ml_dtypes' plain astype does NOT saturate: it
//     gives NaN for E4M3FN and inf for E5M2.)
//   NaN: stays NaN, sign kept, as ml_dtypes writes it: E4M3FN 0x7f / 0xff, E5M2 the quiet NaN 0x7e / 0xfe.
//     CUDA's host path writes 0x7f for every NaN input in both formats, sign dropped (E5M2 0x7f is a NaN too), so
//     NaN codes differ between implementations: a checker compares "is NaN", never NaN bits.
//   -0.0 encodes to 0x80; values that round to zero keep their sign (-1e-30 -> 0x80).
//   decode: exact (every fp8 value is an f32). NaN codes decode to a NaN with the code's sign.
//
// fp8 with a scale (per tensor, or per KV head: the caller passes the scale of the head the row belongs to):
//   code = encode(x / scale)        x' = decode(code) * scale
//   Both in f32 exactly as written: x / scale is rounded to f32, then encoded; decode(code) * scale is rounded to
//   f32. An implementation that multiplies by a precomputed 1/scale stores different codes for some x.
//   scale must be finite and > 0 (std::invalid_argument otherwise).
//
// int8 symmetric, per token per KV head (one row = the head_dim values of one head of one token):
//   scale = absmax / 127 computed in f32, then KEPT as declared: in f32, or rounded to f16 (round to nearest even).
//   When kept in f16 the codes are computed with the f16-rounded scale (the one the cache stores), so dequantizing
//   uses the same scale the codes were made with.
//   code = round_half_even(x / scale) clamped to [-127, 127] (x / scale rounded to f32 first).
//   A kept scale of 0 (absmax == 0, or absmax so small that absmax / 127 rounds to 0) gives all codes 0.
//   x' = code * scale in f32.
//   Every x must be finite, and an f16 scale must not overflow (absmax / 127 < 65520): std::invalid_argument.
//
// q8_0 (llama.cpp/ggml, block_q8_0): blocks of 32 values, one f16 scale each, exactly ggml's
// quantize_row_q8_0_ref (ggml/src/ggml-quants.c):
//   amax = max |x|;  d = amax / 127 (f32);  id = d ? 1.0f / d : 0.0f (f32);  stored d = fp32_to_fp16(d) (nearest even)
//   qs[j] = roundf(x[j] * id), i.e. round half AWAY from zero, of the PRODUCT with the f32 reciprocal of the f32
//   (not yet f16-rounded) d. Each of these choices changes some codes: x / d instead of x * id, the f16 d instead
//   of the f32 d, or ties to even instead of roundf, and the cache no longer holds llama.cpp's bytes.
//   dequantize: x' = qs[j] * fp16_to_fp32(d) in f32.
//   Tiny blocks: for amax < 127 * FLT_MIN (d below the smallest normal f32) ggml's float -> int8 conversion can be
//   out of range (undefined behaviour in C; x86 wraps). Its stored d is f16 zero there, so every dequantized value
//   is 0 whatever the codes. The reference writes d = 0 and all codes 0 for such blocks; a checker judges their
//   codes by value only. Every x must be finite (std::invalid_argument). A d above f16's range is stored as f16
//   infinity, as ggml does.
//
// Sources checked: CUDA 12.2 cuda_fp8.hpp (__nv_cvt_double_to_fp8: overflow threshold max + 1/2 ulp, SATFINITE to
// 0x7e / 0x7b, NaN -> 0x7f), ml_dtypes float8.h (ConvertImpl: ties to even, NaN sign kept, E5M2 quiet NaN
// 0b0'11111'10), ggml-quants.c quantize_row_q8_0_ref and dequantize_row_q8_0.
#pragma once

#include <cstdint>

namespace kvc::ref {

// ---- fp8 ----

enum class Fp8 { E4M3FN, E5M2 };

uint8_t encode_e4m3fn(float x);
float decode_e4m3fn(uint8_t code);
uint8_t encode_e5m2(float x);
float decode_e5m2(uint8_t code);

uint8_t encode_fp8(float x, Fp8 format);
float decode_fp8(uint8_t code, Fp8 format);

// Largest finite magnitude: 448 (E4M3FN), 57344 (E5M2).
float fp8_max_finite(Fp8 format);

// ---- fp8 with a scale ----

uint8_t encode_fp8_scaled(float x, float scale, Fp8 format); // encode(x / scale)
float decode_fp8_scaled(uint8_t code, float scale, Fp8 format); // decode(code) * scale

// x [n] -> codes [n], one scale for the row (a per-tensor scale, or the scale of the KV head the row belongs to).
void quantize_fp8_row(const float* x, int n, float scale, Fp8 format, uint8_t* codes);
// codes [n] -> out [n]
void dequantize_fp8_row(const uint8_t* codes, int n, float scale, Fp8 format, float* out);

// ---- int8 symmetric, per token per KV head ----

enum class ScaleDtype { F32, F16 }; // how the cache keeps the scale

// x [head_dim] -> codes [head_dim]; returns the kept scale (an f16 value, widened exactly, when F16).
float quantize_int8_row(const float* x, int head_dim, ScaleDtype scale_dtype, int8_t* codes);
// codes [head_dim] -> out [head_dim]: code * scale.
void dequantize_int8_row(const int8_t* codes, int head_dim, float scale, float* out);

// One token's K (or V) row: x [n_kv_heads x head_dim] -> codes [n_kv_heads x head_dim], scales [n_kv_heads].
void quantize_int8_token(const float* x, int n_kv_heads, int head_dim, ScaleDtype scale_dtype, int8_t* codes,
                         float* scales);

// ---- q8_0 (llama.cpp) ----

constexpr int QK8_0 = 32;

// ggml's block_q8_0: the f16 bits of d, then 32 codes (34 bytes).
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};

// How the codes of a q8_0 block are rounded. ggml has one reference and per-architecture SIMD kernels that do not
// agree with it (llama.cpp's cache is written by the SIMD kernel of the machine it runs on):
//   GgmlRef        quantize_row_q8_0_ref: roundf(x * (1 / d)), half away from zero (the default; docs/quantized.md)
//   RecipAmaxEven  the x86 AVX/AVX2 kernel: x * (127 / amax), rounded half to even (_mm256_round_ps, nearest)
//   RecipDEven     the ARM NEON kernel: x * (1 / d), rounded half to even (vcvtnq_s32_f32)
// d = amax / 127 and its f16 rounding are the same in all three. They differ on ties (x * id exactly k + 1/2) and,
// for RecipAmaxEven, wherever 127 / amax and 1 / (amax / 127) are different floats.
enum class Q8_0Rounding { GgmlRef, RecipAmaxEven, RecipDEven };

// x [k] -> y [k / 32]; k must be a multiple of 32.
void quantize_row_q8_0(const float* x, int k, BlockQ8_0* y, Q8_0Rounding rounding = Q8_0Rounding::GgmlRef);
// y [k / 32] -> out [k]
void dequantize_row_q8_0(const BlockQ8_0* y, int k, float* out);

// Round to the nearest integer, ties to even (2.5 -> 2, 3.5 -> 4, -2.5 -> -2), without the FPU rounding mode.
double round_half_even(double v);

} // namespace kvc::ref
