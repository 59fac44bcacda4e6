#include "vectors_model.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/session.hpp"
#include "kvcheck/properties/tolerance.hpp"
#include "kvcheck/reference/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace kvc::vec {

namespace {

struct Offline {
    const char* id;
    OfflineChecks checks;
};

// Each property reduced to the checks a set of files can support. NO-Q watches the allocator and runs twice: it has
// no offline form.
const Offline kOffline[] = {
    {"EQUIV", {true, false, false, false}},         {"CACHE-CONTENT", {false, true, false, false}},
    {"APPEND-ONLY", {false, false, true, false}},   {"MEMORY", {false, false, false, true}},
    {"LAYERS", {true, false, false, false}},        {"GQA", {true, false, false, false}},
    {"BATCH", {true, false, false, false}},         {"FORK", {true, false, true, false}},
    {"RELEASE", {true, true, true, false}},
};

} // namespace

OfflineProperty offline_property(const std::string& id) {
    for (const Offline& o : kOffline)
        if (id == o.id) return {true, o.checks};
    return {};
}

std::vector<std::string> offline_property_ids() {
    std::vector<std::string> ids;
    for (const Offline& o : kOffline) ids.emplace_back(o.id);
    return ids;
}

const char* step_kind_name(StepKind k) {
    switch (k) {
    case StepKind::Append: return "append";
    case StepKind::Fork: return "fork";
    case StepKind::Release: return "release";
    }
    return "?";
}

std::vector<Step> expand_steps(const prop::Case& c) {
    std::vector<Step> steps;
    // rows held per (seq, layer), to give each append its first position
    std::vector<std::vector<uint32_t>> len(c.cfg.max_seqs, std::vector<uint32_t>(c.cfg.n_layers, 0));
    for (size_t i = 0; i < c.ops.size(); ++i) {
        const prop::Op& op = c.ops[i];
        Step s;
        s.op = static_cast<uint32_t>(i);
        switch (op.kind) {
        case prop::OpKind::Append:
        case prop::OpKind::AppendBatch: {
            std::vector<uint32_t> order = op.layer_order;
            if (order.empty()) {
                order.resize(c.cfg.n_layers);
                std::iota(order.begin(), order.end(), 0u);
            }
            for (uint32_t layer : order)
                for (const prop::SeqAppend& a : op.appends) {
                    s.kind = StepKind::Append;
                    s.seq = a.seq;
                    s.layer = layer;
                    s.n_new = a.n_new;
                    s.pos_begin = len.at(a.seq).at(layer);
                    len[a.seq][layer] += a.n_new;
                    steps.push_back(s);
                }
            break;
        }
        case prop::OpKind::Fork:
            s.kind = StepKind::Fork;
            s.seq = op.seq;
            s.child = op.child;
            len.at(op.child) = len.at(op.seq);
            steps.push_back(s);
            break;
        case prop::OpKind::Release:
            s.kind = StepKind::Release;
            s.seq = op.seq;
            std::fill(len.at(op.seq).begin(), len.at(op.seq).end(), 0u);
            steps.push_back(s);
            break;
        }
    }
    return steps;
}

nlohmann::json step_json(const Step& s, size_t i) {
    nlohmann::json j = {{"step", i}, {"op", step_kind_name(s.kind)}, {"op_index", s.op}};
    const std::string base = "step" + std::to_string(i) + ".";
    switch (s.kind) {
    case StepKind::Append:
        j.update({{"seq", s.seq},
                  {"layer", s.layer},
                  {"n_new", s.n_new},
                  {"pos_begin", s.pos_begin},
                  {"pos_end", s.pos_begin + s.n_new},
                  {"inputs", {{"q", base + "q"}, {"k", base + "k"}, {"v", base + "v"}}}});
        break;
    case StepKind::Fork: j.update({{"parent", s.seq}, {"child", s.child}}); break;
    case StepKind::Release: j["seq"] = s.seq; break;
    }
    return j;
}

StepInputs step_inputs(const prop::Case& c, const Step& s) {
    const size_t qrow = static_cast<size_t>(c.cfg.n_q_heads) * c.cfg.head_dim;
    const size_t row = static_cast<size_t>(c.cfg.n_kv_heads) * c.cfg.head_dim;
    StepInputs in;
    in.q.resize(s.n_new * qrow);
    in.k.resize(s.n_new * row);
    in.v.resize(s.n_new * row);
    // the same coordinates the session passes to input_value: (op, seq, layer, token within the append, which, idx)
    for (uint32_t i = 0; i < s.n_new; ++i) {
        for (size_t x = 0; x < qrow; ++x)
            in.q[i * qrow + x] = prop::input_value(c.data_seed, s.op, s.seq, s.layer, i, 0, static_cast<uint32_t>(x));
        for (size_t x = 0; x < row; ++x) {
            in.k[i * row + x] = prop::input_value(c.data_seed, s.op, s.seq, s.layer, i, 1, static_cast<uint32_t>(x));
            in.v[i * row + x] = prop::input_value(c.data_seed, s.op, s.seq, s.layer, i, 2, static_cast<uint32_t>(x));
        }
    }
    return in;
}

