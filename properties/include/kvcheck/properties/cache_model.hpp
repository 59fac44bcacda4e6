// The harness's one model of what a KV cache must hold. Both graders keep it: the plugin harness (session.cpp),
// which reads rows back through the ABI, and the offline grader (`kvcheck grade`), which reads them from the files
// an implementation wrote; `kvcheck export` keeps it to write the expected rows. Whatever the route, a case's
// script expands to the same steps, the same inputs, the same stored-row rule, the same unchanged-row rule and the
// same live-byte formula, because they are written here once.
//
//   step expansion   a case's ops as calls: one per (sequence, layer) append, one per layer of a batch
//   inputs           the q, k, v of every append, from the case's data seed (input_value)
//   stored rows      a new row must be stored as the appended value rounded to the cache dtype, keys rotated
//                    (CACHE-CONTENT); for a quantized dtype, as the reference quantizer's codes and scales
//                    (quant_rows.hpp), and the values attended are those dequantized; a row once stored never
//                    changes, codes and scales alike (APPEND-ONLY)
//   live bytes       2 * sum over (sequence, layer) of length * n_kv_heads * head_row_bytes (MEMORY): head_dim *
//                    sizeof(dtype), plus the scales stored with each row for int8_token and q8_0; an evicting
//                    cache's dropped rows not counted
//   dropped rows     an evicting cache (docs/windowed-caches.md) drops one run of rows between the sinks and the
//                    window: (seq, layer) holds rows 0 .. begin-1 and end .. len-1, S <= begin <= end, and every row
//                    a later query can see (the sinks, CaseConfig::dead_end on) is among them
//   sharing          which rows each stream holds in common with other sequences since a fork (and whether that
//                    sibling was released since), and, for a cache that declares KVC_FEATURE_FORK_SHARES, the
//                    blocks the fork tree needs when every full block is shared and counted once
#pragma once

#include "kvcheck/properties/case.hpp"
#include "kvcheck/properties/mismatch.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvc::prop {

// ---- steps: a case's script as the calls an implementation receives ----

enum class StepKind { Append, AppendBatch, Fork, Release };
const char* step_kind_name(StepKind k); // "append", "append_batch", "fork", "release"

// One sequence's part of an append step: its new tokens sit at rows token_begin .. token_begin+n_new-1 of the
// step's packed q, k, v and out tensors, at positions pos_begin .. pos_begin+n_new-1 of (seq, layer).
struct Slice {
    uint32_t seq = 0;
    uint32_t n_new = 0;
    uint32_t pos_begin = 0;   // rows (seq, layer) held before the step
    uint32_t token_begin = 0; // first row of the slice in the packed tensors
};

// One call into an implementation. An Append op becomes one append step per layer (layer_order when given) and
// sequence; an AppendBatch op one append_batch step per layer, the call that takes every sequence at once.
struct Step {
    StepKind kind = StepKind::Append;
    uint32_t op = 0;        // index of the case's op it comes from (the input values depend on it)
    uint32_t seq = 0;       // Append: the sequence; Fork: the parent; Release: the sequence
    uint32_t child = 0;     // Fork: the new sequence
    uint32_t layer = 0;     // Append, AppendBatch
    uint32_t n_new = 0;     // Append, AppendBatch: tokens of the whole call
    uint32_t pos_begin = 0; // Append: rows (seq, layer) held before the step
    std::vector<Slice> slices; // Append: one; AppendBatch: one per sequence, in the call's order
    bool appends() const { return kind == StepKind::Append || kind == StepKind::AppendBatch; }
};

// The layers an append op visits, in order: its layer_order, or 0 .. n_layers-1 when it gives none.
std::vector<uint32_t> layers_of(const CaseConfig& cfg, const Op& op);

// The steps of one op, given the rows each (seq, layer) holds before it (updated: lengths[seq][layer]).
std::vector<Step> expand_op(const CaseConfig& cfg, const Op& op, uint32_t op_index,
                            std::vector<std::vector<uint32_t>>& lengths);
std::vector<Step> expand_steps(const Case& c);

// ---- inputs ----

// Deterministic inputs: element idx of q (which 0), k (1) or v (2) of token tok appended to seq in layer by op.
// Roughly N(0, 1). The query stream `qstream` lets NO-Q vary queries while keeping K and V.
float input_value(uint64_t seed, uint32_t op, uint32_t seq, uint32_t layer, uint32_t tok, uint32_t which,
                  uint32_t idx, uint32_t qstream = 0);

// The value of every K and V element of an extreme (stale-slot trap) row, with a drawn sign.
constexpr float kExtremeValue = 16384.0f;

