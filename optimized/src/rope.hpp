// Rotary position embedding as the engine applies it: to K when it is appended (the position is baked into the
// cache) and to q before attention. Pair j of a head (0 <= j < d/2) turns by pos * theta^(-2j/d):
//   NeoX pairs (j, j + d/2), GPT-J pairs (2j, 2j + 1)      (the same as kvc::ref::apply_rope)
// With a RoPE range (ABI 1.2: rope_dim_begin, rope_dims) d is rope_dims and the pairs are those of the head's dims
// [begin, begin + d); the others stay as given (kvc::ref::apply_rope_range).
// The angle, its cosine and sine are computed in long double like the reference, the rotation itself in double,
// then rounded once to float: the closest float to the reference's rotation in all but rare ties.
#pragma once

#include "kvcheck/abi.h"

#include <cstdint>
#include <vector>

namespace kvc::opt {

class Rope {
public:
    Rope() = default;
    // dims 0: the whole head (begin must then be 0).
    Rope(uint32_t variant, float theta, uint32_t head_dim, uint32_t begin = 0, uint32_t dims = 0);

    bool enabled() const { return variant_ != KVC_ROPE_NONE; }

    // The cosines and sines of position pos: cs[2j], cs[2j + 1] for pair j (rotated dims, at most head_dim
    // doubles). Once per token, shared by every head of q and k.
    void angles(uint64_t pos, double* cs) const;
    // Rotates the range of one head vector x[0 .. head_dim) by the angles of angles().
    void apply(float* x, const double* cs) const;

private:
    uint32_t variant_ = KVC_ROPE_NONE;
    uint32_t begin_ = 0; // the first rotated dim
    uint32_t dims_ = 0;  // rotated dims (the whole head when the config's rope_dims is 0)
    std::vector<long double> inv_freq_; // [dims / 2]
};

} // namespace kvc::opt
