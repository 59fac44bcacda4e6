// A conformance case: a cache configuration and a script of operations, all in logical terms. Every number the
// implementation sees (q, k, v) is derived from data_seed, so a case is replayed exactly from its JSON.
#pragma once

#include "kvcheck/abi.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvc::prop {

struct CaseConfig {
    uint32_t n_layers = 1;
    uint32_t n_q_heads = 1;
    uint32_t n_kv_heads = 1;
    uint32_t head_dim = 4;
    uint32_t cache_dtype = KVC_DTYPE_F32; // kvc_dtype, as kvc_config.cache_dtype
    uint32_t rope = KVC_ROPE_NONE;    // kvc_rope
    uint32_t block_size_hint = 0;
    uint32_t max_seqs = 4;
    uint32_t max_tokens = 256;
    float rope_theta = 10000.0f;
    float softmax_scale = 0.0f; // the config's scale; 0 means 1/sqrt(head_dim)
    // ABI 1.2, read only for a quantized cache_dtype (docs/quantized.md): an fp8 cache's scales, given by the
    // harness ([n_layers] for KVC_SCALE_TENSOR, [n_layers][n_kv_heads] for KVC_SCALE_KV_HEAD, empty for NONE), and
    // the dtype an INT8_TOKEN cache keeps its per-row scales in (KVC_DTYPE_F32 or KVC_DTYPE_F16).
    uint32_t kv_scale_mode = KVC_SCALE_NONE; // kvc_scale_mode
    std::vector<float> k_scales, v_scales;
    uint32_t int8_scale_dtype = KVC_DTYPE_F32;
    // Not part of the case (never in its JSON): how the implementation under test declares its q8_0 codes rounded,
    // 0 (ggml's quantize_row_q8_0_ref), KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN or KVC_PIPELINE_Q8_0_RECIP_D_EVEN.
    // evaluate_case sets it from the declared pipeline; the cache model's expected codes follow it.
    uint32_t q8_0_rounding = 0;
    // ABI 1.2 windowed caches (docs/windowed-caches.md): the window W of each layer (empty: no window anywhere; a
    // layer's 0: that layer attends to everything), the sinks S kept visible in windowed layers, and whether the
    // cache may drop the rows no later query can see.
    std::vector<uint32_t> windows;
    uint32_t n_sinks = 0;
    bool evict = false;
    // Large attention scores (docs/conformance.md, EQUIV): 0, or the magnitude S the case's scores are built around
    // (append_inputs): a row's scores lie near -S, near +S, or spread over a fraction of +-S. Queries are amplified
    // and every key shares one component, so that some rows are dominated by one huge score, some have all their
    // scores very negative (exp(s) underflows) and some all very positive (exp(s) overflows): only a softmax that
    // subtracts its running maximum keeps such rows finite. Not in the ABI config.
    float score_scale = 0.0f;
    // ABI 1.2 latent and partial-rotary shapes (docs/windowed-caches.md): the dims of a V row and of an output row
    // (0 = head_dim), and RoPE on dims [rope_dim_begin, rope_dim_begin + rope_dims) of q and k only (rope_dims 0 =
    // the whole head). Drawn only for a non-quantized dtype.
    uint32_t head_dim_v = 0;
    uint32_t rope_dim_begin = 0, rope_dims = 0;

    uint32_t dv() const { return head_dim_v != 0 ? head_dim_v : head_dim; }
    uint32_t rope_begin() const { return rope_dims != 0 ? rope_dim_begin : 0u; }
    uint32_t rope_len() const { return rope_dims != 0 ? rope_dims : head_dim; } // the dims RoPE treats as a head
    bool in_rope(uint32_t x) const { return x >= rope_begin() && x < rope_begin() + rope_len(); } // x < head_dim
    uint32_t window(uint32_t layer) const { return windows.empty() ? 0u : windows.at(layer); }
    bool windowed() const; // some layer has a window
    // The first position a later query of `layer` can see besides the sinks, once (seq, layer) holds `len` rows:
    // rows n_sinks .. dead_end-1 are dead (an evicting cache may drop them); 0 when nothing is dead.
    uint32_t dead_end(uint32_t layer, uint32_t len) const;

