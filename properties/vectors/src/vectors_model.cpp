#include "kvcheck/vectors/model.hpp"

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

std::string dump_name(const Step& s, size_t i, const Slice& sl, const char* kv) {
    const std::string base = "step" + std::to_string(i) + ".";
    if (s.kind == StepKind::AppendBatch) return base + "s" + std::to_string(sl.seq) + "." + kv;
    return base + kv;
}

std::string scales_name(const std::string& dump) { return dump + ".scales"; }

nlohmann::json dump_names_json(const std::string& k, const std::string& v, bool quantized) {
    nlohmann::json j = {{"k", k}, {"v", v}};
    if (quantized) j.update({{"k_scales", scales_name(k)}, {"v_scales", scales_name(v)}});
    return j;
}

nlohmann::json step_json(const Step& s, size_t i, bool quantized) {
    nlohmann::json j = {{"step", i}, {"op", step_kind_name(s.kind)}, {"op_index", s.op}};
    const std::string base = "step" + std::to_string(i) + ".";
    const nlohmann::json inputs = {{"q", base + "q"}, {"k", base + "k"}, {"v", base + "v"}};
    const auto dump = [&](const Slice& sl) {
        return dump_names_json(dump_name(s, i, sl, "k"), dump_name(s, i, sl, "v"), quantized);
    };
    switch (s.kind) {
    case StepKind::Append: {
        const Slice& sl = s.slices.front();
        j.update({{"seq", sl.seq},
                  {"layer", s.layer},
                  {"n_new", sl.n_new},
                  {"pos_begin", sl.pos_begin},
                  {"pos_end", sl.pos_begin + sl.n_new},
                  {"inputs", inputs},
                  {"dump", dump(sl)}});
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
                              {"dump", dump(sl)}});
        j.update({{"layer", s.layer}, {"n_new", s.n_new}, {"inputs", inputs}, {"slices", slices}});
        break;
    }
    case StepKind::Fork: j.update({{"parent", s.seq}, {"child", s.child}}); break;
    case StepKind::Release: j["seq"] = s.seq; break;
    }
    return j;
}

RowBounds row_bounds(const prop::CaseConfig& cfg, const prop::Expected& e) {
    const uint32_t d = cfg.dv(), Hq = cfg.n_q_heads; // an output row has head_dim_v dims
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

st::DType cache_st_dtype(uint32_t cache_dtype) {
    switch (cache_dtype) {
    case KVC_DTYPE_F32: return st::DType::F32;
    case KVC_DTYPE_F16: return st::DType::F16;
    case KVC_DTYPE_FP8_E4M3: return st::DType::F8_E4M3;
    case KVC_DTYPE_FP8_E5M2: return st::DType::F8_E5M2;
    case KVC_DTYPE_INT8_TOKEN:
    case KVC_DTYPE_Q8_0: return st::DType::I8;
    default: return st::DType::BF16;
    }
}

st::DType scales_st_dtype(const prop::CaseConfig& cfg) {
    return scale_size(cfg.cache_dtype, cfg.int8_scale_dtype) == 2 ? st::DType::F16 : st::DType::F32;
}

std::vector<uint64_t> scales_shape(const prop::CaseConfig& cfg, uint64_t rows) {
    if (cfg.cache_dtype == KVC_DTYPE_Q8_0)
        return {rows, cfg.n_kv_heads, scales_per_head_row(cfg.cache_dtype, cfg.head_dim)};
    return {rows, cfg.n_kv_heads};
}

nlohmann::json quant_config_json(const prop::CaseConfig& cfg) {
    nlohmann::json j = nlohmann::json::object();
    if (!dtype_is_quantized(cfg.cache_dtype)) return j;
    j["codes_dtype"] = st::dtype_name(cache_st_dtype(cfg.cache_dtype));
    j["scales_dtype"] = st::dtype_name(scales_st_dtype(cfg));
    j["scales_per_head_row"] = scales_per_head_row(cfg.cache_dtype, cfg.head_dim);
    if (dtype_is_fp8(cfg.cache_dtype)) {
        // the scales as values and, exact, as bit patterns: [n_layers] (tensor), [n_layers * n_kv_heads] (kv_head)
        const auto bits = [](const std::vector<float>& v) {
            nlohmann::json b = nlohmann::json::array();
            for (float x : v) b.push_back(float_bits(x));
            return b;
        };
        j["kv_scale_mode"] = prop::scale_mode_name(cfg.kv_scale_mode);
        j["k_scales"] = cfg.k_scales;
        j["k_scales_bits"] = bits(cfg.k_scales);
        j["v_scales"] = cfg.v_scales;
        j["v_scales_bits"] = bits(cfg.v_scales);
    }
    if (cfg.cache_dtype == KVC_DTYPE_INT8_TOKEN) j["int8_scale_dtype"] = dtype_name(cfg.int8_scale_dtype);
    return j;
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
    std::vector<std::string> words = prop::missing_caps(prop::required_caps(c), none); // "batch" included
    // the ABI 1.2 shapes in the words a caps file declares them by: missing_caps describes them for a reader
    // ("head_dim_v (V rows of their own size)"), and a driver compares `requires` with its declared words
    for (std::string& w : words) {
        if (w.rfind("head_dim_v (", 0) == 0) w = "head_dim_v";
        if (w.rfind("rope range (", 0) == 0) w = "rope_range";
    }
    return words;
}

nlohmann::json config_json(const prop::CaseConfig& cfg) {
    nlohmann::json j = {{"n_layers", cfg.n_layers},
        {"n_q_heads", cfg.n_q_heads},
        {"n_kv_heads", cfg.n_kv_heads},
        {"head_dim", cfg.head_dim},
        {"dtype", dtype_name(cfg.cache_dtype)},
        {"rope", rope_name(cfg.rope)},
        {"rope_theta", cfg.rope_theta},
        {"rope_theta_bits", float_bits(cfg.rope_theta)},
        {"scale", cfg.scale()},
        {"scale_bits", float_bits(cfg.scale())},
        {"max_seqs", cfg.max_seqs},
        {"max_tokens", cfg.max_tokens},
        {"block_size_hint", cfg.block_size_hint}};
    j.update(quant_config_json(cfg)); // nothing for a 16-bit dtype: its config is what it always was
    // the ABI 1.2 shapes, each only where the case has it, as the case's own JSON carries them: every other case's
    // config is what it always was
    if (!cfg.windows.empty()) j.update({{"windows", cfg.windows}, {"sinks", cfg.n_sinks}, {"evict", cfg.evict}});
    if (cfg.head_dim_v != 0) j["head_dim_v"] = cfg.head_dim_v;
    if (cfg.rope_dims != 0) j.update({{"rope_dim_begin", cfg.rope_dim_begin}, {"rope_dims", cfg.rope_dims}});
    return j;
}

} // namespace kvc::vec
