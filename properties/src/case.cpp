#include "kvcheck/properties/case.hpp"

#include "kvcheck/properties/tolerance.hpp"

#include "kvcheck/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace kvc::prop {

float CaseConfig::scale() const {
    return softmax_scale != 0.0f ? softmax_scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

bool CaseConfig::windowed() const {
    return std::any_of(windows.begin(), windows.end(), [](uint32_t w) { return w != 0; });
}

uint32_t CaseConfig::dead_end(uint32_t layer, uint32_t len) const {
    const uint32_t w = window(layer);
    // the next query sits at position len and sees j iff j < S or len - j < w: j >= len - w + 1
    if (w == 0 || len < w) return 0;
    const uint32_t first_seen = len - w + 1;
    return first_seen > n_sinks ? first_seen : 0;
}

kvc_config CaseConfig::to_abi() const {
    kvc_config c = make_config(n_layers, n_q_heads, n_kv_heads, head_dim, cache_dtype, max_seqs, max_tokens, rope,
                               block_size_hint, scale(), rope_theta);
    c.kv_scale_mode = kv_scale_mode;
    c.k_scales = k_scales.empty() ? nullptr : k_scales.data();
    c.v_scales = v_scales.empty() ? nullptr : v_scales.data();
    c.int8_scale_dtype = int8_scale_dtype;
    c.windows = windows.empty() ? nullptr : windows.data();
    c.n_sinks = n_sinks;
    c.evict = evict ? 1u : 0u;
    c.head_dim_v = head_dim_v;
    c.rope_dim_begin = rope_dim_begin;
    c.rope_dims = rope_dims;
    return c;
}

float CaseConfig::fp8_scale(uint32_t which, uint32_t layer, uint32_t kv_head) const {
    if (!dtype_is_fp8(cache_dtype) || kv_scale_mode == KVC_SCALE_NONE) return 1.0f;
    const std::vector<float>& s = which == 1 ? k_scales : v_scales;
    return kv_scale_mode == KVC_SCALE_TENSOR ? s.at(layer) : s.at(static_cast<size_t>(layer) * n_kv_heads + kv_head);
}

const char* scale_mode_name(uint32_t mode) {
    switch (mode) {
    case KVC_SCALE_NONE: return "none";
    case KVC_SCALE_TENSOR: return "tensor";
    case KVC_SCALE_KV_HEAD: return "kv_head";
    }
    return "unknown-scale-mode";
}

size_t scales_expected(const CaseConfig& c) {
    if (!dtype_is_fp8(c.cache_dtype)) return 0;
    if (c.kv_scale_mode == KVC_SCALE_TENSOR) return c.n_layers;
    if (c.kv_scale_mode == KVC_SCALE_KV_HEAD) return static_cast<size_t>(c.n_layers) * c.n_kv_heads;
    return 0;
}

std::vector<std::vector<uint32_t>> lengths_after_ops(const Case& c) {
    std::vector<std::vector<uint32_t>> out;
    std::vector<uint32_t> len(c.cfg.max_seqs, 0);
    out.push_back(len);
    for (const Op& op : c.ops) {
        switch (op.kind) {
        case OpKind::Append:
        case OpKind::AppendBatch:
            for (const SeqAppend& a : op.appends) len.at(a.seq) += a.n_new;
            break;
        case OpKind::Fork: len.at(op.child) = len.at(op.seq); break;
        case OpKind::Release: len.at(op.seq) = 0; break;
        }
        out.push_back(len);
    }
    return out;
}

kvc_caps required_caps(const Case& c) {
    kvc_caps r{};
    r.struct_size = sizeof r;
    r.dtypes = 1u << c.cfg.cache_dtype;
    if (dtype_is_fp8(c.cfg.cache_dtype) && c.cfg.kv_scale_mode == KVC_SCALE_TENSOR) r.quant |= KVC_QUANT_FP8_SCALE_TENSOR;
    if (dtype_is_fp8(c.cfg.cache_dtype) && c.cfg.kv_scale_mode == KVC_SCALE_KV_HEAD)
        r.quant |= KVC_QUANT_FP8_SCALE_KV_HEAD;
    if (c.cfg.cache_dtype == KVC_DTYPE_INT8_TOKEN && c.cfg.int8_scale_dtype == KVC_DTYPE_F16)
        r.quant |= KVC_QUANT_INT8_SCALE_F16;
    r.rope_variants = c.cfg.rope == KVC_ROPE_NONE ? 0u : 1u << c.cfg.rope;
    if (c.cfg.windowed()) {
        r.features |= KVC_FEATURE_WINDOW;
        r.max_window = *std::max_element(c.cfg.windows.begin(), c.cfg.windows.end());
        if (c.cfg.n_sinks > 0) r.features |= KVC_FEATURE_SINKS;
        r.max_sinks = c.cfg.n_sinks;
    }
    if (c.cfg.evict) r.features |= KVC_FEATURE_EVICT;
    if (c.cfg.dv() != c.cfg.head_dim) r.features |= KVC_FEATURE_HEAD_DIM_V;
    r.max_head_dim_v = c.cfg.dv();
    if (c.cfg.rope_dims != 0) r.features |= KVC_FEATURE_ROPE_RANGE;
    // the parameters it uses, as an implementation that hard-codes them would declare them (missing_caps compares)
    if (c.cfg.rope != KVC_ROPE_NONE) r.fixed_rope_theta = c.cfg.rope_theta;
    CaseConfig plain = c.cfg;
    plain.softmax_scale = 0.0f; // 1/sqrt(head_dim), as this harness rounds it
    if (c.cfg.scale() == plain.scale()) r.fixed_scale = KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM;
    if (c.cfg.n_kv_heads < c.cfg.n_q_heads) r.features |= KVC_FEATURE_GQA;
    r.max_layers = c.cfg.n_layers;
    r.max_q_heads = c.cfg.n_q_heads;
    r.max_kv_heads = c.cfg.n_kv_heads;
    r.max_head_dim = c.cfg.head_dim;
    r.max_seqs = c.cfg.max_seqs;
    const auto lens = lengths_after_ops(c);
    for (size_t i = 0; i < c.ops.size(); ++i) {
        const Op& op = c.ops[i];
        if (op.kind == OpKind::Fork) r.features |= KVC_FEATURE_FORK;
        if (op.kind == OpKind::Release) r.features |= KVC_FEATURE_RELEASE;
        if (op.kind == OpKind::AppendBatch) r.features |= KVC_FEATURE_BATCH;
        for (const SeqAppend& a : op.appends)
            if (a.n_new > 1 && lens[i][a.seq] > 0) r.features |= KVC_FEATURE_CHUNKED;
        for (uint32_t l : lens[i + 1]) r.max_tokens = std::max(r.max_tokens, l);
    }
    return r;
}

uint32_t head_dim_multiple(const kvc_caps& caps, bool rope) {
    const uint32_t m =
        std::max(rope && caps.head_dim_multiple_rope ? caps.head_dim_multiple_rope : caps.head_dim_multiple, 1u);
    bool q8_0_query = caps.struct_size >= offsetof(kvc_caps, pipeline) + sizeof(kvc_pipeline) &&
                      (caps.pipeline.flags & KVC_PIPELINE_DECLARED) && caps.pipeline.q == KVC_ROUND_Q8_0;
    for (const kvc_pipeline_rule& r : pipeline_rules(caps)) // a call graded by a rule quantizes q as it says
        q8_0_query = q8_0_query || r.pipeline.q == KVC_ROUND_Q8_0;
    if (!q8_0_query) return m;
    const uint64_t l = uint64_t(m / std::gcd(m, 32u)) * 32u; // q is quantized in blocks of 32 along each head
    return static_cast<uint32_t>(std::min<uint64_t>(l, UINT32_MAX));
}

std::vector<std::string> missing_caps(const kvc_caps& need, const kvc_caps& have) {
    std::vector<std::string> m;
    const bool rope = need.rope_variants != 0;
    const uint32_t multiple = head_dim_multiple(have, rope);
    if (need.max_head_dim % multiple != 0)
        m.push_back("head_dim " + std::to_string(need.max_head_dim) + " not a multiple of " +
                    std::to_string(multiple) + (rope && have.head_dim_multiple_rope ? " (with RoPE)" : ""));
    for (uint32_t d = 0; d <= KVC_DTYPE_Q8_0; ++d)
        if ((need.dtypes >> d & 1u) && !(have.dtypes >> d & 1u)) m.push_back(std::string("dtype ") + dtype_name(d));
    // quant: a 1.0/1.1 plugin's shorter caps read as 0 there (the caller zero-fills what struct_size leaves out)
    static const std::pair<uint32_t, const char*> quant[] = {{KVC_QUANT_FP8_SCALE_TENSOR, "fp8 scale per tensor"},
                                                             {KVC_QUANT_FP8_SCALE_KV_HEAD, "fp8 scale per kv head"},
                                                             {KVC_QUANT_INT8_SCALE_F16, "int8 scale in f16"}};
    for (const auto& [bit, name] : quant)
        if ((need.quant & bit) && !(have.quant & bit)) m.push_back(name);
    for (uint32_t r = 1; r < 3; ++r)
        if ((need.rope_variants >> r & 1u) && !(have.rope_variants >> r & 1u))
            m.push_back(std::string("rope ") + rope_name(r));
    static const std::pair<uint32_t, const char*> features[] = {
        {KVC_FEATURE_GQA, "gqa"},         {KVC_FEATURE_PAGED, "paged"}, {KVC_FEATURE_FORK, "fork"},
        {KVC_FEATURE_RELEASE, "release"}, {KVC_FEATURE_BATCH, "batch"}, {KVC_FEATURE_CHUNKED, "chunked"},
        {KVC_FEATURE_WINDOW, "window"},   {KVC_FEATURE_SINKS, "sinks"}, {KVC_FEATURE_EVICT, "evict"},
        {KVC_FEATURE_HEAD_DIM_V, "head_dim_v (V rows of their own size)"},
        {KVC_FEATURE_ROPE_RANGE, "rope range (RoPE on part of the head dims)"}};
    for (const auto& [bit, name] : features)
        if ((need.features & bit) && !(have.features & bit)) m.push_back(name);
    auto limit = [&](uint32_t n, uint32_t h, const char* what) {
        if (h != 0 && n > h) m.push_back(std::string(what) + " " + std::to_string(n) + " > " + std::to_string(h));
    };
    limit(need.max_layers, have.max_layers, "layers");
    limit(need.max_q_heads, have.max_q_heads, "q_heads");
    limit(need.max_kv_heads, have.max_kv_heads, "kv_heads");
    limit(need.max_head_dim, have.max_head_dim, "head_dim");
    limit(need.max_seqs, have.max_seqs, "seqs");
    limit(need.max_tokens, have.max_tokens, "tokens");
    // ABI 1.2 limits: an older plugin's shorter caps read as 0 there, and it declares no window anyway
    if (need.features & KVC_FEATURE_WINDOW) limit(need.max_window, have.max_window, "window");
    if (need.features & KVC_FEATURE_SINKS) limit(need.max_sinks, have.max_sinks, "sinks");
    if (need.features & KVC_FEATURE_HEAD_DIM_V) // 0 declares max_head_dim for V too
        limit(need.max_head_dim_v, have.max_head_dim_v ? have.max_head_dim_v : have.max_head_dim, "head_dim_v");
    // what it hard-codes: a case with another value (from a replay file, or drawn for another implementation)
    if (have.fixed_rope_theta > 0 && need.fixed_rope_theta > 0 && need.fixed_rope_theta != have.fixed_rope_theta) {
        std::ostringstream s;
        s << "rope_theta " << need.fixed_rope_theta << " (fixed at " << have.fixed_rope_theta << ")";
        m.push_back(s.str());
    }
    if (have.fixed_scale == KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM && need.fixed_scale != KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM)
        m.push_back("a softmax scale other than 1/sqrt(head_dim) (fixed)");
    return m;
}

namespace {

const char* op_name(OpKind k) {
    switch (k) {
    case OpKind::Append: return "append";
    case OpKind::AppendBatch: return "append_batch";
    case OpKind::Fork: return "fork";
    case OpKind::Release: return "release";
    }
    return "?";
}

template <typename T>
T need(const nlohmann::json& j, const char* key) {
    if (!j.is_object() || !j.contains(key)) throw std::invalid_argument(std::string("case: missing field \"") + key + "\"");
    if constexpr (std::is_integral_v<T>) { // no silent wrap of -1, no truncation of 16.7, no 2^32+1 -> 1
        if (!j.at(key).is_number_unsigned())
            throw std::invalid_argument(std::string("case: field \"") + key + "\" must be a non-negative integer");
        if (j.at(key).get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max()))
            throw std::invalid_argument(std::string("case: field \"") + key + "\" is " + j.at(key).dump() +
                                        ", more than " + std::to_string(std::numeric_limits<T>::max()));
    }
    if constexpr (std::is_floating_point_v<T>) // 1e300 would become inf as a float32 (and the plugin be blamed)
        if (j.at(key).is_number()) {
            const double x = j.at(key).get<double>();
            if (!std::isfinite(x) || std::fabs(x) > static_cast<double>(std::numeric_limits<T>::max()))
                throw std::invalid_argument(std::string("case: field \"") + key + "\" is " + j.at(key).dump() +
                                            ", out of the range of a float32");
        }
    try {
        return j.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
        throw std::invalid_argument(std::string("case: field \"") + key + "\" has the wrong type");
    }
}

// The ABI 1.2 fields. Absent in a case file written before them, they default to no scales and f32 int8 scales.
void quantization_from_json(const nlohmann::json& g, CaseConfig& cfg) {
    const bool fp8 = dtype_is_fp8(cfg.cache_dtype);
    if (g.contains("kv_scale_mode")) {
        const std::string m = need<std::string>(g, "kv_scale_mode");
        cfg.kv_scale_mode = m == "none" ? 0u : m == "tensor" ? 1u : m == "kv_head" ? 2u : 99u;
        if (cfg.kv_scale_mode == 99u) throw std::invalid_argument("case: kv_scale_mode must be none, tensor or kv_head");
        if (!fp8 && cfg.kv_scale_mode != KVC_SCALE_NONE)
            throw std::invalid_argument("case: kv_scale_mode other than none needs an fp8 dtype");
    }
    for (const auto& [key, out] : {std::pair{"k_scales", &cfg.k_scales}, std::pair{"v_scales", &cfg.v_scales}}) {
        if (!g.contains(key)) continue;
        if (!g[key].is_array()) throw std::invalid_argument(std::string("case: \"") + key + "\" must be an array");
        for (size_t i = 0; i < g[key].size(); ++i) {
            const float s = need<float>(nlohmann::json{{key, g[key][i]}}, key);
            if (!std::isfinite(s) || !(s > 0))
                throw std::invalid_argument(std::string("case: every entry of \"") + key +
                                            "\" must be a finite number > 0");
            out->push_back(s);
        }
    }
    const size_t want = scales_expected(cfg);
    if (cfg.k_scales.size() != want || cfg.v_scales.size() != want)
        throw std::invalid_argument("case: k_scales and v_scales must hold " + std::to_string(want) +
                                    " entries each for dtype " + dtype_name(cfg.cache_dtype) + " with kv_scale_mode " +
                                    scale_mode_name(cfg.kv_scale_mode) +
                                    " (n_layers for tensor, n_layers * n_kv_heads for kv_head, none otherwise)");
    if (g.contains("int8_scale_dtype")) {
        const std::string d = need<std::string>(g, "int8_scale_dtype");
        cfg.int8_scale_dtype = d == "f32" ? uint32_t{KVC_DTYPE_F32} : d == "f16" ? uint32_t{KVC_DTYPE_F16} : 99u;
        if (cfg.int8_scale_dtype == 99u) throw std::invalid_argument("case: int8_scale_dtype must be f32 or f16");
        if (cfg.cache_dtype != KVC_DTYPE_INT8_TOKEN && cfg.int8_scale_dtype != KVC_DTYPE_F32)
            throw std::invalid_argument("case: int8_scale_dtype f16 needs dtype int8_token");
    }
    if (cfg.cache_dtype == KVC_DTYPE_Q8_0 && cfg.head_dim % 32 != 0)
        throw std::invalid_argument("case: q8_0 needs a head_dim multiple of 32 (its blocks hold 32 values)");
}

// The ABI 1.2 window fields, all or none: "windows" (one per layer), "sinks", "evict".
void windows_from_json(const nlohmann::json& g, CaseConfig& cfg) {
    if (!g.contains("windows")) {
        if (g.contains("sinks") || g.contains("evict"))
            throw std::invalid_argument("case: \"sinks\" and \"evict\" need \"windows\" (one per layer)");
        return;
    }
    const nlohmann::json& w = g["windows"];
    if (!w.is_array()) throw std::invalid_argument("case: \"windows\" must be an array");
    for (const auto& x : w) {
        if (!x.is_number_unsigned()) throw std::invalid_argument("case: every window must be a non-negative integer");
        cfg.windows.push_back(need<uint32_t>(nlohmann::json{{"windows", x}}, "windows"));
    }
    if (cfg.windows.size() != cfg.n_layers)
        throw std::invalid_argument("case: \"windows\" must hold one window per layer (" +
                                    std::to_string(cfg.n_layers) + "), 0 for a layer without one");
    for (uint32_t w : cfg.windows)
        if (w > (1u << 20)) throw std::invalid_argument("case: a window exceeds 1048576");
    cfg.n_sinks = need<uint32_t>(g, "sinks");
    if (cfg.n_sinks > (1u << 20)) throw std::invalid_argument("case: sinks exceed 1048576");
    if (!g.contains("evict") || !g["evict"].is_boolean())
        throw std::invalid_argument("case: field \"evict\" must be true or false");
    cfg.evict = g["evict"].get<bool>();
    if (cfg.evict && !cfg.windowed())
        throw std::invalid_argument("case: evict needs a window in some layer (nothing is ever dead without one)");
}

// The ABI 1.2 latent and partial-rotary fields, each optional: "head_dim_v" (a V row's dims), "rope_dim_begin" with
// "rope_dims" (RoPE on those dims only). Only for a non-quantized dtype: a quantized V row of its own size is not
// modelled (its codes and scales per row are K's).
void latent_from_json(const nlohmann::json& g, CaseConfig& cfg) {
    if (g.contains("head_dim_v")) {
        cfg.head_dim_v = need<uint32_t>(g, "head_dim_v");
        if (cfg.head_dim_v == 0 || cfg.head_dim_v > 8192)
            throw std::invalid_argument("case: head_dim_v must be 1 .. 8192 (omit it for V rows of head_dim)");
    }
    if (g.contains("rope_dim_begin") != g.contains("rope_dims"))
        throw std::invalid_argument("case: \"rope_dim_begin\" and \"rope_dims\" go together");
    if (g.contains("rope_dims")) {
        cfg.rope_dim_begin = need<uint32_t>(g, "rope_dim_begin");
        cfg.rope_dims = need<uint32_t>(g, "rope_dims");
        if (cfg.rope == KVC_ROPE_NONE || cfg.rope_dims == 0 || cfg.rope_dims % 2 != 0 ||
            uint64_t{cfg.rope_dim_begin} + cfg.rope_dims > cfg.head_dim)
            throw std::invalid_argument("case: a RoPE range needs rope other than none and an even rope_dims > 0 "
                                        "with rope_dim_begin + rope_dims <= head_dim");
    }
    // The ABI's own spelling of "as K" and "the whole head" is 0: a case file that writes them out must reach an
    // implementation that declares neither feature exactly as a case without them would.
    if (cfg.head_dim_v == cfg.head_dim) cfg.head_dim_v = 0;
    if (cfg.rope_dim_begin == 0 && cfg.rope_dims == cfg.head_dim) cfg.rope_dims = 0;
    if ((cfg.head_dim_v != 0 || cfg.rope_dims != 0) && dtype_is_quantized(cfg.cache_dtype))
        throw std::invalid_argument("case: head_dim_v and a RoPE range need a non-quantized dtype");
}

} // namespace

