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
    uint32_t dtype = KVC_DTYPE_F32;   // kvc_dtype
    uint32_t rope = KVC_ROPE_NONE;    // kvc_rope
    uint32_t block_size_hint = 0;
    uint32_t max_seqs = 4;
    uint32_t max_tokens = 256;
    float rope_theta = 10000.0f;

    float scale() const; // 1/sqrt(head_dim), rounded to float once, here
    kvc_config to_abi() const;
    uint32_t group() const { return n_q_heads / n_kv_heads; }
};

// One sequence's share of an append: n_new tokens onto seq (in every layer).
struct SeqAppend {
    uint32_t seq = 0;
    uint32_t n_new = 0;
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

// Capabilities a case needs, as a kvc_caps with the needed bits and the largest sizes it uses.
kvc_caps required_caps(const Case& c);
// Names of what `needed` asks for and `have` lacks; empty when the case is supported.
std::vector<std::string> missing_caps(const kvc_caps& needed, const kvc_caps& have);

// Lengths of every sequence after each op (index 0 = before any op): used for CHUNKED, limits and descriptions.
std::vector<std::vector<uint32_t>> lengths_after_ops(const Case& c);

nlohmann::json to_json(const Case& c);
Case case_from_json(const nlohmann::json& j); // throws std::invalid_argument naming the bad field; checks the script
void check_script(const Case& c);             // throws std::invalid_argument for a script no cache could run
std::string describe(const Case& c);          // readable: config on one line, one line per op

} // namespace kvc::prop
