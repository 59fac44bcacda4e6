// What an append-and-attend call should return, computed from the whole history by the reference's own formulas:
// the long double oracle (reference/attention.hpp) and the "naive" computations in each precision class that the
// tolerance policy (tolerance.hpp) calibrates against.
#pragma once

#include "kvcheck/properties/case.hpp"

#include <cstdint>
#include <vector>

namespace kvc::prop {

// Which KV head query head h reads. Repeat is the definition; Tile is the classic bug, used only to diagnose.
enum class HeadMap { Repeat, Tile };

// One call's expected outputs for n_new queries against T cached rows of one (sequence, layer).
//   q:    [n_new][Hq*d]  the queries as the harness passed them (unrotated when the case uses RoPE)
//   k, v: [T][Hkv*d]     the stored rows widened to float (rotated keys), T >= n_new; the new rows are the last n_new
struct Expected {
    uint32_t n_new = 0;
    std::vector<long double> oracle;       // [n_new][Hq*d]  long double, from the stored rows
    std::vector<float> naive_f32;          // [n_new][Hq*d]  naive: f32 scores, softmax and accumulation
    std::vector<float> naive_cache_accum;  // [n_new][Hq*d]  naive: q rounded to the cache dtype, V summed in it
    std::vector<float> v_scale;            // [n_new][Hq]    max |v| over the rows query (i, h) sees (>= 1e-30)
};

Expected expect_outputs(const CaseConfig& cfg, const float* q, uint32_t n_new, const std::vector<float>& k,
                        const std::vector<float>& v, uint32_t T, HeadMap map = HeadMap::Repeat);

// The row a key of the case should be stored as: rotated (long double) at `pos` when the case uses RoPE, then
// rounded to the cache dtype. k_in: [Hkv*d]; out: [Hkv*d] widened to float.
void expected_stored_key(const CaseConfig& cfg, const float* k_in, uint32_t pos, float* out);

// How far an implementation's own rotation of key element `element` (index into k_in: [Hkv*d]) at `pos` may lie
// from the long double rotation, stored in the case's dtype: the rounding of the stored value plus what an
// ordinary f32 rotation loses (angle pos * theta^(-2j/d), cos and sin in float), which grows with the position and
// with the magnitude of the rotated pair, not of the result.
double stored_key_bound(const CaseConfig& cfg, const float* k_in, uint32_t pos, uint32_t element);

} // namespace kvc::prop
