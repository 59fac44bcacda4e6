// What the engine's numbers are compared with, and how far they may be from it (docs/model-level.md, "The bound").
//
// The oracle is the reference's full recompute in double over the token history (reference/: no cache; the
// weights are f32 values, so the engine and the reference multiply the same numbers). The error estimate is a naive
// f32 forward on the same weights — plain loops, f32 accumulation, RoPE angles computed in f32 as single-file
// engines do — which is what an honest f32 engine's arithmetic looks like. It runs twice, every sum in index order
// and reversed; the estimate of a row (V logits of one position, or one position's K or V of one layer) is the
// largest deviation either shows on that row or an earlier one of the same history. kSafety times it, plus a floor
// relative to the row's scale, is what an engine may deviate.
#pragma once

#include "kvcheck/reference/model.hpp"

#include <vector>

namespace kvc::model {

constexpr double kSafety = 8.0;  // orders of summation differ: the naive f32 error is an estimate, not a bound
constexpr double kFloor = 1e-5;  // relative to max(1, max |value| of the row): where the estimate happens to be tiny

struct Oracle {
    ref::Mat<double> logits;              // [T x V] the reference in double
    ref::Mat<double> naive;               // [T x V] the naive f32 forward (for messages)
    std::vector<double> logit_est;        // [T] the error estimate of each logit row
    std::vector<ref::Mat<double>> k, v;   // per layer [T x Hkv*d], K after RoPE (reference)
    std::vector<std::vector<double>> k_est, v_est; // per layer [T]
};

Oracle compute_oracle(const ref::ModelConfig& cfg, const ref::Weights<double>& w, const std::vector<int>& tokens);

// The allowed deviation of every element of row `row` of `exact`, given the row estimates.
double allowed(const ref::Mat<double>& exact, const std::vector<double>& est, Eigen::Index row);

} // namespace kvc::model