nlohmann::json to_json(const Case& c) {
    nlohmann::json ops = nlohmann::json::array();
    for (const Op& op : c.ops) {
        nlohmann::json o = {{"op", op_name(op.kind)}};
        if (op.kind == OpKind::Append || op.kind == OpKind::AppendBatch) {
            nlohmann::json a = nlohmann::json::array();
            for (const SeqAppend& s : op.appends) {
                nlohmann::json e = {{"seq", s.seq}, {"n_new", s.n_new}};
                if (s.extreme) e["extreme"] = true; // optional: absent means ordinary rows
                a.push_back(e);
            }
            o["appends"] = a;
            if (!op.layer_order.empty()) o["layer_order"] = op.layer_order;
        } else {
            o["seq"] = op.seq;
            if (op.kind == OpKind::Fork) o["child"] = op.child;
        }
        ops.push_back(o);
    }
    const CaseConfig& g = c.cfg;
    nlohmann::json config = {{"n_layers", g.n_layers}, {"n_q_heads", g.n_q_heads}, {"n_kv_heads", g.n_kv_heads},
                             {"head_dim", g.head_dim}, {"dtype", dtype_name(g.cache_dtype)}, {"rope", rope_name(g.rope)},
                             {"block_size_hint", g.block_size_hint}, {"max_seqs", g.max_seqs},
                             {"max_tokens", g.max_tokens}, {"rope_theta", g.rope_theta}, {"scale", g.scale()}};
    // the quantization fields only where they mean something: a 16-bit case's JSON is what it always was
    if (dtype_is_fp8(g.cache_dtype)) {
        config["kv_scale_mode"] = scale_mode_name(g.kv_scale_mode);
        if (g.kv_scale_mode != KVC_SCALE_NONE) { // floats widen to double exactly and print round-trip exactly
            config["k_scales"] = g.k_scales;
            config["v_scales"] = g.v_scales;
        }
    }
    if (g.cache_dtype == KVC_DTYPE_INT8_TOKEN) config["int8_scale_dtype"] = dtype_name(g.int8_scale_dtype);
    if (!g.windows.empty()) { // only in windowed cases: every other case's JSON is what it always was
        config["windows"] = g.windows;
        config["sinks"] = g.n_sinks;
        config["evict"] = g.evict;
    }
    if (g.score_scale > 0) config["score_scale"] = g.score_scale; // only in large-score cases, likewise
    if (g.head_dim_v != 0) config["head_dim_v"] = g.head_dim_v;      // only in latent cases, likewise
    if (g.rope_dims != 0) {
        config["rope_dim_begin"] = g.rope_dim_begin;
        config["rope_dims"] = g.rope_dims;
    }
    return {{"config", config}, {"ops", ops}, {"data_seed", c.data_seed}};
}

