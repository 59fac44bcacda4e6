#include "kvcheck/properties/cache_model.hpp"
#include "stored_keys.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/quant_rows.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/splitmix64.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

namespace kvc::prop {

// ---- steps ----

const char* step_kind_name(StepKind k) {
    switch (k) {
    case StepKind::Append: return "append";
    case StepKind::AppendBatch: return "append_batch";
    case StepKind::Fork: return "fork";
    case StepKind::Release: return "release";
    }
    return "?";
}

std::vector<uint32_t> layers_of(const CaseConfig& cfg, const Op& op) {
    std::vector<uint32_t> order = op.layer_order;
    if (order.empty()) {
        order.resize(cfg.n_layers);
        std::iota(order.begin(), order.end(), 0u);
    }
    return order;
}

std::vector<Step> expand_op(const CaseConfig& cfg, const Op& op, uint32_t op_index,
                            std::vector<std::vector<uint32_t>>& lengths) {
    std::vector<Step> steps;
    Step s;
    s.op = op_index;
    switch (op.kind) {
    case OpKind::Append:
    case OpKind::AppendBatch: {
        const bool batch = op.kind == OpKind::AppendBatch;
        for (uint32_t layer : layers_of(cfg, op)) {
            // an Append op with several entries is one call per entry; a batch is one call per layer
            for (size_t a = 0; a < op.appends.size(); ++a) {
                const SeqAppend& sa = op.appends[a];
                if (!batch || a == 0) {
                    s.kind = batch ? StepKind::AppendBatch : StepKind::Append;
                    s.layer = layer;
                    s.n_new = 0;
                    s.slices.clear();
                }
                Slice sl;
                sl.seq = sa.seq;
                sl.n_new = sa.n_new;
                sl.pos_begin = lengths.at(sa.seq).at(layer);
                sl.token_begin = s.n_new;
                lengths[sa.seq][layer] += sa.n_new;
                s.n_new += sa.n_new;
                s.slices.push_back(sl);
                s.seq = batch ? 0 : sa.seq;
                s.pos_begin = batch ? 0 : sl.pos_begin;
                if (!batch || a + 1 == op.appends.size()) steps.push_back(s);
            }
        }
        break;
    }
    case OpKind::Fork:
        s.kind = StepKind::Fork;
        s.seq = op.seq;
        s.child = op.child;
        lengths.at(op.child) = lengths.at(op.seq);
        steps.push_back(s);
        break;
    case OpKind::Release:
        s.kind = StepKind::Release;
        s.seq = op.seq;
        std::fill(lengths.at(op.seq).begin(), lengths.at(op.seq).end(), 0u);
        steps.push_back(s);
        break;
    }
    return steps;
}

std::vector<Step> expand_steps(const Case& c) {
    std::vector<Step> steps;
    std::vector<std::vector<uint32_t>> lengths(c.cfg.max_seqs, std::vector<uint32_t>(c.cfg.n_layers, 0));
    for (size_t i = 0; i < c.ops.size(); ++i) {
        std::vector<Step> more = expand_op(c.cfg, c.ops[i], static_cast<uint32_t>(i), lengths);
        steps.insert(steps.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
    return steps;
}

// ---- inputs ----

float input_value(uint64_t seed, uint32_t op, uint32_t seq, uint32_t layer, uint32_t tok, uint32_t which,
                  uint32_t idx, uint32_t qstream) {
    // splitmix64 over the coordinates: stable across platforms and independent of evaluation order
    uint64_t h = splitmix64(seed);
    for (uint64_t x : {uint64_t(op), uint64_t(seq), uint64_t(layer), uint64_t(tok), uint64_t(which), uint64_t(idx),
                       uint64_t(qstream)})
        h = splitmix64(h ^ x);
    // sum of three uniforms on (-1, 1), scaled to unit variance: bounded, bell-shaped, exact in float
    double s = 0;
    for (int i = 0; i < 3; ++i) {
        s += static_cast<double>(h & 0xFFFFF) / 0x80000 - 1.0;
        h >>= 21;
    }
    return static_cast<float>(s);
}

namespace {

// The large-score regime (CaseConfig::score_scale). Every key gets `bias` added to its last element (in the
// lowest-frequency RoPE pair of both layouts, so that rotation turns the shared component slowest), and each query
// head row becomes gain * (x + sign * bias * e_last), its sign -1, 0 or +1 drawn per row: q.k then has mean
// sign * bias^2 and variance d + 2 bias^2, and bias^2 = 16 sqrt(d) puts that mean 3 to 9 standard deviations away
// from 0. gain makes scale * gain * bias^2 = score_scale: rows of sign -1 have all scores near -score_scale (a
// naive exp(s) underflows to 0/0), rows of +1 all near +score_scale (exp(s) overflows), rows of 0 spread with a
// standard deviation of score_scale/3 to score_scale/9, each dominated by its largest score. Keys stay below 20 in magnitude (any cache dtype);
// |q| is kept below 30000 so that a q rounded to f16 stays finite.
struct LargeScores {
    float bias = 0;
    double gain = 1;
};

LargeScores large_scores(const CaseConfig& cfg) {
    LargeScores r;
    const double b2 = 16.0 * std::sqrt(static_cast<double>(cfg.head_dim));
    r.bias = static_cast<float>(std::sqrt(b2));
    r.gain = std::min(static_cast<double>(cfg.score_scale) / (static_cast<double>(cfg.scale()) * b2),
                      30000.0 / (3.0 + r.bias));
    return r;
}

} // namespace

AppendInputs append_inputs(const CaseConfig& cfg, uint64_t data_seed, uint32_t op, uint32_t seq, uint32_t layer,
                           uint32_t n_new, uint32_t qstream, bool extreme) {
    const size_t qrow = static_cast<size_t>(cfg.n_q_heads) * cfg.head_dim;
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
    const size_t vrow = static_cast<size_t>(cfg.n_kv_heads) * cfg.dv();
    const uint32_t d = cfg.head_dim;
    const bool large = cfg.score_scale > 0;
    const LargeScores ls = large ? large_scores(cfg) : LargeScores{};
    AppendInputs in;
    in.q.resize(n_new * qrow);
    in.k.resize(n_new * row);
    in.v.resize(n_new * vrow);
    for (uint32_t i = 0; i < n_new; ++i) {
        for (size_t x = 0; x < qrow; ++x)
            in.q[i * qrow + x] = input_value(data_seed, op, seq, layer, i, 0, static_cast<uint32_t>(x), qstream);
        if (large)
            for (uint32_t h = 0; h < cfg.n_q_heads; ++h) {
                // the row's sign from a stream of its own (which = 3), so q's ordinary values are the same
                const float u = input_value(data_seed, op, seq, layer, i, 3, h, qstream);
                const double sign = u < -0.5f ? -1.0 : u > 0.5f ? 1.0 : 0.0;
                float* qh = in.q.data() + i * qrow + static_cast<size_t>(h) * d;
                for (uint32_t x = 0; x < d; ++x)
                    qh[x] = static_cast<float>(ls.gain * (qh[x] + (x + 1 == d ? sign * ls.bias : 0.0)));
            }
        for (size_t x = 0; x < row; ++x) {
            in.k[i * row + x] = input_value(data_seed, op, seq, layer, i, 1, static_cast<uint32_t>(x));
            if (extreme) { // 2^14 with the drawn sign: exact in f16 and bf16, and a rotated pair stays < 65504
                in.k[i * row + x] = std::copysign(kExtremeValue, in.k[i * row + x]);
            } else if (large && x % d == d - 1) {
                in.k[i * row + x] += ls.bias;
            }
        }
        for (size_t x = 0; x < vrow; ++x) {
            in.v[i * vrow + x] = input_value(data_seed, op, seq, layer, i, 2, static_cast<uint32_t>(x));
            if (extreme) in.v[i * vrow + x] = std::copysign(kExtremeValue, in.v[i * vrow + x]);
        }
    }
    return in;
}

AppendInputs step_inputs(const Case& c, const Step& s) {
    AppendInputs in;
    // Exported vectors carry every row with its ordinary values, stale-slot trap rows included: the offline route
    // grades them like any other row (the live harness leaves trap rows out of EQUIV instead).
    for (const Slice& sl : s.slices) {
        const AppendInputs part = append_inputs(c.cfg, c.data_seed, s.op, sl.seq, s.layer, sl.n_new);
        in.q.insert(in.q.end(), part.q.begin(), part.q.end());
        in.k.insert(in.k.end(), part.k.begin(), part.k.end());
        in.v.insert(in.v.end(), part.v.begin(), part.v.end());
    }
    return in;
}

// ---- the rows a cache must store ----

namespace {

// A quantized dtype's rows: the reference quantizer's codes and scales, head row by head row, and their values.
void quantize_rows(const CaseConfig& cfg, uint32_t layer, uint32_t n_new, const float* v, StoredRows& r) {
    const uint32_t d = cfg.head_dim;
    const size_t sb = scale_bytes_per_head_row(cfg), heads = static_cast<size_t>(n_new) * cfg.n_kv_heads;
    r.k_bits.resize(heads * d);
    r.v_bits.resize(heads * d);
    r.k_scale_bits.resize(heads * sb);
    r.v_scale_bits.resize(heads * sb);
    for (size_t hr = 0; hr < heads; ++hr) {
        const uint32_t h = static_cast<uint32_t>(hr % cfg.n_kv_heads);
        quantize_head_row(cfg, cfg.fp8_scale(1, layer, h), r.rotated.data() + hr * d, r.k_bits.data() + hr * d,
                          r.k_scale_bits.data() + hr * sb);
        quantize_head_row(cfg, cfg.fp8_scale(2, layer, h), v + hr * d, r.v_bits.data() + hr * d,
                          r.v_scale_bits.data() + hr * sb);
        dequantize_head_row(cfg, r.k_bits.data() + hr * d, r.k_scale_bits.data() + hr * sb, r.k.data() + hr * d);
        dequantize_head_row(cfg, r.v_bits.data() + hr * d, r.v_scale_bits.data() + hr * sb, r.v.data() + hr * d);
    }
}

} // namespace

StoredRows expected_new_rows(const CaseConfig& cfg, uint32_t pos_begin, uint32_t n_new, const float* k,
                             const float* v, uint32_t layer) {
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
    const size_t vrow = static_cast<size_t>(cfg.n_kv_heads) * cfg.dv();
    const size_t es = dtype_size(cfg.cache_dtype);
    StoredRows r;
    r.k.resize(n_new * row);
    r.v.resize(n_new * vrow);
    r.k_bits.resize(n_new * row * es);
    r.v_bits.resize(n_new * vrow * es);
    r.rotated.resize(n_new * row);
    for (uint32_t i = 0; i < n_new; ++i)
        expected_rotated_key(cfg, k + i * row, pos_begin + i, r.rotated.data() + i * row);
    if (dtype_is_quantized(cfg.cache_dtype)) {
        quantize_rows(cfg, layer, n_new, v, r);
        return r;
    }
    for (size_t x = 0; x < r.k.size(); ++x) r.k[x] = ref::round_to_dtype(r.rotated[x], cfg.cache_dtype);
    for (size_t x = 0; x < r.k.size(); ++x) ref::store_dtype(r.k[x], cfg.cache_dtype, r.k_bits.data() + x * es);
    for (size_t x = 0; x < r.v.size(); ++x) {
        ref::store_dtype(v[x], cfg.cache_dtype, r.v_bits.data() + x * es);
        r.v[x] = ref::load_dtype(r.v_bits.data() + x * es, cfg.cache_dtype);
    }
    return r;
}

uint64_t token_bytes(const CaseConfig& cfg) {
    return uint64_t{cfg.n_kv_heads} * (head_row_bytes(cfg.cache_dtype, cfg.head_dim, cfg.int8_scale_dtype) +
                                       head_row_bytes(cfg.cache_dtype, cfg.dv(), cfg.int8_scale_dtype));
}

uint64_t live_bytes(const CaseConfig& cfg, const std::vector<std::vector<uint32_t>>& lengths) {
    const uint64_t row_bytes = token_bytes(cfg);
    uint64_t total = 0;
    for (const auto& seq : lengths)
        for (uint32_t l : seq) total += l * row_bytes;
    return total;
}

// ---- the model ----

CacheModel::CacheModel(const CaseConfig& cfg)
    : cfg_(cfg), head_dim_(cfg.head_dim), head_dim_v_(cfg.dv()),
      row_elems_(static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim),
      v_row_elems_(static_cast<size_t>(cfg.n_kv_heads) * cfg.dv()), elem_bytes_(dtype_size(cfg.cache_dtype)), streams_(cfg.max_seqs, std::vector<Stream>(cfg.n_layers)),
      quantized_(dtype_is_quantized(cfg.cache_dtype)), head_scale_bytes_(scale_bytes_per_head_row(cfg)) {
    for (auto& seq : streams_)
        for (Stream& s : seq) s.chain = {{next_instance_++, 0}};
}

std::vector<std::vector<uint32_t>> CacheModel::lengths() const {
    std::vector<std::vector<uint32_t>> out(streams_.size());
    for (size_t q = 0; q < streams_.size(); ++q)
        for (const Stream& s : streams_[q]) out[q].push_back(s.len);
    return out;
}

Mismatch CacheModel::at_element(const char* what, uint32_t seq, uint32_t layer, size_t element) const {
    Mismatch m;
    m.what = what;
    m.seq = static_cast<int>(seq);
    m.layer = static_cast<int>(layer);
    const bool v = what[0] == 'v'; // a V row has head_dim_v dims a head
    const size_t row = v ? v_row_elems_ : row_elems_, d = v ? head_dim_v_ : head_dim_;
    m.pos = static_cast<int>(element / row);
    m.head = static_cast<int>(element % row / d);
    m.dim = static_cast<int>(element % d);
    return m;
}

std::optional<Mismatch> CacheModel::store(uint32_t seq, uint32_t layer, uint32_t n, const float* k_in,
                                          const float* v_in, const uint8_t* got_k, const uint8_t* got_v,
                                          uint32_t rope_stage, const uint8_t* got_k_scales,
                                          const uint8_t* got_v_scales, std::string* why) {
    Stream& s = streams_.at(seq).at(layer);
    const StoredRows want = expected_new_rows(cfg_, s.len, n, k_in, v_in, layer);
    if (quantized_)
        return store_quantized(s, seq, layer, n, k_in, v_in, want, got_k, got_v, got_k_scales, got_v_scales,
                               rope_stage, why);
    std::optional<Mismatch> first;
    std::vector<size_t> wrong_keys; // elements of this call whose key is not acceptable
    // K and V element x of each row side by side (a V row may be shorter or longer): the first wrong element is
    // the first in row order, a key before the value at the same place
    for (uint32_t i = 0; i < n; ++i)
        for (size_t x = 0; x < std::max(row_elems_, v_row_elems_); ++x) {
            const size_t e = i * row_elems_ + x, ev = i * v_row_elems_ + x;
            bool k_ok = true, v_ok = true;
            float gk = 0, gv = 0;
            if (x < row_elems_) {
                const uint8_t* gk_bits = got_k + e * elem_bytes_;
                gk = ref::load_dtype(gk_bits, cfg_.cache_dtype);
                // a key the implementation rotated itself may be the rounding of any rotation within an ordinary
                // f32 rotation's error (stored_key_acceptable); without RoPE the stored bits are exact
                k_ok = std::memcmp(want.k_bits.data() + e * elem_bytes_, gk_bits, elem_bytes_) == 0 ||
                       (cfg_.rope != KVC_ROPE_NONE &&
                        stored_key_acceptable(cfg_, rope_stage, k_in + i * row_elems_, s.len + i,
                                              static_cast<uint32_t>(x), want.rotated[e], gk));
                s.k_eff.push_back(k_ok ? gk : want.k[e]);
                if (!k_ok) wrong_keys.push_back(e);
            }
            if (x < v_row_elems_) {
                const uint8_t* gv_bits = got_v + ev * elem_bytes_;
                gv = ref::load_dtype(gv_bits, cfg_.cache_dtype);
                v_ok = std::memcmp(want.v_bits.data() + ev * elem_bytes_, gv_bits, elem_bytes_) == 0;
                s.v_eff.push_back(want.v[ev]);
            }
            if ((k_ok && v_ok) || first) continue;
            first = !k_ok ? at_element("k", seq, layer, (static_cast<size_t>(s.len) + i) * row_elems_ + x)
                          : at_element("v", seq, layer, (static_cast<size_t>(s.len) + i) * v_row_elems_ + x);
            first->expected = !k_ok ? want.k[e] : want.v[ev];
            first->actual = !k_ok ? gk : gv;
        }
    if (first && first->what == "k" && cfg_.rope != KVC_ROPE_NONE) {
        first->consistent_with = rope_over_all_dims(cfg_, k_in, s.len, got_k, wrong_keys);
        if (first->consistent_with.empty())
            first->consistent_with = rope_stage_fitting(cfg_, k_in, s.len, got_k, want, wrong_keys);
    }
    if (first && first->what == "v") first->consistent_with = v_with_k_stride(cfg_, n, v_in, got_v);
    s.k_bits.insert(s.k_bits.end(), got_k, got_k + kv_bytes(n));
    s.v_bits.insert(s.v_bits.end(), got_v, got_v + v_bytes(n));
    s.len += n;
    if (first && why) {
        *why = stored_row_reason(cfg_, "read-back", *first);
        if (!first->consistent_with.empty())
            *why += std::string(first->what == "k" ? "; every such key" : "; every V row of the call") +
                    " is consistent with " + first->consistent_with;
    }
    return first;
}

std::optional<Mismatch> CacheModel::store_quantized(Stream& s, uint32_t seq, uint32_t layer, uint32_t n,
                                                    const float* k_in, const float* v_in,
                                                    const StoredRows& want, const uint8_t* got_k,
                                                    const uint8_t* got_v, const uint8_t* got_ks, const uint8_t* got_vs,
                                                    uint32_t rope_stage, std::string* why) {
    if (!got_ks || !got_vs) throw std::logic_error("cache model: a quantized row stored without its scales");
    const uint32_t d = head_dim_;
    const size_t sb = head_scale_bytes_;
    std::optional<Mismatch> first;
    std::vector<float> lo(d), hi(d), got_vals(d);
    for (uint32_t i = 0; i < n; ++i)
        for (uint32_t h = 0; h < cfg_.n_kv_heads; ++h) {
            const size_t hr = static_cast<size_t>(i) * cfg_.n_kv_heads + h, e0 = hr * d;
            bool k_ok = quantized_row_equal(cfg_, &want.k_bits[e0], &want.k_scale_bits[hr * sb], got_k + e0,
                                            got_ks + hr * sb);
            if (!k_ok && cfg_.rope != KVC_ROPE_NONE) { // the implementation's own rotation, within its error
                for (uint32_t x = 0; x < d; ++x) {
                    const KeyInterval iv = rotated_key_interval(cfg_, rope_stage, k_in + i * row_elems_, s.len + i,
                                                                h * d + x, want.rotated[e0 + x]);
                    lo[x] = iv.lo;
                    hi[x] = iv.hi;
                }
                k_ok = quantized_row_acceptable(cfg_, cfg_.fp8_scale(1, layer, h), lo.data(), hi.data(), got_k + e0,
                                                got_ks + hr * sb);
            }
            const bool v_ok = quantized_row_equal(cfg_, &want.v_bits[e0], &want.v_scale_bits[hr * sb], got_v + e0,
                                                  got_vs + hr * sb);
            // attended: what was stored when it is acceptable, else what should have been (not graded twice)
            if (k_ok) dequantize_head_row(cfg_, got_k + e0, got_ks + hr * sb, got_vals.data());
            s.k_eff.insert(s.k_eff.end(), k_ok ? got_vals.begin() : want.k.begin() + e0,
                           k_ok ? got_vals.end() : want.k.begin() + e0 + d);
            s.v_eff.insert(s.v_eff.end(), want.v.begin() + e0, want.v.begin() + e0 + d);
            if ((k_ok && v_ok) || first) continue;
            QuantEvidence ev;
            ev.cfg = &cfg_;
            ev.which = k_ok ? 2 : 1;
            ev.layer = layer;
            ev.kv_head = h;
            ev.x = k_ok ? v_in + e0 : &want.rotated[e0];
            ev.want_codes = k_ok ? &want.v_bits[e0] : &want.k_bits[e0];
            ev.want_scales = k_ok ? &want.v_scale_bits[hr * sb] : &want.k_scale_bits[hr * sb];
            ev.got_codes = k_ok ? got_v + e0 : got_k + e0;
            ev.got_scales = k_ok ? got_vs + hr * sb : got_ks + hr * sb;
            const QuantFinding f = diagnose_quantized_row(ev);
            const std::string what = std::string(k_ok ? "v" : "k") + (f.scale ? " scale" : "");
            const uint32_t dim = f.scale ? (cfg_.cache_dtype == KVC_DTYPE_Q8_0 ? f.index * 32 : 0) : f.index;
            first = at_element(k_ok ? "v" : "k", seq, layer, (static_cast<size_t>(s.len) + i) * row_elems_ + h * d + dim);
            first->what = what;
            if (f.scale && cfg_.cache_dtype != KVC_DTYPE_Q8_0) first->dim = -1;
            first->expected = f.expected;
            first->actual = f.actual;
            if (why)
                *why = std::string("read-back ") + what + " differs from the reference quantizer's (" +
                       dtype_name(cfg_.cache_dtype) + (!k_ok && cfg_.rope != KVC_ROPE_NONE
                                                           ? ", for every rotation within an f32 rotation's error"
                                                           : ", bitwise") +
                       "): " + f.text;
        }
    s.k_raw.insert(s.k_raw.end(), want.rotated.begin(), want.rotated.end());
    s.v_raw.insert(s.v_raw.end(), v_in, v_in + static_cast<size_t>(n) * row_elems_);
    const size_t bytes = static_cast<size_t>(n) * row_elems_, sbytes = static_cast<size_t>(n) * cfg_.n_kv_heads * sb;
    s.k_bits.insert(s.k_bits.end(), got_k, got_k + bytes);
    s.v_bits.insert(s.v_bits.end(), got_v, got_v + bytes);
    s.k_scale_bits.insert(s.k_scale_bits.end(), got_ks, got_ks + sbytes);
    s.v_scale_bits.insert(s.v_scale_bits.end(), got_vs, got_vs + sbytes);
    s.len += n;
    return first;
}

StoredRows CacheModel::store_expected(uint32_t seq, uint32_t layer, uint32_t n, const float* k_in,
                                      const float* v_in) {
    Stream& s = streams_.at(seq).at(layer);
    StoredRows want = expected_new_rows(cfg_, s.len, n, k_in, v_in, layer);
    s.k_eff.insert(s.k_eff.end(), want.k.begin(), want.k.end());
    s.v_eff.insert(s.v_eff.end(), want.v.begin(), want.v.end());
    s.k_bits.insert(s.k_bits.end(), want.k_bits.begin(), want.k_bits.end());
    s.v_bits.insert(s.v_bits.end(), want.v_bits.begin(), want.v_bits.end());
    s.k_scale_bits.insert(s.k_scale_bits.end(), want.k_scale_bits.begin(), want.k_scale_bits.end());
    s.v_scale_bits.insert(s.v_scale_bits.end(), want.v_scale_bits.begin(), want.v_scale_bits.end());
    if (quantized_) {
        s.k_raw.insert(s.k_raw.end(), want.rotated.begin(), want.rotated.end());
        s.v_raw.insert(s.v_raw.end(), v_in, v_in + static_cast<size_t>(n) * row_elems_);
    }
    s.len += n;
    return want;
}

std::optional<Mismatch> CacheModel::first_changed(uint32_t seq, uint32_t layer, const uint8_t* got_k,
                                                  const uint8_t* got_v, const uint8_t* got_ks,
                                                  const uint8_t* got_vs) const {
    const Stream& s = stream(seq, layer);
    if (quantized_) {
        if (!got_ks || !got_vs) throw std::logic_error("cache model: quantized rows compared without their scales");
        // the codes as bytes; a changed code reports its code value, a changed scale its head row
        const std::pair<const std::vector<uint8_t>*, const uint8_t*> all[] = {
            {&s.k_bits, got_k}, {&s.v_bits, got_v}, {&s.k_scale_bits, got_ks}, {&s.v_scale_bits, got_vs}};
        for (int pass = 0; pass < 4; ++pass) {
            const std::vector<uint8_t>& want = *all[pass].first;
            const uint8_t* got = all[pass].second;
            if (want.empty() || std::memcmp(want.data(), got, want.size()) == 0) continue;
            const size_t byte = static_cast<size_t>(std::mismatch(want.begin(), want.end(), got).first - want.begin());
            const bool scale = pass >= 2;
            const size_t el = scale ? byte / head_scale_bytes_ * head_dim_ : byte; // scale: its head row
            Mismatch m = at_element(pass % 2 == 0 ? "k" : "v", seq, layer, el);
            if (scale) m.what += " scale";
            const bool fp8 = dtype_is_fp8(cfg_.cache_dtype);
            m.expected = scale ? want[byte] : fp8 ? want[byte] : static_cast<int8_t>(want[byte]);
            m.actual = scale ? got[byte] : fp8 ? got[byte] : static_cast<int8_t>(got[byte]);
            if (scale) m.what += " byte";
            return m;
        }
        return std::nullopt;
    }
    const std::pair<const std::vector<uint8_t>*, const uint8_t*> pairs[] = {{&s.k_bits, got_k}, {&s.v_bits, got_v}};
    for (int pass = 0; pass < 2; ++pass) {
        const std::vector<uint8_t>& want = *pairs[pass].first;
        const uint8_t* got = pairs[pass].second;
        if (want.empty() || std::memcmp(want.data(), got, want.size()) == 0) continue;
        const size_t byte = static_cast<size_t>(std::mismatch(want.begin(), want.end(), got).first - want.begin());
        const size_t el = byte / elem_bytes_;
        Mismatch m = at_element(pass == 0 ? "k" : "v", seq, layer, el);
        m.expected = ref::load_dtype(want.data() + el * elem_bytes_, cfg_.cache_dtype);
        m.actual = ref::load_dtype(got + el * elem_bytes_, cfg_.cache_dtype);
        return m;
    }
    return std::nullopt;
}

void CacheModel::fork(uint32_t parent, uint32_t child) {
    streams_.at(child) = streams_.at(parent);
    for (uint32_t layer = 0; layer < cfg_.n_layers; ++layer) {
        Stream& c = streams_[child][layer];
        const uint32_t n = c.len;
        std::vector<Stream::Share> inherited;
        for (Stream::Share& s : c.shares) // what the parent shares with others, the child now shares too
            if (!s.released && s.seq != child) {
                s.rows = std::min(s.rows, n);
                streams_[s.seq][layer].shares.push_back({child, s.rows, false});
                inherited.push_back(s);
            }
        c.shares = inherited;
        c.shares.push_back({parent, n, false});
        streams_[parent][layer].shares.push_back({child, n, false});
        c.chain.push_back({next_instance_++, n});
    }
}

void CacheModel::release(uint32_t seq) {
    for (Stream& s : streams_.at(seq)) {
        s = Stream{};
        s.chain = {{next_instance_++, 0}};
    }
    for (auto& other : streams_)
        for (Stream& s : other)
            for (Stream::Share& sh : s.shares)
                if (sh.seq == seq) sh.released = true;
}

uint64_t CacheModel::shared_bytes_in_blocks(uint64_t block_tokens) const {
    const uint64_t b = std::max<uint64_t>(block_tokens, 1);
    std::vector<std::pair<uint64_t, uint64_t>> blocks; // (owner instance, block index)
    for (const auto& seq : streams_)
        for (const Stream& s : seq)
            for (uint64_t k = 0; k * b < s.len; ++k) {
                uint64_t owner = s.chain.front().instance;
                for (const Stream::Segment& g : s.chain)
                    if (g.start < (k + 1) * b) owner = g.instance;
                blocks.emplace_back(owner, k);
            }
    std::sort(blocks.begin(), blocks.end());
    const uint64_t n = static_cast<uint64_t>(std::unique(blocks.begin(), blocks.end()) - blocks.begin());
    return n * b * row_bytes();
}

std::string CacheModel::sharing_of(uint32_t seq, uint32_t layer, uint32_t pos) const {
    const Stream::Share* best = nullptr; // a released sibling explains a change best
    for (const Stream::Share& sh : stream(seq, layer).shares)
        if (pos < sh.rows && (!best || (sh.released && !best->released))) best = &sh;
    if (!best) return "";
    return "shared with sequence " + std::to_string(best->seq) + (best->released ? " until its release" : "");
}

uint64_t CacheModel::row_bytes() const { return token_bytes(cfg_); }

size_t CacheModel::kv_bytes(uint32_t rows) const { return static_cast<size_t>(rows) * row_elems_ * elem_bytes_; }

size_t CacheModel::v_bytes(uint32_t rows) const { return static_cast<size_t>(rows) * v_row_elems_ * elem_bytes_; }

size_t CacheModel::scale_bytes(uint32_t rows) const {
    return static_cast<size_t>(rows) * cfg_.n_kv_heads * head_scale_bytes_;
}

uint64_t CacheModel::live_bytes() const {
    uint64_t rows = 0;
    for (const auto& seq : streams_)
        for (const Stream& s : seq) rows += s.len - s.dropped;
    return rows * row_bytes();
}

uint64_t CacheModel::live_bytes_in_blocks(uint64_t block_tokens) const {
    const uint64_t b = block_tokens;
    uint64_t rows = 0;
    for (const auto& seq : streams_)
        for (uint32_t layer = 0; layer < seq.size(); ++layer) {
            const uint64_t len = seq[layer].len, whole = (len + b - 1) / b;
            const uint64_t dead_end = cfg_.evict ? cfg_.dead_end(layer, seq[layer].len) : 0;
            if (dead_end == 0) {
                rows += whole * b;
                continue;
            }
            // blocks 0 .. sink_blocks-1 hold the sinks, window_first .. whole-1 the rows still visible
            const uint64_t sink_blocks = (cfg_.n_sinks + b - 1) / b, window_first = dead_end / b;
            const uint64_t needed = sink_blocks + whole - std::max(window_first, sink_blocks);
            rows += std::min(whole, needed + 1) * b;
        }
    return rows * row_bytes();
}

} // namespace kvc::prop
