#include "rope.hpp"

#include <cmath>

namespace kvc::opt {

Rope::Rope(uint32_t variant, float theta, uint32_t head_dim, uint32_t begin, uint32_t dims)
    : variant_(variant), begin_(begin), dims_(dims == 0 ? head_dim : dims) {
    if (variant_ == KVC_ROPE_NONE) return;
    const int d = static_cast<int>(dims_);
    inv_freq_.resize(dims_ / 2);
    for (int j = 0; j < d / 2; ++j) // the reference's expression, operand for operand
        inv_freq_[static_cast<size_t>(j)] = std::pow(static_cast<long double>(static_cast<double>(theta)), -2.0L * j / d);
}

void Rope::angles(uint64_t pos, double* cs) const {
    for (uint32_t j = 0; j < dims_ / 2; ++j) {
        const long double angle = static_cast<long double>(pos) * inv_freq_[j];
        cs[2 * j] = static_cast<double>(std::cos(angle));
        cs[2 * j + 1] = static_cast<double>(std::sin(angle));
    }
}

void Rope::apply(float* head, const double* cs) const {
    float* x = head + begin_;
    const uint32_t half = dims_ / 2;
    for (uint32_t j = 0; j < half; ++j) {
        const uint32_t a = variant_ == KVC_ROPE_NEOX ? j : 2 * j;
        const uint32_t b = variant_ == KVC_ROPE_NEOX ? j + half : 2 * j + 1;
        const double xa = x[a], xb = x[b], c = cs[2 * j], s = cs[2 * j + 1];
        x[a] = static_cast<float>(xa * c - xb * s);
        x[b] = static_cast<float>(xa * s + xb * c);
    }
}

} // namespace kvc::opt