Case case_from_json(const nlohmann::json& j) {
    Case c;
    const nlohmann::json& g = j.contains("config") ? j["config"] : nlohmann::json();
    if (!g.is_object()) throw std::invalid_argument("case: missing object \"config\"");
    c.cfg.n_layers = need<uint32_t>(g, "n_layers");
    c.cfg.n_q_heads = need<uint32_t>(g, "n_q_heads");
    c.cfg.n_kv_heads = need<uint32_t>(g, "n_kv_heads");
    c.cfg.head_dim = need<uint32_t>(g, "head_dim");
    const std::string dt = need<std::string>(g, "dtype");
    c.cfg.cache_dtype = 99u; // kvc_dtype, by its name
    for (uint32_t d = 0; d <= KVC_DTYPE_Q8_0; ++d)
        if (dt == dtype_name(d)) c.cfg.cache_dtype = d;
    if (c.cfg.cache_dtype == 99u)
        throw std::invalid_argument("case: dtype must be f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8_token or q8_0");
    const std::string rp = need<std::string>(g, "rope");
    c.cfg.rope = rp == "none" ? 0u : rp == "neox" ? 1u : rp == "gptj" ? 2u : 99u; // kvc_rope
    if (c.cfg.rope == 99u) throw std::invalid_argument("case: rope must be none, neox or gptj");
    c.cfg.block_size_hint = need<uint32_t>(g, "block_size_hint");
    c.cfg.max_seqs = need<uint32_t>(g, "max_seqs");
    c.cfg.max_tokens = need<uint32_t>(g, "max_tokens");
    c.cfg.rope_theta = need<float>(g, "rope_theta");
    if (g.contains("scale")) { // optional: files written before scales were drawn use 1/sqrt(head_dim)
        c.cfg.softmax_scale = need<float>(g, "scale");
        if (!std::isfinite(c.cfg.softmax_scale) || !(c.cfg.softmax_scale > 0))
            throw std::invalid_argument("case: scale must be a positive finite number");
    }
    if (c.cfg.n_layers == 0 || c.cfg.n_q_heads == 0 || c.cfg.n_kv_heads == 0 || c.cfg.head_dim == 0 ||
        c.cfg.max_seqs == 0 || c.cfg.n_q_heads % c.cfg.n_kv_heads != 0)
        throw std::invalid_argument("case: impossible config (zero size or n_q_heads not a multiple of n_kv_heads)");
    const auto at_most = [](uint32_t v, uint32_t limit, const char* what) {
        if (v > limit)
            throw std::invalid_argument(std::string("case: ") + what + " " + std::to_string(v) + " exceeds " +
                                        std::to_string(limit));
    };
    at_most(c.cfg.n_layers, 1024, "n_layers");
    at_most(c.cfg.n_q_heads, 4096, "n_q_heads");
    at_most(c.cfg.head_dim, 8192, "head_dim");
    at_most(c.cfg.max_seqs, 4096, "max_seqs");
    at_most(c.cfg.max_tokens, 1u << 20, "max_tokens");
    if (c.cfg.rope != 0 && (c.cfg.head_dim % 2 != 0 || !(c.cfg.rope_theta > 0)))
        throw std::invalid_argument("case: RoPE needs an even head_dim and a positive rope_theta");
    quantization_from_json(g, c.cfg);
    windows_from_json(g, c.cfg);
    latent_from_json(g, c.cfg);
    if (g.contains("score_scale")) { // optional: absent means ordinary scores
        if (!g["score_scale"].is_number())
            throw std::invalid_argument("case: \"score_scale\" must be a number");
        c.cfg.score_scale = need<float>(g, "score_scale");
        // a bound keeps the amplified queries and the scores themselves far inside float32
        if (!(c.cfg.score_scale > 0) || c.cfg.score_scale > 100000)
            throw std::invalid_argument("case: \"score_scale\" is " + g["score_scale"].dump() +
                                        ", not a number > 0 and <= 100000 (omit it for ordinary scores)");
    }
    c.data_seed = need<uint64_t>(j, "data_seed");
    if (!j.contains("ops") || !j["ops"].is_array()) throw std::invalid_argument("case: missing array \"ops\"");
    for (const auto& o : j["ops"]) {
        Op op;
        const std::string k = need<std::string>(o, "op");
        auto check_seq = [&](uint32_t s) {
            if (s >= c.cfg.max_seqs) throw std::invalid_argument("case: sequence id " + std::to_string(s) + " >= max_seqs");
            return s;
        };
        if (k == "append" || k == "append_batch") {
            op.kind = k == "append" ? OpKind::Append : OpKind::AppendBatch;
            for (const auto& a : need<nlohmann::json>(o, "appends")) {
                const uint32_t n_new = need<uint32_t>(a, "n_new");
                if (n_new > c.cfg.max_tokens) throw std::invalid_argument("case: n_new exceeds max_tokens");
                bool extreme = false;
                if (a.contains("extreme")) {
                    if (!a["extreme"].is_boolean())
                        throw std::invalid_argument("case: field \"extreme\" must be true or false");
                    extreme = a["extreme"].get<bool>();
                }
                op.appends.push_back({check_seq(need<uint32_t>(a, "seq")), n_new, extreme});
            }
            if (o.contains("layer_order")) {
                for (const auto& l : need<nlohmann::json>(o, "layer_order"))
                    if (!l.is_number_unsigned() || l.get<uint64_t>() >= c.cfg.n_layers)
                        throw std::invalid_argument("case: layer_order must be a permutation of the layers");
                op.layer_order = need<std::vector<uint32_t>>(o, "layer_order");
            }
            std::vector<uint32_t> sorted = op.layer_order;
            std::sort(sorted.begin(), sorted.end());
            for (size_t i = 0; i < sorted.size(); ++i)
                if (sorted[i] != i || sorted.size() != c.cfg.n_layers)
                    throw std::invalid_argument("case: layer_order must be a permutation of the layers");
        } else if (k == "fork") {
            op.kind = OpKind::Fork;
            op.seq = check_seq(need<uint32_t>(o, "seq"));
            op.child = check_seq(need<uint32_t>(o, "child"));
        } else if (k == "release") {
            op.kind = OpKind::Release;
            op.seq = check_seq(need<uint32_t>(o, "seq"));
        } else {
            throw std::invalid_argument("case: unknown op \"" + k + "\"");
        }
        c.ops.push_back(op);
    }
    check_script(c);
    return c;
}

