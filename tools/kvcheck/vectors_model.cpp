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
    case StepKind::AppendBatch: return "append_batch";
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
            const bool batch = op.kind == prop::OpKind::AppendBatch;
            for (uint32_t layer : order) {
                // an Append op with several entries is one call per entry, as the session makes it
                for (size_t a = 0; a < op.appends.size(); ++a) {
                    const prop::SeqAppend& sa = op.appends[a];
                    if (!batch || a == 0) {
                        s.kind = batch ? StepKind::AppendBatch : StepKind::Append;
                        s.layer = layer;
                        s.n_new = 0;
                        s.slices.clear();
                    }
                    Slice sl;
                    sl.seq = sa.seq;
                    sl.n_new = sa.n_new;
                    sl.pos_begin = len.at(sa.seq).at(layer);
                    sl.token_begin = s.n_new;
                    len[sa.seq][layer] += sa.n_new;
                    s.n_new += sa.n_new;
                    s.slices.push_back(sl);
                    s.seq = batch ? 0 : sa.seq;
                    s.pos_begin = batch ? 0 : sl.pos_begin;
                    if (!batch || a + 1 == op.appends.size()) steps.push_back(s);
                }
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

std::string dump_name(const Step& s, size_t i, const Slice& sl, const char* kv) {
    const std::string base = "step" + std::to_string(i) + ".";
    if (s.kind == StepKind::AppendBatch) return base + "s" + std::to_string(sl.seq) + "." + kv;
    return base + kv;
}

nlohmann::json step_json(const Step& s, size_t i) {
    nlohmann::json j = {{"step", i}, {"op", step_kind_name(s.kind)}, {"op_index", s.op}};
    const std::string base = "step" + std::to_string(i) + ".";
    const nlohmann::json inputs = {{"q", base + "q"}, {"k", base + "k"}, {"v", base + "v"}};
    switch (s.kind) {
    case StepKind::Append: {
        const Slice& sl = s.slices.front();
        j.update({{"seq", sl.seq},
                  {"layer", s.layer},
                  {"n_new", sl.n_new},
                  {"pos_begin", sl.pos_begin},
                  {"pos_end", sl.pos_begin + sl.n_new},
                  {"inputs", inputs},
                  {"dump", {{"k", dump_name(s, i, sl, "k")}, {"v", dump_name(s, i, sl, "v")}}}});
        break;
    }
    case StepKind::AppendBatch: {
        nlohmann::json slices = nlohmann::json::array();
        for (const Slice& sl : s.slices)
            slices.push_back({{"seq", sl.seq},
                              {"n_new", sl.n_new},
                              {"token_begin", sl.token_begin},
                              {"token_end", sl.token_begin + sl.n_new},
                              {"pos_begin", sl.pos_begin},
                              {"pos_end", sl.pos_begin + sl.n_new},
                              {"dump", {{"k", dump_name(s, i, sl, "k")}, {"v", dump_name(s, i, sl, "v")}}}});
        j.update({{"layer", s.layer}, {"n_new", s.n_new}, {"inputs", inputs}, {"slices", slices}});
        break;
    }
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
    // the same coordinates the session passes to input_value: (op, seq, layer, token within the sequence's append,
    // which, idx); a batch packs its sequences' tokens one after another
    for (const Slice& sl : s.slices)
        for (uint32_t i = 0; i < sl.n_new; ++i) {
            const size_t t = sl.token_begin + i;
            for (size_t x = 0; x < qrow; ++x)
                in.q[t * qrow + x] =
                    prop::input_value(c.data_seed, s.op, sl.seq, s.layer, i, 0, static_cast<uint32_t>(x));
            for (size_t x = 0; x < row; ++x) {
                in.k[t * row + x] =
                    prop::input_value(c.data_seed, s.op, sl.seq, s.layer, i, 1, static_cast<uint32_t>(x));
                in.v[t * row + x] =
                    prop::input_value(c.data_seed, s.op, sl.seq, s.layer, i, 2, static_cast<uint32_t>(x));
            }
        }
    return in;
}

StoredRows expected_new_rows(const prop::CaseConfig& cfg, const Slice& sl, const float* k, const float* v) {
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
    const size_t es = dtype_size(cfg.dtype);
    StoredRows r;
    r.k.resize(sl.n_new * row);
    r.v.resize(sl.n_new * row);
    r.k_bits.resize(sl.n_new * row * es);
    r.v_bits.resize(sl.n_new * row * es);
    r.rotated.resize(sl.n_new * row);
    for (uint32_t i = 0; i < sl.n_new; ++i)
        prop::expected_rotated_key(cfg, k + i * row, sl.pos_begin + i, r.rotated.data() + i * row);
    for (size_t x = 0; x < r.k.size(); ++x) r.k[x] = ref::round_to_dtype(r.rotated[x], cfg.dtype);
    for (size_t x = 0; x < r.k.size(); ++x) {
        ref::store_dtype(r.k[x], cfg.dtype, r.k_bits.data() + x * es);
        ref::store_dtype(v[x], cfg.dtype, r.v_bits.data() + x * es);
        r.v[x] = ref::load_dtype(r.v_bits.data() + x * es, cfg.dtype);
    }
    return r;
}

RowBounds row_bounds(const prop::CaseConfig& cfg, const prop::Expected& e) {
    const uint32_t d = cfg.head_dim, Hq = cfg.n_q_heads;
    const auto f32 = prop::allowed_errors(cfg, prop::pipeline_preset(KVC_PRECISION_F32), e);
    const auto c16 = prop::allowed_errors(cfg, prop::pipeline_preset(KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE), e);
    RowBounds b;
    b.f32.resize(static_cast<size_t>(e.n_new) * Hq);
    b.cache_dtype.resize(b.f32.size());
    for (size_t r = 0; r < b.f32.size(); ++r) { // the tightest element of the row: a bound that holds for all
        b.f32[r] = *std::min_element(f32.begin() + static_cast<std::ptrdiff_t>(r * d),
                                     f32.begin() + static_cast<std::ptrdiff_t>((r + 1) * d));
        b.cache_dtype[r] = *std::min_element(c16.begin() + static_cast<std::ptrdiff_t>(r * d),
                                             c16.begin() + static_cast<std::ptrdiff_t>((r + 1) * d));
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
    return prop::missing_caps(prop::required_caps(c), none); // a batch is one call: "batch" is a requirement
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

} // namespace kvc::vec
