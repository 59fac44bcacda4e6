#include "kvcheck/model/model_oracle.hpp"

#include <algorithm>
#include <cmath>

namespace kvc::model {
namespace {

using Matf = ref::Mat<float>;

// Index i of n in the order of summation: forward, or reversed.
inline Eigen::Index at(Eigen::Index i, Eigen::Index n, bool reverse) { return reverse ? n - 1 - i : i; }

// x [T x n] times W [n x m], accumulated in f32 in index order (or reversed).
Matf matmul(const Matf& x, const Matf& w, bool rev) {
    Matf y(x.rows(), w.cols());
    const Eigen::Index n = x.cols();
    for (Eigen::Index t = 0; t < x.rows(); ++t)
        for (Eigen::Index j = 0; j < w.cols(); ++j) {
            float acc = 0.0f;
            for (Eigen::Index i = 0; i < n; ++i) acc += x(t, at(i, n, rev)) * w(at(i, n, rev), j);
            y(t, j) = acc;
        }
    return y;
}

Matf rmsnorm(const Matf& x, const ref::RowVec<float>& g, float eps, bool rev) {
    Matf y(x.rows(), x.cols());
    const Eigen::Index n = x.cols();
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
        float ss = 0.0f;
        for (Eigen::Index i = 0; i < n; ++i) ss += x(t, at(i, n, rev)) * x(t, at(i, n, rev));
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(x.cols()) + eps);
        for (Eigen::Index i = 0; i < x.cols(); ++i) y(t, i) = g(i) * (inv * x(t, i));
    }
    return y;
}

// RoPE with the angle pos * theta^(-2j/d) computed in f32.
void rope_f32(float* x, int d, int pos, ref::Rope variant, float theta) {
    if (variant == ref::Rope::None) return;
    for (int j = 0; j < d / 2; ++j) {
        const float freq = 1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(d));
        const float angle = static_cast<float>(pos) * freq;
        const float c = std::cos(angle), s = std::sin(angle);
        const int a = variant == ref::Rope::NeoX ? j : 2 * j;
        const int b = variant == ref::Rope::NeoX ? j + d / 2 : 2 * j + 1;
        const float xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xa * s + xb * c;
    }
}

