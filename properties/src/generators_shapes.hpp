// What generators.cpp and generators_shapes.cpp share. config() draws a plain cache's shape, then hands the case to
// draw_latent and draw_windows for the shapes beyond it, which must respect the same size caps.
#pragma once

#include "generators.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace kvc::prop::gens {

inline bool has(uint32_t mask, uint32_t bit) { return (mask & bit) != 0; }

// in 64 bits, saturated: a declared granularity near 2^32 must not wrap to a small one
inline uint32_t lcm(uint32_t a, uint32_t b) {
    const uint64_t l = uint64_t(a / std::gcd(a, b)) * b;
    return static_cast<uint32_t>(std::min<uint64_t>(l, UINT32_MAX));
}

// Attention costs T^2 * work, work = n_q_heads * head_dim * n_layers: the widest shapes (work above 1536) get 100
// tokens at most, so that a rare big head stays as cheap as a common case. config() applies it to the shape it
// drew, draw_latent to the latent shape that replaces it.
inline uint32_t wide_shape_tokens(uint32_t work, uint32_t tokens) {
    return work > 1536 ? std::min(tokens, 100u) : tokens;
}

// The shapes beyond a plain cache (generators_shapes.cpp), drawn last in config(), in this order, and only where the
// caps declare them: a case for an implementation that declares neither draws what it always drew.
void draw_latent(const ConfigSpace& space, CaseConfig& c);  // MLA and partial rotary
void draw_windows(const ConfigSpace& space, CaseConfig& c); // windows, sinks and eviction

} // namespace kvc::prop::gens
