// What an append-and-attend call should return, computed from the whole history by the reference's own formulas
// (the long double oracle, reference/attention.hpp), together with the sensitivities of each output element to
// the roundings a pipeline may make: the tolerance policy (tolerance.hpp) turns them into a bound for any pipeline.
#pragma once

#include "kvcheck/properties/case.hpp"

#include <cstdint>
#include <vector>

namespace kvc::prop {

// Which KV head query head h reads. Repeat is the definition; Tile is the classic bug, used only to diagnose.
enum class HeadMap { Repeat, Tile };

// One call's expected outputs for n_new queries against T cached rows of one (sequence, layer), and per output
// element (i, h, x) the first-order sensitivities the tolerance model needs. With w_j = p_j / sum p the softmax
// weights of the visible rows j, D_jx = |v_jx - out_x| and q~ the rotated query:
//   s_qk    = sum_j w_j * D_jx * scale * sum_y |q~_y| |k_jy|                   (q rounding, dot products)
//   s_rope  = sum_j w_j * D_jx * scale * sum_y (|q_a(y)| + |q_b(y)|) |k_jy|      (rotation arithmetic and tables)
//   s_angle = sum_j w_j * D_jx * scale * sum_y angle_err(y) (|q_a| + |q_b|) |k_jy| (f32 angles at the position)
//   s_score = sum_j w_j * D_jx * (|s_j| + max_j |s_j|)                       (score rounding, max subtraction)
//   s_diff  = sum_j w_j * D_jx                                               (exp evaluation)
//   s_abs   = sum_j w_j * |v_jx|                                             (probabilities)
//   s_part  = max_k |sum_{j<=k} w_j v_jx|, prefixes in position order          (V accumulator, denominator)
// Any partial sum of an order built from a few contiguous runs of positions (forward, reverse, split-KV chunks and
// their merges, online softmax with rescaling) is at most 2 * s_part in the normalized view.
struct Expected {
    uint32_t n_new = 0;
    std::vector<long double> oracle; // [n_new][Hq*dv] (dv = CaseConfig::dv(), V's head dim)
    std::vector<float> v_scale;      // [n_new][Hq]    max |v| over the rows query (i, h) sees (>= 1e-30)
    std::vector<uint32_t> visible;   // [n_new]        rows query i sees (its window and the sinks, when windowed)
    std::vector<double> s_qk, s_rope, s_angle, s_score, s_diff, s_abs, s_part; // [n_new][Hq*d]
};

//   q:    [n_new][Hq*d]  the queries as the harness passed them (unrotated when the case uses RoPE)
//   k, v: [T][Hkv*d], [T][Hkv*dv]  the rows attended, widened to float (keys rotated on the case's RoPE range),
//                        T >= n_new; the new rows are the last
//   oracle_rotated_keys: how many of the last rows hold keys rotated by the oracle (long double) rather than read
//   back from the implementation (new rows attended unrounded): their f32-rotation error enters s_angle.
//   layer: the layer the rows belong to, whose window (CaseConfig::window) and the case's sinks decide which rows
//   each query sees (docs/windowed-caches.md); rows it does not see have weight 0 and enter no sensitivity.
Expected expect_outputs(const CaseConfig& cfg, const float* q, uint32_t n_new, const std::vector<float>& k,
                        const std::vector<float>& v, uint32_t T, HeadMap map = HeadMap::Repeat,
                        uint32_t oracle_rotated_keys = 0, uint32_t layer = 0);

// A key row of the case rotated (long double) at `pos` when the case uses RoPE, rounded to float: rounded once
// more to the cache dtype it is what the row should be stored as, and unrounded what a pipeline that attends new
// rows before rounding them uses. k_in: [Hkv*d]; out: [Hkv*d].
void expected_rotated_key(const CaseConfig& cfg, const float* k_in, uint32_t pos, float* out);

// How far an implementation's own rotation of key element `element` (index into k_in: [Hkv*d]) at `pos` may lie
// from the long double rotation, stored in the case's dtype: the rounding of the stored value plus what an
// ordinary f32 rotation loses (angle pos * theta^(-2j/d), cos and sin in float), which grows with the position and
// with the magnitude of the rotated pair, not of the result.
double stored_key_bound(const CaseConfig& cfg, const float* k_in, uint32_t pos, uint32_t element);

// Whether `got`, a rotated key element as the implementation stored it (widened to float), is one a correct cache
// may store. `rotated` is the long double rotation rounded to float (expected_rotated_key); rope_stage is the
// declared pipeline's RoPE stage (KVC_ROUND_*). A rotation in f32 (the default) may differ from the exact one by an
// f32 rotation's error E, and is then rounded to nearest even: rounding being monotone, `got` must lie between the
// roundings of rotated - E and rotated + E. A cache that truncates, or rounds twice, leaves that interval even at
// position 0, where the rotation is exact (a looser within-two-units bound would let bf16 truncation pass). A
// rotation declared in 16 bits (cos, sin or the products rounded) gets stored_key_bound, two units of the dtype.
bool stored_key_acceptable(const CaseConfig& cfg, uint32_t rope_stage, const float* k_in, uint32_t pos,
                           uint32_t element, float rotated, float got);

// The interval [lo, hi] of rotations a correct implementation's own rotation of key element `element` at `pos` may
// give before it is stored (the same error model as stored_key_acceptable, before the rounding to a dtype): what a
// quantized key's codes and scales are judged against (quantized_row_acceptable).
struct KeyInterval {
    float lo, hi;
};
KeyInterval rotated_key_interval(const CaseConfig& cfg, uint32_t rope_stage, const float* k_in, uint32_t pos,
                                 uint32_t element, float rotated);

// Absolute error bound of an f32 angle pos * theta^(-2j/d) (radians): what a plain float RoPE loses at `pos`.
double rope_angle_error(uint32_t pos, uint32_t j, uint32_t head_dim, float theta);

} // namespace kvc::prop