// The naive f32 forward over the whole history (causal), recording K/V per layer. rev: every sum in reverse order.
Matf naive_forward(const ref::ModelConfig& cfg, const ref::Weights<float>& w, const std::vector<int>& tokens,
                   bool rev, std::vector<Matf>& ks, std::vector<Matf>& vs) {
    const Eigen::Index T = static_cast<Eigen::Index>(tokens.size());
    const int d = cfg.head_dim, Hq = cfg.n_q_heads, group = cfg.group_size();
    const float eps = static_cast<float>(cfg.rms_eps), theta = static_cast<float>(cfg.rope_theta);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    Matf h(T, cfg.d_model);
    for (Eigen::Index t = 0; t < T; ++t) h.row(t) = w.embedding.row(tokens[static_cast<size_t>(t)]);
    for (const auto& l : w.layers) {
        const Matf a = rmsnorm(h, l.rms_attn, eps, rev);
        Matf q = matmul(a, l.w_q, rev), k = matmul(a, l.w_k, rev), v = matmul(a, l.w_v, rev);
        for (Eigen::Index t = 0; t < T; ++t) {
            for (int hh = 0; hh < Hq; ++hh) rope_f32(q.row(t).data() + hh * d, d, static_cast<int>(t), cfg.rope, theta);
            for (int hh = 0; hh < cfg.n_kv_heads; ++hh)
                rope_f32(k.row(t).data() + hh * d, d, static_cast<int>(t), cfg.rope, theta);
        }
        Matf attn(T, static_cast<Eigen::Index>(Hq) * d);
        std::vector<float> p(static_cast<size_t>(T));
        for (Eigen::Index t = 0; t < T; ++t)
            for (int hh = 0; hh < Hq; ++hh) {
                const int g = hh / group;
                float mx = -INFINITY;
                for (Eigen::Index s = 0; s <= t; ++s) {
                    float dot = 0.0f;
                    for (int i = 0; i < d; ++i) {
                        const Eigen::Index e = at(i, d, rev);
                        dot += q(t, hh * d + e) * k(s, g * d + e);
                    }
                    p[static_cast<size_t>(s)] = dot * scale;
                    mx = std::max(mx, p[static_cast<size_t>(s)]);
                }
                float sum = 0.0f;
                for (Eigen::Index s = 0; s <= t; ++s) {
                    const size_t j = static_cast<size_t>(at(s, t + 1, rev));
                    sum += (p[j] = std::exp(p[j] - mx));
                }
                for (int i = 0; i < d; ++i) {
                    float acc = 0.0f;
                    for (Eigen::Index s = 0; s <= t; ++s) {
                        const Eigen::Index j = at(s, t + 1, rev);
                        acc += p[static_cast<size_t>(j)] / sum * v(j, g * d + i);
                    }
                    attn(t, hh * d + i) = acc;
                }
            }
        h += matmul(attn, l.w_o, rev);
        const Matf m = rmsnorm(h, l.rms_mlp, eps, rev);
        Matf gate = matmul(m, l.w_gate, rev);
        const Matf up = matmul(m, l.w_up, rev);
        for (Eigen::Index i = 0; i < gate.size(); ++i) {
            const float x = gate.data()[i];
            gate.data()[i] = x / (1.0f + std::exp(-x)) * up.data()[i];
        }
        h += matmul(gate, l.w_down, rev);
        ks.push_back(std::move(k));
        vs.push_back(std::move(v));
    }
    const Matf f = rmsnorm(h, w.rms_final, eps, rev);
    return cfg.tied ? matmul(f, Matf(w.embedding.transpose()), rev) : matmul(f, w.w_unembed, rev);
}

// Per row: the largest deviation either naive order shows on this row or any earlier one of the same history.
std::vector<double> estimate(const ref::Mat<double>& exact, const Matf& a, const Matf& b) {
    std::vector<double> e(static_cast<size_t>(exact.rows()));
    double running = 0;
    for (Eigen::Index p = 0; p < exact.rows(); ++p) {
        running = std::max({running, (a.row(p).cast<double>() - exact.row(p)).cwiseAbs().maxCoeff(),
                            (b.row(p).cast<double>() - exact.row(p)).cwiseAbs().maxCoeff()});
        e[static_cast<size_t>(p)] = running;
    }
    return e;
}

} // namespace

Oracle compute_oracle(const ref::ModelConfig& cfg, const ref::Weights<double>& w, const std::vector<int>& tokens) {
    Oracle o;
    const ref::ForwardTrace<double> tr = ref::forward<double>(cfg, w, ref::embed<double>(w, tokens));
    o.logits = tr.logits;
    for (const auto& l : tr.layers) {
        o.k.push_back(l.k);
        o.v.push_back(l.v);
    }
    const ref::Weights<float> wf = w.cast<float>();
    std::vector<Matf> ks, vs, ks2, vs2;
    const Matf n1 = naive_forward(cfg, wf, tokens, false, ks, vs);
    const Matf n2 = naive_forward(cfg, wf, tokens, true, ks2, vs2);
    o.naive = n1.cast<double>();
    o.logit_est = estimate(o.logits, n1, n2);
    for (size_t l = 0; l < ks.size(); ++l) {
        o.k_est.push_back(estimate(o.k[l], ks[l], ks2[l]));
        o.v_est.push_back(estimate(o.v[l], vs[l], vs2[l]));
    }
    return o;
}

double allowed(const ref::Mat<double>& exact, const std::vector<double>& est, Eigen::Index row) {
    const double scale = std::max(1.0, exact.row(row).cwiseAbs().maxCoeff());
    return kSafety * est[static_cast<size_t>(row)] + kFloor * scale;
}

} // namespace kvc::model
