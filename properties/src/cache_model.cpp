#include "kvcheck/properties/cache_model.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/splitmix64.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

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

AppendInputs append_inputs(const CaseConfig& cfg, uint64_t data_seed, uint32_t op, uint32_t seq, uint32_t layer,
                           uint32_t n_new, uint32_t qstream, bool extreme) {
    const size_t qrow = static_cast<size_t>(cfg.n_q_heads) * cfg.head_dim;
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
    AppendInputs in;
    in.q.resize(n_new * qrow);
    in.k.resize(n_new * row);
    in.v.resize(n_new * row);
    for (uint32_t i = 0; i < n_new; ++i) {
        for (size_t x = 0; x < qrow; ++x)
            in.q[i * qrow + x] = input_value(data_seed, op, seq, layer, i, 0, static_cast<uint32_t>(x), qstream);
        for (size_t x = 0; x < row; ++x) {
            in.k[i * row + x] = input_value(data_seed, op, seq, layer, i, 1, static_cast<uint32_t>(x));
            in.v[i * row + x] = input_value(data_seed, op, seq, layer, i, 2, static_cast<uint32_t>(x));
            if (extreme) { // 2^14 with the drawn sign: exact in f16 and bf16, and a rotated pair stays < 65504
                in.k[i * row + x] = std::copysign(kExtremeValue, in.k[i * row + x]);
                in.v[i * row + x] = std::copysign(kExtremeValue, in.v[i * row + x]);
            }
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

StoredRows expected_new_rows(const CaseConfig& cfg, uint32_t pos_begin, uint32_t n_new, const float* k,
                             const float* v) {
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
    const size_t es = dtype_size(cfg.cache_dtype);
    StoredRows r;
    r.k.resize(n_new * row);
    r.v.resize(n_new * row);
    r.k_bits.resize(n_new * row * es);
    r.v_bits.resize(n_new * row * es);
    r.rotated.resize(n_new * row);
    for (uint32_t i = 0; i < n_new; ++i)
        expected_rotated_key(cfg, k + i * row, pos_begin + i, r.rotated.data() + i * row);
    for (size_t x = 0; x < r.k.size(); ++x) r.k[x] = ref::round_to_dtype(r.rotated[x], cfg.cache_dtype);
    for (size_t x = 0; x < r.k.size(); ++x) {
        ref::store_dtype(r.k[x], cfg.cache_dtype, r.k_bits.data() + x * es);
        ref::store_dtype(v[x], cfg.cache_dtype, r.v_bits.data() + x * es);
        r.v[x] = ref::load_dtype(r.v_bits.data() + x * es, cfg.cache_dtype);
    }
    return r;
}

std::string stored_row_reason(const CaseConfig& cfg, const char* source, const Mismatch& m) {
    return std::string(source) + " " + m.what + " differs from the appended value rounded to " +
           dtype_name(cfg.cache_dtype) +
           (cfg.rope != KVC_ROPE_NONE && m.what == "k"
                ? " and rotated (not the rounding of an f32 rotation, nor within the bound of the declared RoPE stage)"
                : " (bitwise)");
}

uint64_t live_bytes(const CaseConfig& cfg, const std::vector<std::vector<uint32_t>>& lengths) {
    const uint64_t row_bytes = 2ull * cfg.n_kv_heads * cfg.head_dim * dtype_size(cfg.cache_dtype);
    uint64_t total = 0;
    for (const auto& seq : lengths)
        for (uint32_t l : seq) total += l * row_bytes;
    return total;
}

// ---- the model ----

CacheModel::CacheModel(const CaseConfig& cfg)
    : cfg_(cfg), head_dim_(cfg.head_dim), row_elems_(static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim),
      elem_bytes_(dtype_size(cfg.cache_dtype)), streams_(cfg.max_seqs, std::vector<Stream>(cfg.n_layers)) {}

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
    m.pos = static_cast<int>(element / row_elems_);
    m.head = static_cast<int>(element % row_elems_ / head_dim_);
    m.dim = static_cast<int>(element % head_dim_);
    return m;
}

std::optional<Mismatch> CacheModel::store(uint32_t seq, uint32_t layer, uint32_t n, const float* k_in,
                                          const float* v_in, const uint8_t* got_k, const uint8_t* got_v,
                                          uint32_t rope_stage) {
    Stream& s = streams_.at(seq).at(layer);
    const StoredRows want = expected_new_rows(cfg_, s.len, n, k_in, v_in);
    std::optional<Mismatch> first;
    for (uint32_t i = 0; i < n; ++i)
        for (size_t x = 0; x < row_elems_; ++x) {
            const size_t e = i * row_elems_ + x;
            const uint8_t* gk_bits = got_k + e * elem_bytes_;
            const uint8_t* gv_bits = got_v + e * elem_bytes_;
            const float gk = ref::load_dtype(gk_bits, cfg_.cache_dtype), gv = ref::load_dtype(gv_bits, cfg_.cache_dtype);
            // a key the implementation rotated itself may be the rounding of any rotation within an ordinary f32
            // rotation's error (stored_key_acceptable); without RoPE the stored bits are exact
            const bool k_ok = std::memcmp(want.k_bits.data() + e * elem_bytes_, gk_bits, elem_bytes_) == 0 ||
                              (cfg_.rope != KVC_ROPE_NONE &&
                               stored_key_acceptable(cfg_, rope_stage, k_in + i * row_elems_, s.len + i,
                                                     static_cast<uint32_t>(x), want.rotated[e], gk));
            const bool v_ok = std::memcmp(want.v_bits.data() + e * elem_bytes_, gv_bits, elem_bytes_) == 0;
            s.k_eff.push_back(k_ok ? gk : want.k[e]);
            s.v_eff.push_back(want.v[e]);
            if ((k_ok && v_ok) || first) continue;
            first = at_element(!k_ok ? "k" : "v", seq, layer, (static_cast<size_t>(s.len) + i) * row_elems_ + x);
            first->expected = !k_ok ? want.k[e] : want.v[e];
            first->actual = !k_ok ? gk : gv;
        }
    const size_t bytes = static_cast<size_t>(n) * row_elems_ * elem_bytes_;
    s.k_bits.insert(s.k_bits.end(), got_k, got_k + bytes);
    s.v_bits.insert(s.v_bits.end(), got_v, got_v + bytes);
    s.len += n;
    return first;
}

StoredRows CacheModel::store_expected(uint32_t seq, uint32_t layer, uint32_t n, const float* k_in,
                                      const float* v_in) {
    Stream& s = streams_.at(seq).at(layer);
    StoredRows want = expected_new_rows(cfg_, s.len, n, k_in, v_in);
    s.k_eff.insert(s.k_eff.end(), want.k.begin(), want.k.end());
    s.v_eff.insert(s.v_eff.end(), want.v.begin(), want.v.end());
    s.k_bits.insert(s.k_bits.end(), want.k_bits.begin(), want.k_bits.end());
    s.v_bits.insert(s.v_bits.end(), want.v_bits.begin(), want.v_bits.end());
    s.len += n;
    return want;
}

std::optional<Mismatch> CacheModel::first_changed(uint32_t seq, uint32_t layer, const uint8_t* got_k,
                                                  const uint8_t* got_v) const {
    const Stream& s = stream(seq, layer);
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

void CacheModel::fork(uint32_t parent, uint32_t child) { streams_.at(child) = streams_.at(parent); }

void CacheModel::release(uint32_t seq) {
    for (Stream& s : streams_.at(seq)) s = Stream{};
}

uint64_t CacheModel::row_bytes() const { return 2ull * row_elems_ * elem_bytes_; }

size_t CacheModel::kv_bytes(uint32_t rows) const { return static_cast<size_t>(rows) * row_elems_ * elem_bytes_; }

uint64_t CacheModel::live_bytes() const { return prop::live_bytes(cfg_, lengths()); }

uint64_t CacheModel::live_bytes_in_blocks(uint64_t block_tokens) const {
    uint64_t total = 0;
    for (const auto& seq : streams_)
        for (const Stream& s : seq) total += (s.len + block_tokens - 1) / block_tokens * block_tokens * row_bytes();
    return total;
}

} // namespace kvc::prop
