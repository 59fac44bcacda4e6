// kvcheck reference transformer.
//
// What it is: a plain, decoder-only transformer in Eigen that recomputes full causal attention over the whole
// prefix at every generation step. There is no KV cache anywhere in it: every forward pass projects Q, K and V for
// every token of the prefix again. That is the point. The optimized engines and third-party caches are proven
// equal to this, so it has to be readable against the documents by hand.
//
// What it refuses to do: cache anything between calls, reorder reductions for speed, use SIMD or threads, or
// accept a config it cannot describe (ModelConfig::validate throws ConfigError).
//
// Templated on the scalar: float, double and long double. The long double instantiation is the oracle that the
// tolerance policy (docs/tolerance.md) measures every implementation against.
//
// Shapes (T tokens, D = d_model, Hq/Hkv query/KV heads, d = head_dim, F = d_ff, V = vocab):
//   embedding [V x D], x [T x D]
//   W_Q [D x Hq*d], W_K, W_V [D x Hkv*d], W_O [Hq*d x D]
//   W_gate, W_up [D x F], W_down [F x D], W_U [D x V] (or, tied, the embedding transposed)
#pragma once

#include "kvcheck/reference/attention.hpp"
#include "kvcheck/reference/config.hpp"
#include "kvcheck/reference/rope.hpp"

#include <Eigen/Dense>

#include <cstdint>
#include <vector>

namespace kvc::ref {

template <typename S>
using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

template <typename S>
struct LayerWeights {
    Mat<S> w_q;             // [D x Hq*d]
    Mat<S> w_k;             // [D x Hkv*d]
    Mat<S> w_v;             // [D x Hkv*d]
    Mat<S> w_o;             // [Hq*d x D]   (out_proj)
    RowVec<S> rms_attn;     // [D]          (rmsnorm)
    RowVec<S> rms_mlp;      // [D]          (rmsnorm and mlp)
    Mat<S> w_gate, w_up;    // [D x F]      (mlp)
    Mat<S> w_down;          // [F x D]      (mlp)
};

template <typename S>
struct Weights {
    Mat<S> embedding;                    // [V x D]
    std::vector<LayerWeights<S>> layers; // [n_layers]
    RowVec<S> rms_final;                 // [D]      (rmsnorm and unembed)
    Mat<S> w_unembed;                    // [D x V]  (unembed and not tied; tied uses embeddingᵀ)

    template <typename T>
    Weights<T> cast() const {
        Weights<T> w;
        w.embedding = embedding.template cast<T>();
        for (const auto& l : layers) {
            LayerWeights<T> c;
            c.w_q = l.w_q.template cast<T>();
            c.w_k = l.w_k.template cast<T>();
            c.w_v = l.w_v.template cast<T>();
            c.w_o = l.w_o.template cast<T>();
            c.rms_attn = l.rms_attn.template cast<T>();
            c.rms_mlp = l.rms_mlp.template cast<T>();
            c.w_gate = l.w_gate.template cast<T>();
            c.w_up = l.w_up.template cast<T>();
            c.w_down = l.w_down.template cast<T>();
            w.layers.push_back(std::move(c));
        }
        w.rms_final = rms_final.template cast<T>();
        w.w_unembed = w_unembed.template cast<T>();
        return w;
    }
};

// Deterministic weights from a seed: every entry N(0, 1/fan_in), norms at 1. The same seed gives the same weights
// on every platform (own Box-Muller over splitmix64, not std::normal_distribution).
Weights<double> random_weights(const ModelConfig& cfg, uint64_t seed);

// Throws ConfigError when the weights' shapes do not match the config.
template <typename S>
void check_shapes(const ModelConfig& cfg, const Weights<S>& w);

// Everything one layer computed over the whole prefix.
template <typename S>
struct LayerTrace {
    Mat<S> input;                         // [T x D]      the layer's input (the embeddings for layer 0)
    Mat<S> q, k, v;                       // [T x H*d]    projections, q and k after RoPE
    std::vector<HeadAttention<S>> heads;  // [Hq]         per query head: dots, scores, weights, out
    Mat<S> attn;                          // [T x Hq*d]   heads concatenated
    Mat<S> output;                        // [T x D]      the layer's output (next layer's input)
};

template <typename S>
struct ForwardTrace {
    std::vector<LayerTrace<S>> layers;
    Mat<S> logits;        // [T x V] (empty without unembed)
    int next_token = -1;  // argmax of the last row of logits; -1 without unembed
    long kv_projections = 0; // tokens whose K and V this pass projected (per layer): T, since nothing is cached
};

// One full forward pass over a whole prefix. x: [T x D].
template <typename S>
ForwardTrace<S> forward(const ModelConfig& cfg, const Weights<S>& w, const Mat<S>& x);

// Rows of the embedding table for token ids: [T x D]. Throws std::out_of_range for an id outside the vocabulary.
template <typename S>
Mat<S> embed(const Weights<S>& w, const std::vector<int>& tokens);

// Greedy generation by full recompute. Each step runs forward() over the entire prefix, takes the last position's
// argmax (or forced[step] when given: the documents print tokens the toy model's missing layers would choose)
// and appends it. n_steps forward passes; kv_projections sums their prefix lengths.
template <typename S>
struct Generation {
    std::vector<int> tokens;             // prompt followed by the generated tokens
    std::vector<ForwardTrace<S>> steps;  // one per forward pass
    long kv_projections = 0;
};

template <typename S>
Generation<S> generate(const ModelConfig& cfg, const Weights<S>& w, const std::vector<int>& prompt, int n_steps,
                       const std::vector<int>& forced = {});

} // namespace kvc::ref

#include "kvcheck/reference/model_impl.hpp"
