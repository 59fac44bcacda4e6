// Models described in JSON: a config object and, optionally, explicit weights (the documents' toy model is given
// this way in golden/). Every error names the field that is wrong.
//
//   config:  {"d_model": 4, "n_layers": 2, "n_q_heads": 1, "n_kv_heads": 1, "head_dim": 4, "vocab": 17,
//             "scale": 0.5, "rope": "none"|"neox"|"gptj", "rope_theta": 10000, "rmsnorm": false, "mlp": false,
//             "d_ff": 0, "out_proj": false, "residual": false, "unembed": false,
//             "tied": false}                                          tied: no w_unembed, logits use embeddingᵀ
//   weights: {"embedding": [[...] x vocab], "layers": [{"w_q": [[...] x D], "w_k": ..., "w_v": ..., "w_o": ...,
//             "rms_attn": [...], "rms_mlp": [...], "w_gate": ..., "w_up": ..., "w_down": ...}],
//             "rms_final": [...], "w_unembed": [[...]]}   matrices as arrays of rows
#pragma once

#include "kvcheck/reference/model.hpp"

#include <nlohmann/json.hpp>

namespace kvc::ref {

ModelConfig config_from_json(const nlohmann::json& j);   // throws ConfigError; validates
nlohmann::json config_to_json(const ModelConfig& cfg);
Weights<double> weights_from_json(const nlohmann::json& j, const ModelConfig& cfg); // throws ConfigError
Mat<double> matrix_from_json(const nlohmann::json& j, const std::string& what);    // array of equal-length rows
nlohmann::json matrix_to_json(const Mat<double>& m);

} // namespace kvc::ref
