// The tolerance policy, in one place (docs/tolerance.md says it in words).
//
// Every output row (token i, query head h) is compared with the long double oracle. Errors are measured relative to
// the largest |v| that row can see (an attention output is a convex combination of those v), so one policy serves
// every scale. A row passes when
//     error <= allowed = max(2 * error of a naive computation in the declared precision class, floor(class, dtype))
// NaN anywhere fails. headroom = error / allowed. Cache contents are not graded here: they compare bitwise.
#pragma once

#include "kvcheck/properties/oracle.hpp"

#include <string>

namespace kvc::prop {

// Per-class floors on the relative error (docs/tolerance.md): f32 arithmetic 1e-5; 16-bit accumulation 1e-3 (f16),
// 8e-3 (bf16).
double tolerance_floor(uint32_t precision, uint32_t dtype);

// Where the worst row is, in logical coordinates.
struct Worst {
    uint32_t token = 0; // index within the call's new tokens
    uint32_t head = 0;  // query head
    uint32_t dim = 0;
    double expected = 0, actual = 0;
};

struct Grade {
    bool pass = true;
    double error = 0;    // worst relative error over the rows
    double allowed = 0;  // the bound at that row
    double headroom = 0; // max over rows of error / allowed (<= 1 passes)
    bool nan = false;
    bool fails_f32_class = false; // passes its declared 16-bit class but would fail the f32 one
    Worst worst;
    std::string message; // why it failed, in words; empty on pass
};

Grade grade_outputs(const CaseConfig& cfg, uint32_t declared_precision, const float* actual, const Expected& e);

} // namespace kvc::prop
