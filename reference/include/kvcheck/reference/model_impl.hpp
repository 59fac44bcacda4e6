// Definitions of the templates declared in model.hpp. Read model.hpp first.
#pragma once

#include <stdexcept>
#include <string>

namespace kvc::ref {

namespace detail {

inline void expect_shape(const char* name, Eigen::Index rows, Eigen::Index cols, Eigen::Index want_rows,
                         Eigen::Index want_cols) {
    if (rows != want_rows || cols != want_cols)
        throw ConfigError(std::string("weights: ") + name + " is [" + std::to_string(rows) + " x " +
                          std::to_string(cols) + "], the config needs [" + std::to_string(want_rows) + " x " +
                          std::to_string(want_cols) + "]");
}

// RMSNorm of every row: x / sqrt(mean(x^2) + eps) * g.   x: [T x D], g: [D]
template <typename S>
Mat<S> rmsnorm(const Mat<S>& x, const RowVec<S>& g, double eps) {
    Mat<S> y(x.rows(), x.cols());
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
        const S ms = x.row(t).squaredNorm() / static_cast<S>(x.cols());
        const S inv = S(1) / std::sqrt(ms + static_cast<S>(eps));
        y.row(t) = (x.row(t) * inv).cwiseProduct(g);
    }
    return y;
}

// SwiGLU: (silu(x W_gate) ⊙ (x W_up)) W_down.   x: [T x D] -> [T x D]
template <typename S>
Mat<S> swiglu(const Mat<S>& x, const LayerWeights<S>& l) {
    Mat<S> gate = x * l.w_gate; // [T x F]
    const Mat<S> up = x * l.w_up;
    for (Eigen::Index i = 0; i < gate.size(); ++i) {
        const S g = gate.data()[i];
        gate.data()[i] = g / (S(1) + std::exp(-g));
    }
    return gate.cwiseProduct(up) * l.w_down;
}

} // namespace detail

template <typename S>
void check_shapes(const ModelConfig& cfg, const Weights<S>& w) {
    using detail::expect_shape;
    const Eigen::Index D = cfg.d_model, d = cfg.head_dim, q = cfg.n_q_heads * d, kv = cfg.n_kv_heads * d;
    expect_shape("embedding", w.embedding.rows(), w.embedding.cols(), cfg.vocab, D);
    if (static_cast<int>(w.layers.size()) != cfg.n_layers)
        throw ConfigError("weights: " + std::to_string(w.layers.size()) + " layers, the config has " +
                          std::to_string(cfg.n_layers));
    for (const auto& l : w.layers) {
        expect_shape("w_q", l.w_q.rows(), l.w_q.cols(), D, q);
        expect_shape("w_k", l.w_k.rows(), l.w_k.cols(), D, kv);
        expect_shape("w_v", l.w_v.rows(), l.w_v.cols(), D, kv);
        if (cfg.out_proj) expect_shape("w_o", l.w_o.rows(), l.w_o.cols(), q, D);
        if (cfg.rmsnorm) expect_shape("rms_attn", 1, l.rms_attn.cols(), 1, D);
        if (cfg.mlp) {
            expect_shape("w_gate", l.w_gate.rows(), l.w_gate.cols(), D, cfg.d_ff);
            expect_shape("w_up", l.w_up.rows(), l.w_up.cols(), D, cfg.d_ff);
            expect_shape("w_down", l.w_down.rows(), l.w_down.cols(), cfg.d_ff, D);
            if (cfg.rmsnorm) expect_shape("rms_mlp", 1, l.rms_mlp.cols(), 1, D);
        }
    }
    if (cfg.unembed) {
        if (!cfg.tied) expect_shape("w_unembed", w.w_unembed.rows(), w.w_unembed.cols(), D, cfg.vocab);
        if (cfg.rmsnorm) expect_shape("rms_final", 1, w.rms_final.cols(), 1, D);
    }
}

template <typename S>
Mat<S> embed(const Weights<S>& w, const std::vector<int>& tokens) {
    Mat<S> x(static_cast<Eigen::Index>(tokens.size()), w.embedding.cols());
    for (size_t t = 0; t < tokens.size(); ++t) {
        if (tokens[t] < 0 || tokens[t] >= w.embedding.rows())
            throw std::out_of_range("token id " + std::to_string(tokens[t]) + " outside the vocabulary of " +
                                    std::to_string(w.embedding.rows()));
        x.row(static_cast<Eigen::Index>(t)) = w.embedding.row(tokens[t]);
    }
    return x;
}