// "Started" is the ABI's word (abi.h): a sequence in which some layer holds a row. Every op of a script reaches
// every layer, so one length per sequence says it; an append of n_new == 0 starts nothing.
void check_script(const Case& c) {
    const auto lens = lengths_after_ops(c);
    for (size_t i = 0; i < c.ops.size(); ++i) {
        const Op& op = c.ops[i];
        const std::string at = "case: op " + std::to_string(i) + ": ";
        if (op.kind == OpKind::Fork && (lens[i][op.seq] == 0 || lens[i][op.child] != 0 || op.seq == op.child))
            throw std::invalid_argument(at + "fork needs a started parent (it holds a row) and a different child "
                                             "that holds no row");
        if (op.kind == OpKind::Release && lens[i][op.seq] == 0)
            throw std::invalid_argument(at + "release needs a started sequence (one that holds a row)");
        std::vector<bool> seen(c.cfg.max_seqs, false);
        for (const SeqAppend& a : op.appends) {
            if (seen[a.seq]) throw std::invalid_argument(at + "a sequence appears twice in one batch");
            seen[a.seq] = true;
        }
        if (op.kind == OpKind::AppendBatch && op.appends.empty())
            throw std::invalid_argument(at + "an empty batch");
        for (uint32_t len : lens[i + 1])
            if (len > c.cfg.max_tokens) throw std::invalid_argument(at + "a sequence grows past max_tokens");
    }
}