StoredRows expected_new_rows(const prop::CaseConfig& cfg, const Step& s, const StepInputs& in) {
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
    const size_t es = dtype_size(cfg.dtype);
    StoredRows r;
    r.k.resize(s.n_new * row);
    r.v.resize(s.n_new * row);
    r.k_bits.resize(s.n_new * row * es);
    r.v_bits.resize(s.n_new * row * es);
    for (uint32_t i = 0; i < s.n_new; ++i)
        prop::expected_stored_key(cfg, in.k.data() + i * row, s.pos_begin + i, r.k.data() + i * row);
    for (size_t x = 0; x < r.k.size(); ++x) {
        ref::store_dtype(r.k[x], cfg.dtype, r.k_bits.data() + x * es);
        ref::store_dtype(in.v[x], cfg.dtype, r.v_bits.data() + x * es);
        r.v[x] = ref::load_dtype(r.v_bits.data() + x * es, cfg.dtype);
    }
    return r;
}

RowBounds row_bounds(const prop::CaseConfig& cfg, const prop::Expected& e) {
    const uint32_t d = cfg.head_dim, Hq = cfg.n_q_heads;
    const double floor_f32 = prop::tolerance_floor(KVC_PRECISION_F32, cfg.dtype);
    const double floor_c16 = prop::tolerance_floor(KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE, cfg.dtype);
    RowBounds b;
    b.f32.resize(static_cast<size_t>(e.n_new) * Hq);
    b.cache_dtype.resize(b.f32.size());
    for (size_t r = 0; r < b.f32.size(); ++r) {
        const double vs = e.v_scale[r];
        double n32 = 0, n16 = 0;
        for (uint32_t x = 0; x < d; ++x) {
            const double want = static_cast<double>(e.oracle[r * d + x]);
            n32 = std::max(n32, std::fabs(e.naive_f32[r * d + x] - want) / vs);
            n16 = std::max(n16, std::fabs(e.naive_cache_accum[r * d + x] - want) / vs);
        }
        b.f32[r] = std::max(2.0 * n32, floor_f32);
        b.cache_dtype[r] = std::max(2.0 * n16, floor_c16);
    }
    return b;
}

uint64_t live_bytes(const prop::CaseConfig& cfg, const std::vector<std::vector<uint32_t>>& lengths) {
    const uint64_t row_bytes = 2ull * cfg.n_kv_heads * cfg.head_dim * dtype_size(cfg.dtype);
    uint64_t total = 0;
    for (const auto& seq : lengths)
        for (uint32_t l : seq) total += l * row_bytes;
    return total;
}

std::string float_bits(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", b);
    return buf;
}

std::string case_stem(const std::string& id) {
    std::string s = id;
    std::replace(s.begin(), s.end(), '/', '_');
    return s;
}

std::vector<std::string> required_words(const prop::Case& c) {
    kvc_caps none{};
    none.struct_size = sizeof none;
    std::vector<std::string> words;
    for (const std::string& w : prop::missing_caps(prop::required_caps(c), none))
        if (w != "batch") words.push_back(w); // a batch is replayed as single-sequence appends
    return words;
}

nlohmann::json config_json(const prop::CaseConfig& cfg) {
    return {{"n_layers", cfg.n_layers},
            {"n_q_heads", cfg.n_q_heads},
            {"n_kv_heads", cfg.n_kv_heads},
            {"head_dim", cfg.head_dim},
            {"dtype", dtype_name(cfg.dtype)},
            {"rope", rope_name(cfg.rope)},
            {"rope_theta", cfg.rope_theta},
            {"rope_theta_bits", float_bits(cfg.rope_theta)},
            {"scale", cfg.scale()},
            {"scale_bits", float_bits(cfg.scale())},
            {"max_seqs", cfg.max_seqs},
            {"max_tokens", cfg.max_tokens},
            {"block_size_hint", cfg.block_size_hint}};
}

const char* precision_word(uint32_t precision) {
    return precision == KVC_PRECISION_F32 ? "f32" : "q-and-v-accum-in-cache-dtype";
}

int precision_from_word(const std::string& w) {
    if (w == "f32") return KVC_PRECISION_F32;
    if (w == "q-and-v-accum-in-cache-dtype" || w == "q_and_v_accum_in_cache_dtype")
        return KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE;
    return -1;
}

} // namespace kvc::vec
