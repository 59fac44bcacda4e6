// Rotary position embedding as the engine applies it: to K when it is appended (the position is baked into the
// cache) and to q before attention. Pair j of a head (0 <= j < d/2) turns by pos * theta^(-2j/d):
//   NeoX pairs (j, j + d/2), GPT-J pairs (2j, 2j + 1)      (the same as kvc::ref::apply_rope)
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
    Rope(uint32_t variant, float theta, uint32_t head_dim);

    bool enabled() const { return variant_ != KVC_ROPE_NONE; }

    // The cosines and sines of position pos: cs[2j], cs[2j + 1] for pair j (head_dim doubles). Once per token,
    // shared by every head of q and k.
    void angles(uint64_t pos, double* cs) const;
    // Rotates one head vector x[0 .. head_dim) by the angles of angles().
    void apply(float* x, const double* cs) const;

private:
    uint32_t variant_ = KVC_ROPE_NONE;
    uint32_t head_dim_ = 0;
    std::vector<long double> inv_freq_; // [head_dim / 2]
};

} // namespace kvc::opt