// The q, k, v of one append, row-major: q [n][Hq*d], k and v [n][Hkv*d].
struct AppendInputs {
    std::vector<float> q, k, v;
};

// One sequence's n_new tokens appended to `layer` by op `op`: input_value at (op, seq, layer, token, which, idx).
// `qstream` varies the queries alone (NO-Q's second run); `extreme` sets every K and V element to
// +-kExtremeValue with the drawn sign (a stale-slot trap row).
AppendInputs append_inputs(const CaseConfig& cfg, uint64_t data_seed, uint32_t op, uint32_t seq, uint32_t layer,
                           uint32_t n_new, uint32_t qstream = 0, bool extreme = false);

// A step's inputs, its slices packed one after another as the call receives them.
AppendInputs step_inputs(const Case& c, const Step& s);

// ---- the rows a cache must store ----

// The rows n new tokens must be stored as: bytes of the cache dtype ([n][Hkv*d] elements; the codes of a
// quantized dtype) and the same values widened to float (dequantized); `rotated` is each key before its rounding
// to the cache dtype (long double rotation, to float). k_scale_bits, v_scale_bits: a quantized dtype's scales as
// read_kv_scales returns them ([n][Hkv][scale bytes of a head row]), empty otherwise. `layer` picks an fp8 scale.
struct StoredRows {
    std::vector<uint8_t> k_bits, v_bits;
    std::vector<float> k, v;
    std::vector<float> rotated;
    std::vector<uint8_t> k_scale_bits, v_scale_bits;
};
StoredRows expected_new_rows(const CaseConfig& cfg, uint32_t pos_begin, uint32_t n_new, const float* k,
                             const float* v, uint32_t layer = 0);

// The reason of a CACHE-CONTENT failure for the first element `m` that differs; `source` names where the rows came
// from ("read-back", "dumped").
std::string stored_row_reason(const CaseConfig& cfg, const char* source, const Mismatch& m);

constexpr const char* kLiveBytesRule = "reported live bytes differ from 2 * tokens * n_kv_heads * head_dim * "
                                       "sizeof(dtype) (for int8_token and q8_0 the scale bytes of each head row "
                                       "included: + 4 or 2 per row, + 2 per 32 values; fp8's config scales not)";
constexpr const char* kRewrittenRule = "the past of the cache was rewritten";

// Per (sequence, layer): the rows appended since the sequence started, as the implementation stored them.
class CacheModel {
public:
    struct Stream {
        uint32_t len = 0;
        std::vector<float> k_eff, v_eff;     // [len][Hkv*d] the stored values the oracle attends, widened to float
        std::vector<uint8_t> k_bits, v_bits; // [len][Hkv*d*s] the bytes the implementation gave back for them
        std::vector<uint8_t> k_scale_bits, v_scale_bits; // quantized: [len][Hkv][scale bytes] as read back
        std::vector<float> k_raw, v_raw; // quantized: [len][Hkv*d] the rows before quantization (keys rotated by
                                         // the oracle): what the informative quantization loss is measured against
        uint32_t dropped = 0; // evicting caches: rows the cache no longer returns (read_kv says KVC_ERR_EVICTED)
        // Rows 0 .. rows-1 this stream holds in common with sequence `seq` since a fork (either way, or through a
        // common ancestor); `released` once that sequence was released after it.
        struct Share {
            uint32_t seq = 0, rows = 0;
            bool released = false;
        };
        std::vector<Share> shares;
        // Who owns the storage of each row under fork sharing: segment i's instance appended rows from its start to
        // the next segment's start. An instance is one life of one (sequence, layer) stream: a fork starts the
        // child's at the parent's length, a release a new one at 0.
        struct Segment {
            uint64_t instance = 0;
            uint32_t start = 0;
        };
        std::vector<Segment> chain;
    };

    explicit CacheModel(const CaseConfig& cfg);

    const Stream& stream(uint32_t seq, uint32_t layer) const { return streams_.at(seq).at(layer); }
    uint32_t length(uint32_t seq, uint32_t layer) const { return stream(seq, layer).len; }
    std::vector<std::vector<uint32_t>> lengths() const;

