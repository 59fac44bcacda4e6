// The online-softmax state of one query row over some set of keys, and the two operations on it.
//
//   m = max_j s_j                    (running max; -inf for the empty set)
//   l = sum_j exp(s_j - m)           (running sum; 0 for the empty set)
//   o = sum_j exp(s_j - m) * v_j     (partial output, unnormalized; all zeros for the empty set)
//
// softmax(s) . V over a union of key sets equals normalize(merge(state of set A, state of set B)). Kernels compute
// one state per split of the keys and merge them in a fixed order, which is what makes the result independent of
// how the work was scheduled (docs/engine.md).
//
// Empty states are first-class: a split past a query's causal limit yields one, and merging it must change nothing,
// bit for bit (a NaN from exp(-inf - -inf) here is bug class 12). Host and device code share this header.
#pragma once

#include "kvcheck/optimized/kv_layout.h" // KVC_HOST_DEVICE

#include <math.h>

namespace kvc::opt {

struct SoftmaxState {
    float m;  // running max of the scores seen
    float l;  // running sum of exp(score - m)
    float* o; // [head_dim] running sum of exp(score - m) * v, owned by the caller

    KVC_HOST_DEVICE bool empty() const { return m == -INFINITY; }
};

// The state of the empty key set.
KVC_HOST_DEVICE inline void state_clear(SoftmaxState& s, int head_dim) {
    s.m = -INFINITY;
    s.l = 0.0f;
    for (int c = 0; c < head_dim; ++c) s.o[c] = 0.0f;
}

// into := state of (keys of into) ∪ (keys of from). Rescales both sides to the common max.
//   from empty: into unchanged (exactly).   into empty: into := from (exactly).
KVC_HOST_DEVICE inline void state_merge(SoftmaxState& into, const SoftmaxState& from, int head_dim) {
    if (from.empty()) return;
    if (into.empty()) {
        into.m = from.m;
        into.l = from.l;
        for (int c = 0; c < head_dim; ++c) into.o[c] = from.o[c];
        return;
    }
    const float m = into.m > from.m ? into.m : from.m;
    const float a = expf(into.m - m); // exactly 1 for the side that holds the max
    const float b = expf(from.m - m);
    into.l = into.l * a + from.l * b;
    for (int c = 0; c < head_dim; ++c) into.o[c] = into.o[c] * a + from.o[c] * b;
    into.m = m;
}

// out := o / l, the attention output of the row. The empty state has no softmax; it yields zeros (a query always
// sees at least its own key, so the engine never normalizes an empty state).
KVC_HOST_DEVICE inline void state_normalize(const SoftmaxState& s, float* out, int head_dim) {
    if (s.empty() || !(s.l > 0.0f)) {
        for (int c = 0; c < head_dim; ++c) out[c] = 0.0f;
        return;
    }
    for (int c = 0; c < head_dim; ++c) out[c] = s.o[c] / s.l;
}

} // namespace kvc::opt