std::string describe(const Case& c) {
    std::ostringstream s;
    const CaseConfig& g = c.cfg;
    s << "config: layers=" << g.n_layers << " q_heads=" << g.n_q_heads << " kv_heads=" << g.n_kv_heads
      << " head_dim=" << g.head_dim << " dtype=" << dtype_name(g.cache_dtype) << " rope=" << rope_name(g.rope)
      << " block_size_hint=" << g.block_size_hint << " scale=" << g.scale() << " rope_theta=" << g.rope_theta
      << " data_seed=" << c.data_seed;
    if (dtype_is_fp8(g.cache_dtype)) {
        s << " kv_scale_mode=" << scale_mode_name(g.kv_scale_mode);
        const auto list = [&](const char* name, const std::vector<float>& v) {
            std::ostringstream e;
            e.precision(9); // every float told apart
            for (size_t i = 0; i < v.size(); ++i) e << (i ? "," : "") << v[i];
            s << " " << name << "=[" << e.str() << "]";
        };
        if (g.kv_scale_mode != KVC_SCALE_NONE) {
            list("k_scales", g.k_scales);
            list("v_scales", g.v_scales);
        }
    }
    if (g.cache_dtype == KVC_DTYPE_INT8_TOKEN) s << " int8_scale_dtype=" << dtype_name(g.int8_scale_dtype);
    if (!g.windows.empty()) {
        s << " windows=[";
        for (size_t i = 0; i < g.windows.size(); ++i) s << (i ? "," : "") << g.windows[i];
        s << "] sinks=" << g.n_sinks << (g.evict ? " evict" : "");
    }
    if (g.score_scale > 0) s << " score_scale=" << g.score_scale;
    if (g.head_dim_v != 0) s << " head_dim_v=" << g.head_dim_v;
    if (g.rope_dims != 0) s << " rope_dims=[" << g.rope_dim_begin << "," << g.rope_dim_begin + g.rope_dims << ")";
    s << "\n";
    const auto lens = lengths_after_ops(c);
    for (size_t i = 0; i < c.ops.size(); ++i) {
        const Op& op = c.ops[i];
        s << "  op " << i << ": " << op_name(op.kind);
        if (op.kind == OpKind::Fork) s << " seq " << op.seq << " -> child " << op.child << " (length " << lens[i][op.seq] << ")";
        if (op.kind == OpKind::Release) s << " seq " << op.seq << " (length " << lens[i][op.seq] << ")";
        for (const SeqAppend& a : op.appends)
            s << " [seq " << a.seq << ": " << a.n_new << (a.extreme ? " extreme (stale-slot trap)" : "") << " new after "
              << lens[i][a.seq] << " cached]";
        if (!op.layer_order.empty()) {
            s << " layers in order";
            for (uint32_t l : op.layer_order) s << " " << l;
        }
        s << "\n";
    }
    return s.str();
}

} // namespace kvc::prop
