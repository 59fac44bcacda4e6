#include "kvcheck/optimized/model_engine.hpp"

#include "kvcheck/optimized/cpu_engine.h"

#include <cmath>
#include <stdexcept>

namespace kvc::opt {
namespace {

using Matf = ref::Mat<float>;
using RowVecf = ref::RowVec<float>;

kvc_config cache_config(const ref::ModelConfig& c, const ModelEngineOptions& o) {
    c.validate();
    kvc_config k{};
    k.struct_size = sizeof k;
    k.n_layers = static_cast<uint32_t>(c.n_layers);
    k.n_q_heads = static_cast<uint32_t>(c.n_q_heads);
    k.n_kv_heads = static_cast<uint32_t>(c.n_kv_heads);
    k.head_dim = static_cast<uint32_t>(c.head_dim);
    k.cache_dtype = o.cache_dtype;
    k.max_seqs = o.max_seqs;
    k.max_tokens = o.max_tokens;
    k.scale = static_cast<float>(c.attention_scale());
    k.rope = static_cast<uint32_t>(c.rope);
    k.rope_theta = static_cast<float>(c.rope_theta);
    k.block_size_hint = o.block_size;
    return k;
}

const kvc_plugin_api* engine_api() {
    const kvc_plugin_api* api = kvc_cpu_engine_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    if (api == nullptr) throw std::logic_error("the CPU engine does not speak this ABI version");
    return api;
}

// RMSNorm of every row: x / sqrt(mean(x^2) + eps) * g.
Matf rmsnorm(const Matf& x, const RowVecf& g, double eps) {
    Matf y(x.rows(), x.cols());
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
        const float ms = x.row(t).squaredNorm() / static_cast<float>(x.cols());
        y.row(t) = (x.row(t) * (1.0f / std::sqrt(ms + static_cast<float>(eps)))).cwiseProduct(g);
    }
    return y;
}

// SwiGLU: (silu(x W_gate) * (x W_up)) W_down.
Matf swiglu(const Matf& x, const ref::LayerWeights<float>& l) {
    Matf gate = x * l.w_gate;
    const Matf up = x * l.w_up;
    for (Eigen::Index i = 0; i < gate.size(); ++i) gate.data()[i] = gate.data()[i] / (1.0f + std::exp(-gate.data()[i]));
    return gate.cwiseProduct(up) * l.w_down;
}

} // namespace

ModelEngine::ModelEngine(const ref::ModelConfig& cfg, const ref::Weights<double>& weights, const ModelEngineOptions& opt)
    : cfg_(cfg), w_(weights.cast<float>()), cache_(engine_api(), cache_config(cfg, opt)) {
    ref::check_shapes(cfg_, weights);
}

std::vector<float> ModelEngine::forward(uint32_t seq, const std::vector<int>& tokens) {
    if (tokens.empty()) throw std::invalid_argument("forward: no tokens");
    const Eigen::Index T = static_cast<Eigen::Index>(tokens.size());
    Matf h(T, cfg_.d_model); // the residual stream of the new tokens only
    for (Eigen::Index t = 0; t < T; ++t) {
        const int id = tokens[static_cast<size_t>(t)];
        if (id < 0 || id >= cfg_.vocab) throw std::out_of_range("token id " + std::to_string(id) + " outside the vocabulary");
        h.row(t) = w_.embedding.row(id);
    }
    kv_projections_ += T; // K and V of these tokens, once; every earlier token's come from the cache
    for (int li = 0; li < cfg_.n_layers; ++li) {
        const ref::LayerWeights<float>& l = w_.layers[static_cast<size_t>(li)];
        // project: the new tokens only. Row-major [T x H*d] is the ABI's [T][H][d].
        const Matf a = cfg_.rmsnorm ? rmsnorm(h, l.rms_attn, cfg_.rms_eps) : h;
        const Matf q = a * l.w_q, k = a * l.w_k, v = a * l.w_v;
        // attend: the engine rotates q and k by their positions, appends k and v, attends causally over the cache
        Matf attn(T, static_cast<Eigen::Index>(cfg_.n_q_heads) * cfg_.head_dim);
        cache_.append_attend(seq, static_cast<uint32_t>(li), static_cast<uint32_t>(T), q.data(), k.data(), v.data(),
                             attn.data());
        // the rest of the layer, as in the reference
        const Matf o = cfg_.out_proj ? Matf(attn * l.w_o) : attn;
        h = cfg_.residual ? Matf(h + o) : o;
        if (cfg_.mlp) {
            const Matf m = swiglu(cfg_.rmsnorm ? rmsnorm(h, l.rms_mlp, cfg_.rms_eps) : h, l);
            h = cfg_.residual ? Matf(h + m) : m;
        }
    }
    if (!cfg_.unembed) return {};
    const Matf last = h.row(T - 1);
    const Matf f = cfg_.rmsnorm ? rmsnorm(last, w_.rms_final, cfg_.rms_eps) : last;
    const Matf logits = f * w_.w_unembed;
    return std::vector<float>(logits.data(), logits.data() + logits.size());
}

ModelEngine::Generation ModelEngine::generate(const std::vector<int>& prompt, int n_steps, uint32_t seq) {
    if (prompt.empty()) throw std::invalid_argument("generate: the prompt must hold at least one token");
    if (!cfg_.unembed) throw std::invalid_argument("generate: the model has no unembedding");
    Generation g;
    g.tokens = prompt;
    const long before = kv_projections_;
    std::vector<float> logits = forward(seq, prompt); // prefill
    for (int step = 0; step < n_steps; ++step) {
        int best = 0;
        for (int i = 1; i < static_cast<int>(logits.size()); ++i)
            if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i; // first maximum
        g.logits.push_back(std::move(logits));
        g.tokens.push_back(best);
        logits = forward(seq, {best}); // decode: one token through every layer, its K/V appended
    }
    g.kv_projections = kv_projections_ - before;
    return g;
}

} // namespace kvc::opt
