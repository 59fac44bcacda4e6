// Causal scaled dot-product attention, computed in full from the whole history. This is the part of the reference
// that every conformance property compares against.
//
//   out = softmax(q · Kᵀ · scale, causal) · V
//
// "Causal, bottom-right aligned": with n_q queries against n_k keys (n_q <= n_k), query i is the token at
// position (n_k - n_q) + i and sees keys 0 .. (n_k - n_q) + i. A decode step is n_q = 1; a prefill is n_q = n_k;
// a chunk of a chunked prefill is anything in between.
//
// A sliding window narrows that (Mistral, Gemma's local layers), and attention sinks keep the first tokens in
// view (StreamingLLM): with window W > 0 and S sinks, the query at position i sees the key at position j iff
//     j <= i  and  (j < S  or  i - j < W)
// W = 0 is plain causal attention. Keys are the whole history from position 0: the reference never forgets.
#pragma once

#include <Eigen/Dense>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace kvc::ref {

// Row-major dynamic matrix: rows are tokens, as in the documents' tables.
template <typename S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Everything one head computes, for inspection at any depth.
template <typename S>
struct HeadAttention {
    Mat<S> dots;    // [n_q x n_k] raw q·k (masked entries hold 0)
    Mat<S> scores;  // [n_q x n_k] dots * scale (masked entries hold -inf)
    Mat<S> weights; // [n_q x n_k] softmax of each row (masked entries hold exactly 0)
    Mat<S> out;     // [n_q x d]   weights · v
};

// Numerically stable softmax of one row, in place: subtract the row maximum, exponentiate, divide by the sum.
// -inf entries become exactly 0.
template <typename S, typename Row>
void softmax_row(Row&& row) {
    const S m = row.maxCoeff();
    S sum = 0;
    for (Eigen::Index j = 0; j < row.size(); ++j) {
        const S e = row(j) == -std::numeric_limits<S>::infinity() ? S(0) : std::exp(row(j) - m);
        row(j) = e;
        sum += e;
    }
    row /= sum;
}

// Which keys a query sees: the causal rule, narrowed by a window of `window` keys (0: none) and widened again by
// the first `sinks` positions.
struct Visibility {
    long window = 0;
    long sinks = 0;
    bool sees(long i, long j) const { return j <= i && (window == 0 || j < sinks || i - j < window); }
};

// One head.
//   q: [n_q x d], k: [n_k x d], v: [n_k x d_v]  ->  HeadAttention with out [n_q x d_v]
template <typename S>
HeadAttention<S> attend_head(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, S scale, Visibility vis = {}) {
    const Eigen::Index n_q = q.rows(), n_k = k.rows();
    if (n_q > n_k || k.cols() != q.cols() || v.rows() != n_k)
        throw std::invalid_argument("attend_head: shapes do not fit (need n_q <= n_k, same d for q and k)");
    const Eigen::Index offset = n_k - n_q; // bottom-right alignment
    HeadAttention<S> r;
    r.dots = q * k.transpose();
    r.scores = r.dots * scale;
    for (Eigen::Index i = 0; i < n_q; ++i)
        for (Eigen::Index j = 0; j < n_k; ++j)
            if (!vis.sees(offset + i, j)) {
                r.dots(i, j) = 0;
                r.scores(i, j) = -std::numeric_limits<S>::infinity();
            }
    r.weights = r.scores;
    for (Eigen::Index i = 0; i < n_q; ++i) softmax_row<S>(r.weights.row(i));
    r.out = r.weights * v;
    return r;
}

// All heads of one layer, grouped-query aware.
//   q: [n_q_tok x n_q_heads*d], k: [n_k x n_kv_heads*d], v: [n_k x n_kv_heads*d_v]  ->  [n_q_tok x n_q_heads*d_v]
// Query head h reads KV head h / (n_q_heads / n_kv_heads): consecutive query heads share a KV head ("repeat").
// d_v = 0 means d_v = d. Multi-head latent attention's decode form is this with n_kv_heads = 1 and d_v < d.
template <typename S>
Mat<S> attend_heads(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, int n_q_heads, int n_kv_heads, int d,
                    S scale, Visibility vis = {}, int d_v = 0) {
    const int group = n_q_heads / n_kv_heads;
    if (d_v == 0) d_v = d;
    Mat<S> out(q.rows(), static_cast<Eigen::Index>(n_q_heads) * d_v);
    for (int h = 0; h < n_q_heads; ++h) {
        const int g = h / group;
        const Mat<S> qh = q.middleCols(h * d, d);
        const Mat<S> kh = k.middleCols(g * d, d);
        const Mat<S> vh = v.middleCols(g * d_v, d_v);
        out.middleCols(h * d_v, d_v) = attend_head<S>(qh, kh, vh, scale, vis).out;
    }
    return out;
}

} // namespace kvc::ref
