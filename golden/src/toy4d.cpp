// The 4-d toy of 000_*.txt: what the document prints, transcribed once, and what it leaves out, derived.
#include "kvcheck/golden/toy4d.hpp"

#include <Eigen/LU>

#include <cmath>
#include <stdexcept>
#include <string>

namespace kvc::golden {
namespace {

using ref::Mat;
using ref::RowVec;

Mat<LD> rows(std::initializer_list<std::initializer_list<LD>> r) {
    Mat<LD> m(static_cast<Eigen::Index>(r.size()), static_cast<Eigen::Index>(r.begin()->size()));
    Eigen::Index i = 0;
    for (const auto& row : r) {
        Eigen::Index j = 0;
        for (LD x : row) m(i, j++) = x;
        ++i;
    }
    return m;
}

RowVec<LD> vec(std::initializer_list<LD> v) { return rows({v}); }

// Rounds a value that must be an integer, and says so loudly if it is not.
LD integer(LD x, const char* what) {
    const LD r = std::round(x);
    if (std::fabs(x - r) > 1e-12L) throw std::logic_error(std::string("toy4d: ") + what + " is not an integer");
    return r == 0 ? 0 : r; // no -0
}

// e · W_K = k  <=>  W_Kᵀ eᵀ = kᵀ. W_K is invertible, so e is unique; it comes out integer.
RowVec<LD> solve_mat_embedding(const Mat<LD>& w_k, const RowVec<LD>& k, LD& det) {
    const Eigen::FullPivLU<Mat<LD>> lu(w_k.transpose());
    det = integer(lu.determinant(), "det W_K");
    if (det == 0) throw std::logic_error("toy4d: W_K is singular, mat's embedding is not unique");
    RowVec<LD> e = lu.solve(k.transpose()).transpose();
    for (Eigen::Index i = 0; i < e.size(); ++i) e(i) = integer(e(i), "mat's embedding");
    if (e * w_k != k) throw std::logic_error("toy4d: mat's embedding does not reproduce K_mat");
    return e;
}

// W_Q column by column: E · w = (Q_the[j], Q_on[j], Q_mat[j]) with E = [e_the; e_on; e_mat] (3 x 4). Among the
// 3^4 vectors with entries in {1, 2, 3} exactly one solves it, for every column; we check that by enumeration.
Mat<LD> choose_w_q(const Mat<LD>& E, const Mat<LD>& Q) {
    Mat<LD> w_q(4, 4);
    for (Eigen::Index j = 0; j < 4; ++j) {
        int found = 0;
        for (int code = 0; code < 81; ++code) {
            RowVec<LD> w(4);
            for (int i = 0, c = code; i < 4; ++i, c /= 3) w(i) = 1 + c % 3;
            if (E * w.transpose() == Q.col(j)) {
                w_q.col(j) = w.transpose();
                ++found;
            }
        }
        if (found != 1)
            throw std::logic_error("toy4d: W_Q column " + std::to_string(j) + " has " + std::to_string(found) +
                                   " solutions in {1,2,3}^4, expected exactly 1");
    }
    if (E * w_q != Q) throw std::logic_error("toy4d: W_Q does not reproduce the printed Q vectors");
    return w_q;
}

// The direction along which every column of W_Q may move: the kernel of E (rank 3, so one direction), scaled to
// the smallest integers with the first non-zero entry positive.
RowVec<LD> null_direction(const Mat<LD>& E, int& rank) {
    const Eigen::FullPivLU<Mat<LD>> lu(E);
    rank = static_cast<int>(lu.rank());
    if (rank != 3) throw std::logic_error("toy4d: [e_the; e_on; e_mat] does not have rank 3");
    RowVec<LD> n = lu.kernel().col(0).transpose();
    LD smallest = 0, sign = 0;
    for (Eigen::Index i = 0; i < n.size(); ++i) {
        if (std::fabs(n(i)) > 1e-12L && (smallest == 0 || std::fabs(n(i)) < smallest)) smallest = std::fabs(n(i));
        if (sign == 0 && std::fabs(n(i)) > 1e-12L) sign = n(i) > 0 ? 1 : -1;
    }
    n *= sign / smallest;
    for (Eigen::Index i = 0; i < n.size(); ++i) n(i) = integer(n(i), "W_Q's null direction");
    if (!(E * n.transpose()).isZero(0)) throw std::logic_error("toy4d: the null direction is not in E's kernel");
    return n;
}

Toy4d build() {
    const Toy4dPrinted& p = toy4d_printed();
    Toy4d t;
    t.cfg.d_model = 4;
    t.cfg.n_layers = 2;
    t.cfg.n_q_heads = 1;
    t.cfg.n_kv_heads = 1;
    t.cfg.head_dim = 4;
    t.cfg.vocab = 17; // ids 0..16; the largest printed id is 16 ("on")
    t.cfg.scale = 0.5; // "scale by 1/√4"
    t.cfg.validate();

    const Mat<LD> w_k = p.w_k_columns.transpose(); // [D x d]: column j is K_j's column
    const Mat<LD> w_v = p.w_v_columns.transpose();
    t.mat_embedding = solve_mat_embedding(w_k, p.k_mat, t.w_k_det);

    Mat<LD> E(3, 4), Q(3, 4);
    E << p.embeddings.row(0), p.embeddings.row(3), t.mat_embedding; // the, on, mat
    Q << p.q_the, p.q_on, p.q_mat;
    t.w_q = choose_w_q(E, Q);
    t.w_q_null = null_direction(E, t.q_system_rank);

    t.weights.embedding = Mat<LD>::Zero(t.cfg.vocab, t.cfg.d_model);
    for (size_t i = 0; i < p.prompt.size(); ++i)
        t.weights.embedding.row(p.prompt[i]) = p.embeddings.row(static_cast<Eigen::Index>(i));
    t.weights.embedding.row(p.mat_id) = t.mat_embedding;
    ref::LayerWeights<LD> layer0;
    layer0.w_q = t.w_q;
    layer0.w_k = w_k;
    layer0.w_v = w_v;
    ref::LayerWeights<LD> layer1; // not in the document; zeros, so that nothing can depend on it unnoticed
    layer1.w_q = layer1.w_k = layer1.w_v = Mat<LD>::Zero(4, 4);
    t.weights.layers = {layer0, layer1};
    ref::check_shapes(t.cfg, t.weights);
    return t;
}

} // namespace

const Toy4dPrinted& toy4d_printed() {
    static const Toy4dPrinted p = [] {
        Toy4dPrinted x;
        x.prompt = {10, 12, 13, 16};
        x.mat_id = 14;
        // "the 10 emb 2331", "cat 12 emb 2232", "sat 13 emb 1233", "on 16 emb 2133"
        x.embeddings = rows({{2, 3, 3, 1}, {2, 2, 3, 2}, {1, 2, 3, 3}, {2, 1, 3, 3}});
        // "K₀ = 2·3 + 3·3 + 3·1 + 1·2": the second factors of each line are the column
        x.w_k_columns = rows({{3, 3, 1, 2}, {2, 1, 3, 2}, {2, 2, 1, 2}, {2, 3, 2, 3}});
        // "V₀ = 2·1 + 3·2 + 3·1 + 1·2", ...
        x.w_v_columns = rows({{1, 2, 1, 2}, {2, 1, 2, 1}, {2, 1, 1, 2}, {1, 2, 2, 1}});
        x.q_the = vec({18, 22, 15, 25}); // "Q = 18 22 15 25"
        x.q_on = vec({20, 18, 19, 21});  // "on 16 → Q 20 18 19 21"
        x.q_mat = vec({11, 11, 9, 13});  // "mat 14 → Q 11 11 9 13"
        x.k_mat = vec({10, 11, 8, 12});  // turn 2 table, row "mat"
        return x;
    }();
    return p;
}

const Toy4d& toy4d() {
    static const Toy4d t = build();
    return t;
}

} // namespace kvc::golden
