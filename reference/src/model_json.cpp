#include "kvcheck/reference/model_json.hpp"

#include <string>

namespace kvc::ref {
namespace {

using nlohmann::json;

const json& field(const json& j, const char* name) {
    if (!j.is_object()) throw ConfigError("model JSON: expected an object holding \"" + std::string(name) + "\"");
    auto it = j.find(name);
    if (it == j.end()) throw ConfigError(std::string("model JSON: missing field \"") + name + "\"");
    return *it;
}

int int_field(const json& j, const char* name) {
    const json& v = field(j, name);
    if (!v.is_number_integer()) throw ConfigError(std::string("model JSON: \"") + name + "\" must be an integer");
    return v.get<int>();
}

bool bool_field(const json& j, const char* name, bool fallback) {
    auto it = j.find(name);
    if (it == j.end()) return fallback;
    if (!it->is_boolean()) throw ConfigError(std::string("model JSON: \"") + name + "\" must be true or false");
    return it->get<bool>();
}

double number_field(const json& j, const char* name, double fallback) {
    auto it = j.find(name);
    if (it == j.end()) return fallback;
    if (!it->is_number()) throw ConfigError(std::string("model JSON: \"") + name + "\" must be a number");
    return it->get<double>();
}

RowVec<double> vector_from_json(const json& j, const std::string& what) {
    if (!j.is_array()) throw ConfigError("model JSON: " + what + " must be an array of numbers");
    RowVec<double> v(static_cast<Eigen::Index>(j.size()));
    for (size_t i = 0; i < j.size(); ++i) {
        if (!j[i].is_number()) throw ConfigError("model JSON: " + what + "[" + std::to_string(i) + "] is not a number");
        v(static_cast<Eigen::Index>(i)) = j[i].get<double>();
    }
    return v;
}

} // namespace

Mat<double> matrix_from_json(const json& j, const std::string& what) {
    if (!j.is_array() || j.empty()) throw ConfigError("model JSON: " + what + " must be a non-empty array of rows");
    const size_t cols = j[0].is_array() ? j[0].size() : 0;
    Mat<double> m(static_cast<Eigen::Index>(j.size()), static_cast<Eigen::Index>(cols));
    for (size_t r = 0; r < j.size(); ++r) {
        if (!j[r].is_array() || j[r].size() != cols)
            throw ConfigError("model JSON: " + what + " row " + std::to_string(r) + " is not an array of " +
                              std::to_string(cols) + " numbers");
        m.row(static_cast<Eigen::Index>(r)) = vector_from_json(j[r], what + "[" + std::to_string(r) + "]");
    }
    return m;
}

json matrix_to_json(const Mat<double>& m) {
    json rows = json::array();
    for (Eigen::Index r = 0; r < m.rows(); ++r) {
        json row = json::array();
        for (Eigen::Index c = 0; c < m.cols(); ++c) row.push_back(m(r, c));
        rows.push_back(row);
    }
    return rows;
}

ModelConfig config_from_json(const json& j) {
    ModelConfig c;
    c.d_model = int_field(j, "d_model");
    c.n_layers = int_field(j, "n_layers");
    c.n_q_heads = int_field(j, "n_q_heads");
    c.n_kv_heads = int_field(j, "n_kv_heads");
    c.head_dim = int_field(j, "head_dim");
    c.vocab = int_field(j, "vocab");
    if (j.contains("scale")) c.scale = number_field(j, "scale", 0);
    if (j.contains("rope")) {
        const json& r = j["rope"];
        const std::string s = r.is_string() ? r.get<std::string>() : "";
        if (s == "none") c.rope = Rope::None;
        else if (s == "neox") c.rope = Rope::NeoX;
        else if (s == "gptj") c.rope = Rope::GptJ;
        else throw ConfigError("model JSON: \"rope\" must be \"none\", \"neox\" or \"gptj\"");
    }
    c.rope_theta = number_field(j, "rope_theta", c.rope_theta);
    c.rmsnorm = bool_field(j, "rmsnorm", false);
    c.rms_eps = number_field(j, "rms_eps", c.rms_eps);
    c.mlp = bool_field(j, "mlp", false);
    if (j.contains("d_ff")) c.d_ff = int_field(j, "d_ff");
    c.out_proj = bool_field(j, "out_proj", false);
    c.residual = bool_field(j, "residual", false);
    c.unembed = bool_field(j, "unembed", false);
    c.tied = bool_field(j, "tied", false);
    c.validate();
    return c;
}

json config_to_json(const ModelConfig& c) {
    static const char* ropes[] = {"none", "neox", "gptj"};
    json j = {{"d_model", c.d_model},   {"n_layers", c.n_layers}, {"n_q_heads", c.n_q_heads},
              {"n_kv_heads", c.n_kv_heads}, {"head_dim", c.head_dim}, {"vocab", c.vocab},
              {"rope", ropes[static_cast<int>(c.rope)]}, {"rope_theta", c.rope_theta}, {"rmsnorm", c.rmsnorm},
              {"rms_eps", c.rms_eps}, {"mlp", c.mlp},  {"d_ff", c.d_ff}, {"out_proj", c.out_proj},
              {"residual", c.residual}, {"unembed", c.unembed}};
    if (c.scale) j["scale"] = *c.scale;
    if (c.tied) j["tied"] = true; // written only when set: every untied model's JSON stays as it was
    return j;
}

Weights<double> weights_from_json(const json& j, const ModelConfig& cfg) {
    Weights<double> w;
    w.embedding = matrix_from_json(field(j, "embedding"), "embedding");
    const json& layers = field(j, "layers");
    if (!layers.is_array()) throw ConfigError("model JSON: \"layers\" must be an array");
    for (size_t i = 0; i < layers.size(); ++i) {
        const json& l = layers[i];
        const std::string at = "layers[" + std::to_string(i) + "].";
        LayerWeights<double> lw;
        lw.w_q = matrix_from_json(field(l, "w_q"), at + "w_q");
        lw.w_k = matrix_from_json(field(l, "w_k"), at + "w_k");
        lw.w_v = matrix_from_json(field(l, "w_v"), at + "w_v");
        if (cfg.out_proj) lw.w_o = matrix_from_json(field(l, "w_o"), at + "w_o");
        if (cfg.rmsnorm) lw.rms_attn = vector_from_json(field(l, "rms_attn"), at + "rms_attn");
        if (cfg.mlp) {
            lw.w_gate = matrix_from_json(field(l, "w_gate"), at + "w_gate");
            lw.w_up = matrix_from_json(field(l, "w_up"), at + "w_up");
            lw.w_down = matrix_from_json(field(l, "w_down"), at + "w_down");
            if (cfg.rmsnorm) lw.rms_mlp = vector_from_json(field(l, "rms_mlp"), at + "rms_mlp");
        }
        w.layers.push_back(std::move(lw));
    }
    if (cfg.unembed) {
        if (!cfg.tied) w.w_unembed = matrix_from_json(field(j, "w_unembed"), "w_unembed");
        if (cfg.rmsnorm) w.rms_final = vector_from_json(field(j, "rms_final"), "rms_final");
    }
    check_shapes(cfg, w);
    return w;
}

} // namespace kvc::ref
