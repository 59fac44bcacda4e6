// The model-level weights: the harness draws them from a seed, rounds every value to f32 (so the reference, which
// computes in double, and an f32 engine read bit-identical numbers), and writes them in the two formats of
// docs/model-level.md: safetensors with the Llama tensor names, and the flat f32 checkpoint of the single-file C
// style. The reader is the one our own engine's plugin uses; every error names the tensor or field that is wrong.
#pragma once

#include "kvcheck/model_abi.h"
#include "kvcheck/reference/model.hpp"

#include <cstdint>
#include <string>

namespace kvc::model {

// The reference's config for a model description: the Llama-style model (RMSNorm, W_O, SwiGLU, residuals, final
// norm, classifier) with the description's numbers. Throws ref::ConfigError for a description the reference cannot
// describe (zero sizes, n_heads not a multiple of n_kv_heads, odd head_dim with RoPE, bad rope or dtype, ...).
ref::ModelConfig config_of(const kvcm_model_desc& desc);

// One line naming every field, for counterexamples and logs.
std::string describe(const kvcm_model_desc& desc);

// Seeded weights: the reference's random_weights (entries N(0, 1/fan_in)), norm gains 1 + N(0, 0.2^2) so that a
// norm applied with the wrong gain shows, every value rounded to the nearest f32. embed_rms > 0: every embedding row
// scaled to that root mean square first (ModelCase::embed_rms: the small-norm regime where RMSNorm's eps matters).
ref::Weights<double> draw_weights(const ref::ModelConfig& cfg, uint64_t seed, double embed_rms = 0);

// safetensors bytes: F32 tensors, [out_features, in_features] row-major (y = x · Wᵀ), names as documented.
std::string write_safetensors(const ref::ModelConfig& cfg, const ref::Weights<double>& w);

// Parses safetensors bytes for cfg. Throws ref::ConfigError on anything malformed: a short file, a header that is
// not JSON, a missing, unknown or misshaped tensor, a dtype other than F32, offsets outside the data.
ref::Weights<double> read_safetensors(const std::string& bytes, const ref::ModelConfig& cfg);

// The flat f32 checkpoint: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; vocab_size
// negative for a separate classifier), then the tensors in the documented order. Needs head_dim == dim / n_heads.
std::string write_flat_f32(const ref::ModelConfig& cfg, const ref::Weights<double>& w, uint32_t seq_len);

// Reads a whole file; throws ref::ConfigError naming the path when it cannot.
std::string read_file_bytes(const std::string& path);

} // namespace kvc::model
