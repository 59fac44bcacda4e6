#include "kvcheck/model/model_case.hpp"
#include "kvcheck/reference/splitmix64.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace kvc::model {
namespace {

struct Rng {
    SplitMix64 bits;
    uint64_t next() { return bits.next(); }
    int in(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1)); } // [lo, hi]
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    template <typename T>
    T pick(const std::vector<T>& v) { return v[next() % v.size()]; }
};

uint32_t cap(uint32_t declared, uint32_t ours) { return declared == 0 ? ours : std::min(declared, ours); }

std::vector<int> tokens(Rng& r, int n, int vocab) {
    std::vector<int> t(static_cast<size_t>(n));
    for (int& x : t) x = r.in(0, vocab - 1);
    return t;
}

std::string list(const std::vector<int>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

} // namespace

ModelCase draw_case(uint64_t seed, const kvcm_caps& caps) {
    Rng r{{seed}};
    ModelCase c;
    c.seed = seed;
    kvcm_model_desc& d = c.desc;
    d.struct_size = sizeof d;
    const bool free_head_dim = (caps.features & KVCM_FEATURE_FREE_HEAD_DIM) != 0;

    using B = CaseBounds;
    d.n_layers = static_cast<uint32_t>(r.in(1, static_cast<int>(cap(caps.max_layers, B::layers))));
    // heads: KV heads and a group size (1 = MHA, n_kv_heads 1 = MQA), within both head limits
    const int max_kv = static_cast<int>(cap(caps.max_kv_heads, B::kv_heads));
    d.n_kv_heads = static_cast<uint32_t>(r.in(1, max_kv));
    const int max_group = std::max(1, static_cast<int>(cap(caps.max_heads, B::heads) / d.n_kv_heads));
    d.n_heads = d.n_kv_heads * static_cast<uint32_t>(r.in(1, std::min(4, max_group)));

    std::vector<uint32_t> ropes;
    for (uint32_t v : {uint32_t(KVC_ROPE_NONE), uint32_t(KVC_ROPE_NEOX), uint32_t(KVC_ROPE_GPTJ)})
        if (caps.rope_variants & (1u << v)) ropes.push_back(v);
    if (ropes.empty()) ropes.push_back(KVC_ROPE_NONE); // the caps check already refused a table without variants
    d.rope = r.pick(ropes);
    const uint32_t max_hd = cap(caps.max_head_dim, B::head_dim);
    // n_heads * head_dim is d_model unless the head dim is free; a free one still keeps a declared max_dim
    const uint32_t max_heads_dim = !free_head_dim ? cap(caps.max_dim, 128) : caps.max_dim ? caps.max_dim : B::dim;
    std::vector<uint32_t> dims;
    for (uint32_t h : d.rope == KVC_ROPE_NONE ? std::vector<uint32_t>{1, 3, 4, 5, 8, 12, 16, 32}
                                              : std::vector<uint32_t>{2, 4, 6, 8, 12, 16, 32})
        if (h <= max_hd && d.n_heads * h <= max_heads_dim) dims.push_back(h);
    if (dims.empty()) dims.push_back(d.rope == KVC_ROPE_NONE ? 1 : 2);
    d.head_dim = r.pick(dims);
    d.dim = d.n_heads * d.head_dim;
    if (free_head_dim && cap(caps.max_dim, 64) >= 4 && r.in(0, 1) == 1)
        d.dim = static_cast<uint32_t>(r.in(4, static_cast<int>(cap(caps.max_dim, 64))));
    d.hidden_dim = static_cast<uint32_t>(r.in(std::min(4, static_cast<int>(cap(caps.max_hidden_dim, B::hidden_dim))),
                                              static_cast<int>(cap(caps.max_hidden_dim, B::hidden_dim))));
    d.vocab_size = r.pick(std::vector<uint32_t>{2, 7, 16, 31, 64, 100, B::vocab});
    d.vocab_size = std::min(d.vocab_size, cap(caps.max_vocab, B::vocab));

    const double log_theta = std::log(100.0) + r.uniform() * (std::log(1e6) - std::log(100.0));
    d.rope_theta = static_cast<float>(r.pick(std::vector<double>{10000.0, 100.0, 500000.0, 1e6, std::exp(log_theta)}));
    d.rms_eps = static_cast<float>(r.pick(std::vector<double>{1e-5, 1e-6, 1e-4, 1e-2, 0.1}));
    // what the engine fixes replaces the draw (drawn anyway, so that the rest of the case is the same either way)
    if (caps.struct_size > KVCM_CAPS_SIZE_1_0 && caps.fixed_rope_theta > 0) d.rope_theta = caps.fixed_rope_theta;
    if (caps.struct_size > KVCM_CAPS_SIZE_1_0 && caps.fixed_rms_eps > 0) d.rms_eps = caps.fixed_rms_eps;
    { // the small-norm regime, from its own stream: the cases of a seed stay those drawn before it existed
        Rng small{{seed ^ 0x736D616C6C6E6F72ull}};
        if (small.in(0, 1) == 1)
            c.embed_rms = std::sqrt(static_cast<double>(d.rms_eps)) * small.pick(std::vector<double>{0.5, 1.0, 2.0});
    }
    const bool tied_ok = (caps.features & KVCM_FEATURE_TIED) != 0, untied_ok = (caps.features & KVCM_FEATURE_UNTIED) != 0;
    d.tied = tied_ok && (!untied_ok || r.in(0, 1) == 1) ? 1u : 0u;
    d.cache_dtype = KVC_DTYPE_F32;
    d.max_seqs = cap(caps.max_seqs, B::seqs);
    d.max_context = cap(caps.max_context, r.pick(std::vector<uint32_t>{8, 16, 32, 48, B::context}));
    c.weights_format = (caps.weight_formats & (1u << KVCM_WEIGHTS_SAFETENSORS)) ? KVCM_WEIGHTS_SAFETENSORS
                                                                                 : KVCM_WEIGHTS_FLAT_F32;

    // histories: every one fits max_context
    const int ctx = static_cast<int>(d.max_context), V = static_cast<int>(d.vocab_size);
    const int p = r.in(1, std::max(1, ctx / 2)), p2 = r.in(1, std::max(1, ctx / 2));
    c.prompt = tokens(r, p, V);
    c.prompt2 = tokens(r, p2, V);
    c.n_steps = r.in(0, ctx - p);
    c.tail = tokens(r, r.in(0, ctx - p), V);
    c.tail2 = tokens(r, r.in(0, ctx - std::max(p, p2)), V); // follows prompt2 (RELEASE) or prompt (FORK)
    for (int left = p; left > 0;) { // chunk sizes: single tokens, small and large chunks
        const int n = std::min(left, r.pick(std::vector<int>{1, 1, 2, 3, 5, 8, 16, p}));
        c.chunks.push_back(n);
        left -= n;
    }
    return c;
}

std::string ModelCase::describe() const {
    std::ostringstream s;
    static const char* ropes[] = {"none", "neox", "gptj"};
    s << "case seed " << seed << ": dim " << desc.dim << ", hidden_dim " << desc.hidden_dim << ", n_layers "
      << desc.n_layers << ", n_heads " << desc.n_heads << ", n_kv_heads " << desc.n_kv_heads << ", head_dim "
      << desc.head_dim << ", vocab " << desc.vocab_size << ", rope " << (desc.rope <= 2 ? ropes[desc.rope] : "?")
      << " theta " << desc.rope_theta << ", eps " << desc.rms_eps;
    if (embed_rms > 0) s << " (embedding rows at rms " << embed_rms << ")";
    s << ", " << (desc.tied ? "tied" : "separate")
      << " classifier, max_context " << desc.max_context << "; prompt " << list(prompt) << ", " << n_steps
      << " greedy steps, chunks " << list(chunks) << ", tail " << list(tail) << ", prompt2 " << list(prompt2)
      << ", tail2 " << list(tail2);
    return s.str();
}

} // namespace kvc::model
