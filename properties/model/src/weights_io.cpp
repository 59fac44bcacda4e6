#include "kvcheck/model/weights_io.hpp"
#include "kvcheck/reference/splitmix64.hpp"
#include "kvcheck/strict_json.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

namespace kvc::model {
namespace {

using ref::ConfigError;
using Matd = ref::Mat<double>;
using Named = std::vector<std::pair<std::string, Matd>>;

// The weights as stored: [out_features x in_features] (the transpose of the reference's x·W matrices), norms as
// one row, in the order the file lists them.
Named stored_tensors(const ref::ModelConfig& cfg, const ref::Weights<double>& w) {
    Named t;
    t.emplace_back("model.embed_tokens.weight", w.embedding);
    for (int l = 0; l < cfg.n_layers; ++l) {
        const auto& lw = w.layers[static_cast<size_t>(l)];
        const std::string p = "model.layers." + std::to_string(l) + ".";
        t.emplace_back(p + "input_layernorm.weight", lw.rms_attn);
        t.emplace_back(p + "self_attn.q_proj.weight", lw.w_q.transpose());
        t.emplace_back(p + "self_attn.k_proj.weight", lw.w_k.transpose());
        t.emplace_back(p + "self_attn.v_proj.weight", lw.w_v.transpose());
        t.emplace_back(p + "self_attn.o_proj.weight", lw.w_o.transpose());
        t.emplace_back(p + "post_attention_layernorm.weight", lw.rms_mlp);
        t.emplace_back(p + "mlp.gate_proj.weight", lw.w_gate.transpose());
        t.emplace_back(p + "mlp.up_proj.weight", lw.w_up.transpose());
        t.emplace_back(p + "mlp.down_proj.weight", lw.w_down.transpose());
    }
    t.emplace_back("model.norm.weight", w.rms_final);
    if (!cfg.tied) t.emplace_back("lm_head.weight", w.w_unembed.transpose());
    return t;
}

// The shapes the config needs, by name, in the same order.
std::vector<std::pair<std::string, std::vector<uint64_t>>> expected_shapes(const ref::ModelConfig& cfg) {
    ref::Weights<double> zero; // shapes only: build zero matrices of the right size and reuse stored_tensors
    const Eigen::Index D = cfg.d_model, F = cfg.d_ff, q = cfg.n_q_heads * cfg.head_dim, kv = cfg.n_kv_heads * cfg.head_dim;
    zero.embedding = Matd::Zero(cfg.vocab, D);
    for (int l = 0; l < cfg.n_layers; ++l) {
        ref::LayerWeights<double> lw;
        lw.w_q = Matd::Zero(D, q);
        lw.w_k = Matd::Zero(D, kv);
        lw.w_v = Matd::Zero(D, kv);
        lw.w_o = Matd::Zero(q, D);
        lw.rms_attn = ref::RowVec<double>::Zero(D);
        lw.rms_mlp = ref::RowVec<double>::Zero(D);
        lw.w_gate = Matd::Zero(D, F);
        lw.w_up = Matd::Zero(D, F);
        lw.w_down = Matd::Zero(F, D);
        zero.layers.push_back(std::move(lw));
    }
    zero.rms_final = ref::RowVec<double>::Zero(D);
    if (!cfg.tied) zero.w_unembed = Matd::Zero(D, cfg.vocab);
    std::vector<std::pair<std::string, std::vector<uint64_t>>> out;
    for (const auto& [name, m] : stored_tensors(cfg, zero)) {
        const bool vector = name.find("norm") != std::string::npos;
        out.emplace_back(name, vector ? std::vector<uint64_t>{uint64_t(m.cols())}
                                      : std::vector<uint64_t>{uint64_t(m.rows()), uint64_t(m.cols())});
    }
    return out;
}

std::string shape_text(const std::vector<uint64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

void put_f32(std::string& out, double v) {
    const float f = static_cast<float>(v);
    char b[4];
    std::memcpy(b, &f, 4);
    out.append(b, 4);
}

void put_i32(std::string& out, int32_t v) {
    char b[4];
    std::memcpy(b, &v, 4);
    out.append(b, 4);
}

// Row-major elements of m, as f32.
void put_matrix(std::string& out, const Matd& m) {
    for (Eigen::Index r = 0; r < m.rows(); ++r)
        for (Eigen::Index c = 0; c < m.cols(); ++c) put_f32(out, m(r, c));
}

// A normal draw (Box-Muller) for the norm gains, from a splitmix64 stream of their own.
double normal(SplitMix64& s) {
    const double u1 = (static_cast<double>(s.next() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (static_cast<double>(s.next() >> 11) + 0.5) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2);
}

template <typename M>
void round_to_f32(M& m) {
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<double>(static_cast<float>(m.data()[i]));
}

} // namespace

ref::ModelConfig config_of(const kvcm_model_desc& d) {
    if (d.struct_size < sizeof(kvcm_model_desc))
        throw ConfigError("model description: struct_size " + std::to_string(d.struct_size) + " is smaller than " +
                          std::to_string(sizeof(kvcm_model_desc)) + " (ABI 1.0)");
    if (d.rope > KVC_ROPE_GPTJ) throw ConfigError("model description: rope " + std::to_string(d.rope) + " is not a kvc_rope");
    if (d.cache_dtype > KVC_DTYPE_BF16)
        throw ConfigError("model description: cache_dtype " + std::to_string(d.cache_dtype) + " is not a kvc_dtype");
    if (d.tied > 1) throw ConfigError("model description: tied must be 0 or 1");
    if (!(d.rms_eps > 0) || !std::isfinite(d.rms_eps)) throw ConfigError("model description: rms_eps must be positive");
    if (d.max_context == 0) throw ConfigError("model description: max_context must be positive");
    if (d.max_seqs == 0) throw ConfigError("model description: max_seqs must be positive");
    const uint32_t big = 1u << 20; // keeps every product below in range; no model here comes near it
    for (uint32_t v : {d.dim, d.hidden_dim, d.n_layers, d.n_heads, d.n_kv_heads, d.head_dim, d.vocab_size})
        if (v > big) throw ConfigError("model description: a size above 2^20 (" + std::to_string(v) + ")");
    ref::ModelConfig c;
    c.d_model = static_cast<int>(d.dim);
    c.n_layers = static_cast<int>(d.n_layers);
    c.n_q_heads = static_cast<int>(d.n_heads);
    c.n_kv_heads = static_cast<int>(d.n_kv_heads);
    c.head_dim = static_cast<int>(d.head_dim);
    c.vocab = static_cast<int>(d.vocab_size);
    c.rope = static_cast<ref::Rope>(d.rope);
    c.rope_theta = static_cast<double>(d.rope_theta); // the f32 value, exactly
    c.rmsnorm = true;
    c.rms_eps = static_cast<double>(d.rms_eps);       // the f32 value, exactly
    c.mlp = true;
    c.d_ff = static_cast<int>(d.hidden_dim);
    c.out_proj = true;
    c.residual = true;
    c.unembed = true;
    c.tied = d.tied != 0;
    c.validate();
    return c;
}

std::string describe(const kvcm_model_desc& d) {
    static const char* ropes[] = {"none", "neox", "gptj"};
    std::ostringstream s;
    s << "dim " << d.dim << ", hidden_dim " << d.hidden_dim << ", n_layers " << d.n_layers << ", n_heads "
      << d.n_heads << ", n_kv_heads " << d.n_kv_heads << ", head_dim " << d.head_dim << ", vocab " << d.vocab_size
      << ", rope " << (d.rope <= 2 ? ropes[d.rope] : "?") << ", theta " << d.rope_theta << ", eps " << d.rms_eps
      << ", " << (d.tied ? "tied" : "separate") << " classifier, max_context " << d.max_context << ", max_seqs "
      << d.max_seqs;
    return s.str();
}

ref::Weights<double> draw_weights(const ref::ModelConfig& cfg, uint64_t seed, double embed_rms) {
    ref::Weights<double> w = ref::random_weights(cfg, seed);
    if (embed_rms > 0)
        for (Eigen::Index t = 0; t < w.embedding.rows(); ++t) {
            const double rms = std::sqrt(w.embedding.row(t).squaredNorm() / static_cast<double>(w.embedding.cols()));
            if (rms > 0) w.embedding.row(t) *= embed_rms / rms;
        }
    SplitMix64 s{seed ^ 0x6E6F726D5F67616Eull}; // the gains' own stream: the other entries stay the reference's
    auto gains = [&](ref::RowVec<double>& g) {
        for (Eigen::Index i = 0; i < g.size(); ++i) g(i) = 1.0 + 0.2 * normal(s);
    };
    for (auto& l : w.layers) {
        gains(l.rms_attn);
        gains(l.rms_mlp);
    }
    gains(w.rms_final);
    round_to_f32(w.embedding);
    for (auto& l : w.layers) {
        for (Matd* m : {&l.w_q, &l.w_k, &l.w_v, &l.w_o, &l.w_gate, &l.w_up, &l.w_down}) round_to_f32(*m);
        round_to_f32(l.rms_attn);
        round_to_f32(l.rms_mlp);
    }
    round_to_f32(w.rms_final);
    round_to_f32(w.w_unembed);
    return w;
}

std::string write_safetensors(const ref::ModelConfig& cfg, const ref::Weights<double>& w) {
    ref::check_shapes(cfg, w);
    const Named tensors = stored_tensors(cfg, w);
    const auto shapes = expected_shapes(cfg);
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    header["__metadata__"] = {{"format", "pt"}, {"writer", "kvcheck model level"}};
    std::string data;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const uint64_t begin = data.size();
        put_matrix(data, tensors[i].second);
        header[tensors[i].first] = {{"dtype", "F32"}, {"shape", shapes[i].second},
                                    {"data_offsets", {begin, uint64_t(data.size())}}};
    }
    std::string h = header.dump();
    while (h.size() % 8 != 0) h.push_back(' '); // the format pads the header with spaces to 8 bytes
    std::string out;
    const uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
    return out + h + data;
}

ref::Weights<double> read_safetensors(const std::string& bytes, const ref::ModelConfig& cfg) {
    const std::string what = "safetensors: ";
    if (bytes.size() < 8) throw ConfigError(what + "file of " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
    if (n > bytes.size() - 8)
        throw ConfigError(what + "header length " + std::to_string(n) + " runs past the end of the file (" +
                          std::to_string(bytes.size()) + " bytes)");
    nlohmann::json header;
    try {
        header = json_strict::parse(bytes.substr(8, static_cast<size_t>(n)));
    } catch (const json_strict::Violation& v) {
        throw ConfigError(what + "header: " + v.what() + (v.pointer().empty() ? "" : " at " + v.pointer()));
    } catch (const nlohmann::json::exception&) {
        throw ConfigError(what + "the header is not a JSON object");
    }
    if (!header.is_object()) throw ConfigError(what + "the header is not a JSON object");
    const uint64_t data_size = bytes.size() - 8 - n;
    const char* data = bytes.data() + 8 + n;

    std::map<std::string, Matd> found;
    const auto shapes = expected_shapes(cfg);
    for (const auto& [name, shape] : shapes) {
        auto it = header.find(name);
        if (it == header.end())
            throw ConfigError(what + "tensor \"" + name + "\" is missing" +
                              (name == "lm_head.weight" ? " (the description says the classifier is separate)" : ""));
        const nlohmann::json& t = *it;
        if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
            throw ConfigError(what + "tensor \"" + name + "\" needs dtype, shape and data_offsets");
        if (t["dtype"] != "F32")
            throw ConfigError(what + "tensor \"" + name + "\" has dtype " + t["dtype"].dump() + ", the model level reads F32");
        std::vector<uint64_t> got;
        if (!t["shape"].is_array()) throw ConfigError(what + "tensor \"" + name + "\": shape is not an array");
        for (const auto& e : t["shape"]) {
            if (!e.is_number_unsigned()) throw ConfigError(what + "tensor \"" + name + "\": shape holds a non-integer");
            got.push_back(e.get<uint64_t>());
        }
        if (got != shape)
            throw ConfigError(what + "tensor \"" + name + "\" is " + shape_text(got) + ", the description needs " +
                              shape_text(shape));
        const auto& off = t["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            throw ConfigError(what + "tensor \"" + name + "\": data_offsets must be two non-negative integers");
        const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
        uint64_t elements = 1;
        for (uint64_t d : shape) elements *= d; // bounded: config_of keeps sizes below 2^20 and shapes are 2-D
        if (b > e || e > data_size || e - b != elements * 4)
            throw ConfigError(what + "tensor \"" + name + "\": data_offsets [" + std::to_string(b) + ", " +
                              std::to_string(e) + "] do not hold " + std::to_string(elements) + " f32 values inside " +
                              std::to_string(data_size) + " data bytes");
        const Eigen::Index rows = shape.size() == 1 ? 1 : static_cast<Eigen::Index>(shape[0]);
        const Eigen::Index cols = static_cast<Eigen::Index>(shape.back());
        Matd m(rows, cols);
        for (Eigen::Index i = 0; i < m.size(); ++i) {
            float f;
            std::memcpy(&f, data + b + 4 * static_cast<uint64_t>(i), 4);
            if (!std::isfinite(f)) throw ConfigError(what + "tensor \"" + name + "\" holds a NaN or infinity");
            m.data()[i] = f;
        }
        found[name] = std::move(m);
    }
    for (auto it = header.begin(); it != header.end(); ++it)
        if (it.key() != "__metadata__" && !found.count(it.key()))
            throw ConfigError(what + "tensor \"" + it.key() + "\" is not part of this model" +
                              (it.key() == "lm_head.weight" ? " (the description says the classifier is tied)" : ""));

    ref::Weights<double> w;
    w.embedding = found["model.embed_tokens.weight"];
    for (int l = 0; l < cfg.n_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        ref::LayerWeights<double> lw;
        lw.rms_attn = found[p + "input_layernorm.weight"];
        lw.w_q = found[p + "self_attn.q_proj.weight"].transpose();
        lw.w_k = found[p + "self_attn.k_proj.weight"].transpose();
        lw.w_v = found[p + "self_attn.v_proj.weight"].transpose();
        lw.w_o = found[p + "self_attn.o_proj.weight"].transpose();
        lw.rms_mlp = found[p + "post_attention_layernorm.weight"];
        lw.w_gate = found[p + "mlp.gate_proj.weight"].transpose();
        lw.w_up = found[p + "mlp.up_proj.weight"].transpose();
        lw.w_down = found[p + "mlp.down_proj.weight"].transpose();
        w.layers.push_back(std::move(lw));
    }
    w.rms_final = found["model.norm.weight"];
    if (!cfg.tied) w.w_unembed = found["lm_head.weight"].transpose();
    ref::check_shapes(cfg, w);
    return w;
}

std::string write_flat_f32(const ref::ModelConfig& cfg, const ref::Weights<double>& w, uint32_t seq_len) {
    ref::check_shapes(cfg, w);
    if (cfg.n_q_heads * cfg.head_dim != cfg.d_model)
        throw ConfigError("flat checkpoint: head_dim must be dim / n_heads (the header has no head_dim)");
    std::string out;
    for (int v : {cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.n_q_heads, cfg.n_kv_heads,
                  cfg.tied ? cfg.vocab : -cfg.vocab, static_cast<int>(seq_len)})
        put_i32(out, v);
    put_matrix(out, w.embedding);
    const auto each = [&](auto get) {
        for (const auto& l : w.layers) put_matrix(out, get(l));
    };
    using LW = ref::LayerWeights<double>;
    each([](const LW& l) { return Matd(l.rms_attn); });
    each([](const LW& l) { return Matd(l.w_q.transpose()); });
    each([](const LW& l) { return Matd(l.w_k.transpose()); });
    each([](const LW& l) { return Matd(l.w_v.transpose()); });
    each([](const LW& l) { return Matd(l.w_o.transpose()); });
    each([](const LW& l) { return Matd(l.rms_mlp); });
    each([](const LW& l) { return Matd(l.w_gate.transpose()); }); // w1
    each([](const LW& l) { return Matd(l.w_down.transpose()); }); // w2
    each([](const LW& l) { return Matd(l.w_up.transpose()); });   // w3
    put_matrix(out, w.rms_final);
    // two legacy tables the format keeps (RoPE cos/sin once precomputed): seq_len * head_dim / 2 values each, unused
    out.append(static_cast<size_t>(seq_len) * static_cast<size_t>(cfg.head_dim / 2) * 4 * 2, '\0');
    if (!cfg.tied) put_matrix(out, w.w_unembed.transpose());
    return out;
}

std::string read_file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw ConfigError("weights file " + path + ": cannot be opened");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (f.bad()) throw ConfigError("weights file " + path + ": read error");
    return s;
}

} // namespace kvc::model