template <typename S>
ForwardTrace<S> forward(const ModelConfig& cfg, const Weights<S>& w, const Mat<S>& x) {
    cfg.validate();
    check_shapes(cfg, w);
    const int d = cfg.head_dim, Hq = cfg.n_q_heads, Hkv = cfg.n_kv_heads;
    const Eigen::Index T = x.rows();
    const S scale = static_cast<S>(cfg.attention_scale());

    ForwardTrace<S> trace;
    trace.kv_projections = static_cast<long>(T);
    Mat<S> h = x; // [T x D] the residual stream
    for (int li = 0; li < cfg.n_layers; ++li) {
        const LayerWeights<S>& l = w.layers[static_cast<size_t>(li)];
        LayerTrace<S> lt;
        lt.input = h;

        // project: every token of the prefix, again (no cache)
        const Mat<S> a = cfg.rmsnorm ? detail::rmsnorm<S>(h, l.rms_attn, cfg.rms_eps) : h;
        lt.q = a * l.w_q; // [T x Hq*d]
        lt.k = a * l.w_k; // [T x Hkv*d]
        lt.v = a * l.w_v; // [T x Hkv*d]

        // rotate: token t's q and k by position t
        for (Eigen::Index t = 0; t < T; ++t) {
            for (int hh = 0; hh < Hq; ++hh) apply_rope(lt.q.row(t).data() + hh * d, d, t, cfg.rope, cfg.rope_theta);
            for (int hh = 0; hh < Hkv; ++hh) apply_rope(lt.k.row(t).data() + hh * d, d, t, cfg.rope, cfg.rope_theta);
        }

        // attend: query head hh reads KV head hh / group, causal over the whole prefix
        lt.attn.resize(T, static_cast<Eigen::Index>(Hq) * d);
        for (int hh = 0; hh < Hq; ++hh) {
            const int g = hh / cfg.group_size();
            lt.heads.push_back(attend_head<S>(lt.q.middleCols(hh * d, d), lt.k.middleCols(g * d, d),
                                              lt.v.middleCols(g * d, d), scale));
            lt.attn.middleCols(hh * d, d) = lt.heads.back().out;
        }

        // the rest of the layer: output projection, residual, MLP
        Mat<S> o = cfg.out_proj ? Mat<S>(lt.attn * l.w_o) : lt.attn;
        h = cfg.residual ? Mat<S>(h + o) : o;
        if (cfg.mlp) {
            const Mat<S> m = detail::swiglu<S>(cfg.rmsnorm ? detail::rmsnorm<S>(h, l.rms_mlp, cfg.rms_eps) : h, l);
            h = cfg.residual ? Mat<S>(h + m) : m;
        }
        lt.output = h;
        trace.layers.push_back(std::move(lt));
    }

    if (cfg.unembed) {
        const Mat<S> f = cfg.rmsnorm ? detail::rmsnorm<S>(h, w.rms_final, cfg.rms_eps) : h;
        // tied: the embedding table [V x D] read as its transpose, so logit v = f · embedding row v
        trace.logits = cfg.tied ? Mat<S>(f * w.embedding.transpose()) : Mat<S>(f * w.w_unembed); // [T x V]
        Eigen::Index best = 0;
        trace.logits.row(T - 1).maxCoeff(&best); // first maximum on ties
        trace.next_token = static_cast<int>(best);
    }
    return trace;
}

template <typename S>
Generation<S> generate(const ModelConfig& cfg, const Weights<S>& w, const std::vector<int>& prompt, int n_steps,
                       const std::vector<int>& forced) {
    if (prompt.empty()) throw std::invalid_argument("generate: the prompt must hold at least one token");
    Generation<S> g;
    g.tokens = prompt;
    for (int step = 0; step < n_steps; ++step) {
        g.steps.push_back(forward<S>(cfg, w, embed<S>(w, g.tokens))); // the whole prefix, every step
        g.kv_projections += g.steps.back().kv_projections;
        int next = g.steps.back().next_token;
        if (static_cast<size_t>(step) < forced.size()) next = forced[static_cast<size_t>(step)];
        if (next < 0) throw std::invalid_argument("generate: the model has no unembedding and no forced token");
        g.tokens.push_back(next);
    }
    return g;
}

} // namespace kvc::ref