    float scale() const; // softmax_scale, or 1/sqrt(head_dim) rounded to float once, here
    // The ABI config. Its k_scales / v_scales point into this CaseConfig's vectors: the result is valid only while
    // this object lives unchanged (create() copies the scales, as abi.h requires, so passing it to create is safe).
    kvc_config to_abi() const;
    // The fp8 scale of K (which 1) or V (2) rows of (layer, KV head): 1 under KVC_SCALE_NONE or a non-fp8 dtype.
    float fp8_scale(uint32_t which, uint32_t layer, uint32_t kv_head) const;
    uint32_t group() const { return n_q_heads / n_kv_heads; }
};

// One sequence's share of an append: n_new tokens onto seq (in every layer).
// `extreme` rows are a stale-slot trap (RELEASE): K and V of magnitude 2^14 with random signs (exact in f16 and
// bf16), appended just before the sequence is released, so that a cache which later reads them as stale tail slots
// changes its outputs by orders of magnitude. Their own outputs are not graded (the scores they produce are far
// outside what a 16-bit pipeline is built for); their read-back is.
struct SeqAppend {
    uint32_t seq = 0;
    uint32_t n_new = 0;
    bool extreme = false;
};

enum class OpKind { Append, AppendBatch, Fork, Release };

struct Op {
    OpKind kind = OpKind::Append;
    std::vector<SeqAppend> appends;    // Append: one entry; AppendBatch: distinct sequences, one call per layer
    std::vector<uint32_t> layer_order; // order in which layers receive this append; empty = 0 .. n_layers-1
    uint32_t seq = 0;                  // Fork: parent; Release: the sequence
    uint32_t child = 0;                // Fork: the (empty) child
};

struct Case {
    CaseConfig cfg;
    std::vector<Op> ops;
    uint64_t data_seed = 0;
};

// "none", "tensor", "kv_head" (kvc_scale_mode), as case files and reports spell it.
const char* scale_mode_name(uint32_t mode);
// Entries each of k_scales and v_scales must hold: n_layers (TENSOR), n_layers * n_kv_heads (KV_HEAD), 0 otherwise.
size_t scales_expected(const CaseConfig& c);

// Capabilities a case needs, as a kvc_caps with the needed bits and the largest sizes it uses; for a quantized
// dtype the KVC_QUANT_* bits its scale form needs (quant, which a 1.0/1.1 plugin's caps hold as 0).
kvc_caps required_caps(const Case& c);
// The head_dim multiple `caps` demand for a case with or without RoPE (1: any head_dim). A pipeline that declares q
// rounded to q8_0 (KVC_ROUND_Q8_0) demands whole blocks of 32 per head besides: the multiple is lcm(declared, 32).
uint32_t head_dim_multiple(const kvc_caps& caps, bool rope);
// Names of what `needed` asks for and `have` lacks; empty when the case is supported. Besides features and limits,
// the head_dim granularity of ABI 1.1: `needed` carries the case's head_dim in max_head_dim and its RoPE variant in
// rope_variants, and a head_dim outside have.head_dim_multiple(_rope) is missing ("head_dim 12 not a multiple of 8").
std::vector<std::string> missing_caps(const kvc_caps& needed, const kvc_caps& have);

// Lengths of every sequence after each op (index 0 = before any op): used for CHUNKED, limits and descriptions.
std::vector<std::vector<uint32_t>> lengths_after_ops(const Case& c);

nlohmann::json to_json(const Case& c);
Case case_from_json(const nlohmann::json& j); // throws std::invalid_argument naming the bad field; checks the script
void check_script(const Case& c);             // throws std::invalid_argument for a script no cache could run
std::string describe(const Case& c);          // readable: config on one line, one line per op

} // namespace kvc::prop
