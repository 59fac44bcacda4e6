// splitmix64 (Steele, Lea, Flood 2014): the one seeded mixer of the project. Seeds, weights, golden files and
// property replays all derive from it, so it must be identical on every platform and in every layer; this header
// is its only definition. Standard C++ only (no Eigen), so every layer, the engines included, can include it.
#pragma once

#include <cstdint>

namespace kvc {

// The increment between successive states (2^64 / golden ratio).
inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;

// One splitmix64 output for state z: advances z by the gamma, then mixes. splitmix64(s + k * gamma) is the
// (k+1)-th output of a generator seeded with s.
constexpr uint64_t splitmix64(uint64_t z) {
    z += kSplitMix64Gamma;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The sequential form: each next() advances state by the gamma and returns the mix of the new state.
struct SplitMix64 {
    uint64_t state;
    constexpr uint64_t next() {
        const uint64_t out = splitmix64(state);
        state += kSplitMix64Gamma;
        return out;
    }
};

} // namespace kvc
