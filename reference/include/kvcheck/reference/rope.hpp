// Rotary position embedding on one head vector. Position is baked into K when it is written to the cache, which is
// why "cat" at position 1 and at position 5 have different cached keys.
#pragma once

#include "kvcheck/reference/config.hpp"

#include <cmath>

namespace kvc::ref {

// Rotates x (length d, even) in place by position pos.
//   pair j (0 <= j < d/2) has angle pos * theta^(-2j/d) and elements
//   NeoX: (x[j], x[j + d/2])      GPT-J: (x[2j], x[2j + 1])
// The angle and trigonometry are computed in long double, then rounded to S, so all scalar types rotate by the
// same angle.
template <typename S>
void apply_rope(S* x, int d, long pos, Rope variant, double theta) {
    if (variant == Rope::None) return;
    const int half = d / 2;
    for (int j = 0; j < half; ++j) {
        const long double inv_freq = std::pow(static_cast<long double>(theta), -2.0L * j / d);
        const long double angle = static_cast<long double>(pos) * inv_freq;
        const S c = static_cast<S>(std::cos(angle));
        const S s = static_cast<S>(std::sin(angle));
        const int a = variant == Rope::NeoX ? j : 2 * j;
        const int b = variant == Rope::NeoX ? j + half : 2 * j + 1;
        const S xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xa * s + xb * c;
    }
}

// Partial rotary embedding: rotates dims [begin, begin + dims) of x as if they were a whole head of `dims` dims
// (frequencies theta^(-2j/dims)) and leaves the others as they are. GPT-NeoX-style `partial_rotary_factor` rotates
// a prefix; multi-head latent attention rotates the last 64 dims of its 576-dim key.
template <typename S>
void apply_rope_range(S* x, int begin, int dims, long pos, Rope variant, double theta) {
    apply_rope(x + begin, dims, pos, variant, theta);
}

} // namespace kvc::ref
