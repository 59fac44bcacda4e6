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

// The scalar half of a merge, for kernels that spread o over threads (the CUDA engine): which case applies and,
// when both sides hold keys, the common max and the two rescale factors. state_merge below is made of it.
enum class MergeKind { KeepInto, CopyFrom, Rescale };
struct MergeScales {
    MergeKind kind;
    float m; // the merged max (Rescale)
    float a; // factor of into's l and o
    float b; // factor of from's l and o
};

KVC_HOST_DEVICE inline MergeScales merge_scales(float into_m, float from_m) {
    MergeScales s{MergeKind::Rescale, 0.0f, 0.0f, 0.0f};
    if (from_m == -INFINITY) {
        s.kind = MergeKind::KeepInto;
        return s;
    }
    if (into_m == -INFINITY) {
        s.kind = MergeKind::CopyFrom;
        return s;
    }
    s.m = into_m > from_m ? into_m : from_m;
    s.a = expf(into_m - s.m); // exactly 1 for the side that holds the max
    s.b = expf(from_m - s.m);
    return s;
}

// One element of a Rescale merge: the one expression every engine rounds the same way.
KVC_HOST_DEVICE inline float merge_rescaled(const MergeScales& s, float into, float from) {
    return into * s.a + from * s.b;
}

// One element (l, or one component of o) of the merged state.
KVC_HOST_DEVICE inline float merge_apply(const MergeScales& s, float into, float from) {
    if (s.kind == MergeKind::KeepInto) return into;
    if (s.kind == MergeKind::CopyFrom) return from;
    return merge_rescaled(s, into, from);
}

// The merged max.
KVC_HOST_DEVICE inline float merge_max(const MergeScales& s, float into_m, float from_m) {
    return s.kind == MergeKind::KeepInto ? into_m : s.kind == MergeKind::CopyFrom ? from_m : s.m;
}

// One component of the output row: o / l; zeros for the empty state (state_normalize, element by element).
KVC_HOST_DEVICE inline float normalize_elem(float m, float l, float o) {
    return (m == -INFINITY || !(l > 0.0f)) ? 0.0f : o / l;
}

// into := state of (keys of into) ∪ (keys of from). Rescales both sides to the common max.
//   from empty: into unchanged (exactly).   into empty: into := from (exactly).
// Each case has its own loop, the operations of merge_apply: a loop that asks merge_apply per element stays scalar
// (GCC 12 at -O3 does not take the test out of it), and a whole GQA group's merges then take 3 % of a decode step in
// cache.
KVC_HOST_DEVICE inline void state_merge(SoftmaxState& into, const SoftmaxState& from, int head_dim) {
    const MergeScales s = merge_scales(into.m, from.m);
    if (s.kind == MergeKind::KeepInto) return;
    into.l = merge_apply(s, into.l, from.l);
    if (s.kind == MergeKind::CopyFrom) {
        for (int c = 0; c < head_dim; ++c) into.o[c] = from.o[c];
    } else {
        for (int c = 0; c < head_dim; ++c) into.o[c] = merge_rescaled(s, into.o[c], from.o[c]);
    }
    into.m = merge_max(s, into.m, from.m);
}

// out := o / l, the attention output of the row. The empty state has no softmax; it yields zeros (a query always
// sees at least its own key, so the engine never normalizes an empty state). normalize_elem's test is made once per
// row: per element, it kept the division scalar (a division under a condition may not be vectorized while FP
// exceptions are honoured), 5 % of a GQA decode step in cache (64 rows x 128 divisions).
KVC_HOST_DEVICE inline void state_normalize(const SoftmaxState& s, float* out, int head_dim) {
    if (s.m == -INFINITY || !(s.l > 0.0f)) {
        for (int c = 0; c < head_dim; ++c) out[c] = 0.0f;
        return;
    }
    for (int c = 0; c < head_dim; ++c) out[c] = s.o[c] / s.l; // normalize_elem of a state that holds keys
}

} // namespace kvc::opt
