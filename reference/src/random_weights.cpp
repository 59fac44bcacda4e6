// Seeded weights for the reference model: platform-independent, so golden files and property seeds replay anywhere.
#include "kvcheck/reference/model.hpp"
#include "kvcheck/reference/splitmix64.hpp"

#include <cmath>

namespace kvc::ref {
namespace {

// Normal draws from splitmix64: tiny, well-mixed, identical on every platform.
struct NormalRng {
    SplitMix64 bits;
    double uniform() { return (static_cast<double>(bits.next() >> 11) + 0.5) * 0x1.0p-53; } // (0, 1)
    double normal() { // Box-Muller, one value per call
        const double u1 = uniform(), u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
    }
};

Mat<double> gaussian(NormalRng& rng, Eigen::Index rows, Eigen::Index cols, double stddev) {
    Mat<double> m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = rng.normal() * stddev;
    return m;
}

} // namespace

Weights<double> random_weights(const ModelConfig& cfg, uint64_t seed) {
    cfg.validate();
    NormalRng rng{{seed}};
    const Eigen::Index D = cfg.d_model, d = cfg.head_dim, q = cfg.n_q_heads * d, kv = cfg.n_kv_heads * d;
    const double in_D = 1.0 / std::sqrt(static_cast<double>(D));
    Weights<double> w;
    w.embedding = gaussian(rng, cfg.vocab, D, 1.0);
    for (int l = 0; l < cfg.n_layers; ++l) {
        LayerWeights<double> lw;
        lw.w_q = gaussian(rng, D, q, in_D);
        lw.w_k = gaussian(rng, D, kv, in_D);
        lw.w_v = gaussian(rng, D, kv, in_D);
        if (cfg.out_proj) lw.w_o = gaussian(rng, q, D, 1.0 / std::sqrt(static_cast<double>(q)));
        if (cfg.rmsnorm) lw.rms_attn = RowVec<double>::Ones(D);
        if (cfg.mlp) {
            lw.w_gate = gaussian(rng, D, cfg.d_ff, in_D);
            lw.w_up = gaussian(rng, D, cfg.d_ff, in_D);
            lw.w_down = gaussian(rng, cfg.d_ff, D, 1.0 / std::sqrt(static_cast<double>(cfg.d_ff)));
            if (cfg.rmsnorm) lw.rms_mlp = RowVec<double>::Ones(D);
        }
        w.layers.push_back(std::move(lw));
    }
    if (cfg.unembed) {
        if (!cfg.tied) w.w_unembed = gaussian(rng, D, cfg.vocab, in_D); // drawn last: tied leaves the rest as is
        if (cfg.rmsnorm) w.rms_final = RowVec<double>::Ones(D);
    }
    return w;
}

} // namespace kvc::ref