    // Records n new rows of (seq, layer) as the implementation stored them (got_k, got_v: [n][Hkv*d] in the cache
    // dtype) and checks each element: bitwise the appended value rounded to the cache dtype, a key rotated by the
    // implementation within what an f32 rotation (or the declared RoPE stage) may give (stored_key_acceptable).
    // Returns the first element that differs, k before v. The rows are recorded whatever the outcome, a wrong key
    // attended as it should have been stored, so that a storage error is not graded a second time by EQUIV.
    // A quantized dtype's rows are judged by their codes and scales (got_k_scales, got_v_scales: [n][Hkv][scale
    // bytes of a head row]; nullptr for other dtypes); a key rotated by the implementation by
    // quantized_row_acceptable. `why`, when given, receives the reason of the first difference (for a quantized
    // dtype with its mechanism, quant_diagnosis.cpp).
    std::optional<Mismatch> store(uint32_t seq, uint32_t layer, uint32_t n, const float* k_in, const float* v_in,
                                  const uint8_t* got_k, const uint8_t* got_v, uint32_t rope_stage,
                                  const uint8_t* got_k_scales = nullptr, const uint8_t* got_v_scales = nullptr,
                                  std::string* why = nullptr);
    // Records the rows as they must be stored (what export writes as expected); returns them.
    StoredRows store_expected(uint32_t seq, uint32_t layer, uint32_t n, const float* k_in, const float* v_in);

    // The first element of the rows recorded for (seq, layer) that got_k, got_v (at least len rows each) do not
    // hold bitwise: a row once stored never changes.
    // A quantized dtype's scales (got_k_scales, got_v_scales, as in store) are compared the same way.
    std::optional<Mismatch> first_changed(uint32_t seq, uint32_t layer, const uint8_t* got_k, const uint8_t* got_v,
                                          const uint8_t* got_k_scales = nullptr,
                                          const uint8_t* got_v_scales = nullptr) const;

    // An evicting cache's dropped rows of (seq, layer), as the harness found them: rows begin .. end-1.
    void set_dropped(uint32_t seq, uint32_t layer, uint32_t begin, uint32_t end) {
        streams_.at(seq).at(layer).dropped = end - begin;
    }

    void fork(uint32_t parent, uint32_t child); // the child starts with the parent's rows
    void release(uint32_t seq);                 // the sequence holds no row

    uint64_t row_bytes() const; // K and V of one token in one layer: 2 * n_kv_heads * head_row_bytes
    size_t kv_bytes(uint32_t rows) const; // K of `rows` tokens of one (seq, layer), as read_kv returns them
    size_t v_bytes(uint32_t rows) const;  // their V (head_dim_v dims a head)
    size_t scale_bytes(uint32_t rows) const; // their scales as read_kv_scales returns them (0: not quantized)
    bool quantized() const { return quantized_; }
    uint64_t live_bytes() const;
    // Every stream rounded up to whole blocks; for an evicting cache, the blocks that hold a row a later query can
    // see (the sinks' and the window's) plus one block of slack, at most the whole stream's.
    uint64_t live_bytes_in_blocks(uint64_t block_tokens) const;
    // The bytes of the blocks of `block_tokens` rows that every stream needs when fork shares each full block of the
    // parent (counted once however many sequences hold it) and copies only the partly filled last one
    // (KVC_FEATURE_FORK_SHARES): per stream, block k belongs to the last instance of its chain that started before
    // the block's end (an earlier one shares it, a later one copied it when it was partly filled).
    uint64_t shared_bytes_in_blocks(uint64_t block_tokens) const;
    // Words naming the fork sharing of row `pos` of (seq, layer), e.g. "shared with sequence 1 until its release";
    // empty when no other sequence shares the row.
    std::string sharing_of(uint32_t seq, uint32_t layer, uint32_t pos) const;

    const CaseConfig& config() const { return cfg_; }

private:
    Mismatch at_element(const char* what, uint32_t seq, uint32_t layer, size_t element) const;
    std::optional<Mismatch> store_quantized(Stream& s, uint32_t seq, uint32_t layer, uint32_t n, const float* k_in,
                                            const float* v_in, const StoredRows& want, const uint8_t* got_k, const uint8_t* got_v,
                                            const uint8_t* got_ks, const uint8_t* got_vs, uint32_t rope_stage,
                                            std::string* why);

    CaseConfig cfg_;
    uint32_t head_dim_, head_dim_v_;
    size_t row_elems_, v_row_elems_, elem_bytes_; // K and V rows of one token: n_kv_heads * head_dim (head_dim_v)
    std::vector<std::vector<Stream>> streams_; // [seq][layer]
    bool quantized_;
    size_t head_scale_bytes_; // scale bytes of one head row (0: not quantized)
    uint64_t next_instance_ = 0; // Stream::Segment::instance
};

// Live bytes of the formula for the given lengths [seq][layer].
uint64_t live_bytes(const CaseConfig& cfg, const std::vector<std::vector<uint32_t>>& lengths);
// A token's K and V rows in one layer: n_kv_heads * (a K head row of head_dim + a V head row of head_dim_v), each
// with its scale bytes (head_row_bytes).
uint64_t token_bytes(const CaseConfig& cfg);

} // namespace kvc::prop
