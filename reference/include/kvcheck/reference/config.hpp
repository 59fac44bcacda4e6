// The model the reference computes, described by plain numbers. Every optional part of a decoder-only transformer
// can be switched off, so that the documents' toy model (embedding straight into W_Q/W_K/W_V, no norm, no MLP) is
// expressible exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace kvc::ref {

// Rotary position embedding variants (same numbering as kvc_rope in the ABI).
enum class Rope : uint32_t {
    None = 0,
    NeoX = 1, // rotate pairs (i, i + d/2): "half rotation"
    GptJ = 2, // rotate pairs (2i, 2i + 1): "interleaved"
};

// A config that cannot describe a model (n_q_heads not a multiple of n_kv_heads, head_dim 0, ...).
class ConfigError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

struct ModelConfig {
    int d_model = 0;
    int n_layers = 0;
    int n_q_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    int vocab = 0;                      // rows of the embedding table
    std::optional<double> scale;        // softmax scale; default 1/sqrt(head_dim)
    Rope rope = Rope::None;
    double rope_theta = 10000.0;
    bool rmsnorm = false;               // RMSNorm before attention and MLP, and before the unembedding
    double rms_eps = 1e-5;
    bool mlp = false;                   // SwiGLU MLP after attention
    int d_ff = 0;                       // MLP hidden width (when mlp)
    bool out_proj = false;              // W_O after attention; without it n_q_heads * head_dim must equal d_model
    bool residual = false;              // add each sublayer's output to its input
    bool unembed = false;               // logits = h · W_U; without it there are no logits and no next token
    bool tied = false;                  // with unembed: W_U is the embedding transposed (logits = h · Eᵀ), no W_U

    double attention_scale() const;     // scale, or 1/sqrt(head_dim)
    int group_size() const { return n_q_heads / n_kv_heads; } // query heads per KV head
    // Throws ConfigError naming the first problem.
    void validate() const;
};

inline double ModelConfig::attention_scale() const {
    return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

inline void ModelConfig::validate() const {
    auto fail = [](const std::string& m) { throw ConfigError("invalid model config: " + m); };
    if (d_model <= 0) fail("d_model must be positive");
    if (n_layers <= 0) fail("n_layers must be positive");
    if (n_q_heads <= 0) fail("n_q_heads must be positive");
    if (n_kv_heads <= 0) fail("n_kv_heads must be positive");
    if (head_dim <= 0) fail("head_dim must be positive (got " + std::to_string(head_dim) + ")");
    if (vocab <= 0) fail("vocab must be positive");
    if (n_q_heads % n_kv_heads != 0)
        fail("n_q_heads (" + std::to_string(n_q_heads) + ") must be a multiple of n_kv_heads (" +
             std::to_string(n_kv_heads) + ")");
    if (rope != Rope::None && head_dim % 2 != 0)
        fail("RoPE needs an even head_dim (got " + std::to_string(head_dim) + ")");
    if (rope != Rope::None && !(rope_theta > 0)) fail("rope_theta must be positive");
    if (scale && !(*scale > 0)) fail("scale must be positive");
    if (mlp && d_ff <= 0) fail("an MLP needs d_ff > 0");
    if (tied && !unembed) fail("a tied classifier needs unembed");
    if (!out_proj && n_q_heads * head_dim != d_model && (residual || mlp || n_layers > 1 || unembed))
        fail("without out_proj, n_q_heads * head_dim must equal d_model to feed the next sublayer");
}

} // namespace kvc::ref
