// Shrinking a failing model-level case, as the operation level shrinks its own (properties/src/runner.cpp
// shrink_case): a greedy descent that takes the first smaller case still FAILing the same property, and repeats
// until none does or the runs are spent. Smaller means fewer layers, heads, dims, vocabulary, sequences and tokens;
// the seed, the weight format, RoPE, theta, eps, the classifier kind and the small-norm regime stay as they are,
// since any of them may be what the bug needs. The weights are drawn from (description, seed, embed_rms), so a
// shrunk case is its fields: it replays from its JSON form (model_case.hpp), not from its seed.
#pragma once

#include "kvcheck/model/model_case.hpp"
#include "kvcheck/model/model_properties.hpp"

#include <string>
#include <vector>

namespace kvc::model {

// The most property runs one failure's shrinking may spend (each a few milliseconds on the cases drawn here).
constexpr int kMaxShrinkRuns = 200;

// A smaller case is taken only when it fails as clearly as the first failure did, up to this many times the bound
// (PropertyResult::excess). On the smallest models the bound's floor dominates, and a descent that took any FAIL
// ends on cases a bug misses the bound by a few percent: true, but a counterexample that says more about the bound
// than about the bug, and that rounding elsewhere could turn into a PASS. The bugs of tests/model_level/doubles lie
// 300 to 10^5 times past the bound; an honest engine's rounding stays below a quarter of it.
constexpr double kClearExcess = 10;

// The cases tried in place of c for property `property`, in order, bigger reductions first: the fields the property
// does not read at their least; one layer, fewer layers; one KV head and one query head, then fewer of each (the
// group kept); a smaller vocabulary (tokens taken modulo it); a smaller hidden_dim, head_dim, and dim where it need
// not be n_heads * head_dim; fewer sequences; shorter prompt, prompt2, tails, fewer steps and chunks; a smaller
// max_context. Every one keeps case_error's rules and caps (outside_caps), is smaller_than c, and keeps what the
// property needs: two sequences for MODEL-FORK, a prompt of two tokens or more for MODEL-CHUNK (something to split)
// when c has one. Deterministic: the same c gives the same list. A malformed c (case_error) has none.
std::vector<ModelCase> shrink_candidates(const ModelCase& c, const std::string& property, const kvcm_caps& caps);

// a is strictly smaller than b: no size of a above b's (layers, heads, dims, vocabulary, sequences, context, each
// history's length, steps, chunks, the sum of the tokens) and one below. The order that makes the descent end.
bool smaller_than(const ModelCase& a, const ModelCase& b);

// first: the FAIL of a case (PropertyResult::the_case set). Returns the smallest case the descent reaches within
// max_runs property runs that FAILs the same property by at least min(kClearExcess, first.excess), with
// shrink_steps and shrink_runs; its message is the shrunk case's describe(), the failure on it, and "shrunk in N
// steps from case seed S". Anything but a FAIL comes back unchanged.
PropertyResult shrink_model_failure(const ModelTarget& target, const std::string& property, PropertyResult first,
                                    int max_runs = kMaxShrinkRuns);

} // namespace kvc::model
