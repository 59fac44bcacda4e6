#include "kvcheck/vectors/caps.hpp"

#include "kvcheck/abi.hpp"

#include <limits>
#include <sstream>
#include <stdexcept>

namespace kvc::vec {

namespace {

using nlohmann::json;

struct CapWord {
    const char* word;
    uint32_t kvc_caps::*field;
    uint32_t bits;
};

const CapWord kWords[] = {
    {"dtype f32", &kvc_caps::dtypes, 1u << KVC_DTYPE_F32},
    {"dtype f16", &kvc_caps::dtypes, 1u << KVC_DTYPE_F16},
    {"dtype bf16", &kvc_caps::dtypes, 1u << KVC_DTYPE_BF16},
    {"dtype fp8_e4m3", &kvc_caps::dtypes, 1u << KVC_DTYPE_FP8_E4M3},
    {"dtype fp8_e5m2", &kvc_caps::dtypes, 1u << KVC_DTYPE_FP8_E5M2},
    {"dtype int8_token", &kvc_caps::dtypes, 1u << KVC_DTYPE_INT8_TOKEN},
    {"dtype q8_0", &kvc_caps::dtypes, 1u << KVC_DTYPE_Q8_0},
    // the scale forms beyond an fp8 dtype's unscaled codes and int8's f32 scales, named as a case's "requires"
    // names them (prop::missing_caps)
    {"fp8 scale per tensor", &kvc_caps::quant, KVC_QUANT_FP8_SCALE_TENSOR},
    {"fp8 scale per kv head", &kvc_caps::quant, KVC_QUANT_FP8_SCALE_KV_HEAD},
    {"int8 scale in f16", &kvc_caps::quant, KVC_QUANT_INT8_SCALE_F16},
    {"rope neox", &kvc_caps::rope_variants, 1u << KVC_ROPE_NEOX},
    {"rope gptj", &kvc_caps::rope_variants, 1u << KVC_ROPE_GPTJ},
    {"gqa", &kvc_caps::features, KVC_FEATURE_GQA},
    {"paged", &kvc_caps::features, KVC_FEATURE_PAGED},
    {"fork", &kvc_caps::features, KVC_FEATURE_FORK},
    {"release", &kvc_caps::features, KVC_FEATURE_RELEASE},
    {"batch", &kvc_caps::features, KVC_FEATURE_BATCH},
    {"chunked", &kvc_caps::features, KVC_FEATURE_CHUNKED},
    // ABI 1.2 shapes, named as `kvcheck list` and the pipe protocol name them (docs/windowed-caches.md)
    {"window", &kvc_caps::features, KVC_FEATURE_WINDOW},
    {"sinks", &kvc_caps::features, KVC_FEATURE_SINKS},
    {"head_dim_v", &kvc_caps::features, KVC_FEATURE_HEAD_DIM_V},
    {"rope_range", &kvc_caps::features, KVC_FEATURE_ROPE_RANGE},
};

// An evicting cache cannot be graded from files yet: a dump has no way to say which rows were dropped, so grade
// could neither tell a dropped row from a missing one nor check the rows it still holds. Refused by name rather
// than as an unknown word, so that the message says where such a cache can be judged.
constexpr const char* kEvictWord = "evict";

struct Limit {
    const char* key;
    uint32_t kvc_caps::*field;
};

const Limit kLimits[] = {
    {"max_layers", &kvc_caps::max_layers},     {"max_q_heads", &kvc_caps::max_q_heads},
    {"max_kv_heads", &kvc_caps::max_kv_heads}, {"max_head_dim", &kvc_caps::max_head_dim},
    {"max_seqs", &kvc_caps::max_seqs},         {"max_tokens", &kvc_caps::max_tokens},
    {"head_dim_multiple", &kvc_caps::head_dim_multiple},
    {"head_dim_multiple_rope", &kvc_caps::head_dim_multiple_rope},
    {"max_window", &kvc_caps::max_window},
    {"max_sinks", &kvc_caps::max_sinks},
    {"max_head_dim_v", &kvc_caps::max_head_dim_v},
};

// The ABI 1.2 limits: echoed in a manifest's "declared" only when set, so that every other export's manifest is
// what it always was.
bool abi_1_2_limit(const Limit& x) {
    return x.field == &kvc_caps::max_window || x.field == &kvc_caps::max_sinks || x.field == &kvc_caps::max_head_dim_v;
}

// The fields a declaration may hold: its own, free text, and a results manifest's (which serves as a caps file).
const char* const kFields[] = {"capabilities",    "limits",         "fixed",   "pipeline", "pipeline_rules",
                               "precision",       "about",          "kvcheck_results", "implementation",
                               "version"};

// The parameters an implementation hard-codes, in the words of the JSON report's "fixed": every case is drawn with
// them (docs/conformance.md, "Fixed parameters").
constexpr const char* kFixedScaleWord = "1/sqrt(head_dim)";

void read_fixed(const json& f, kvc_caps& caps) {
    if (!f.is_object()) throw std::invalid_argument("field \"fixed\" is not an object");
    for (auto it = f.begin(); it != f.end(); ++it) {
        if (it->is_null()) continue;
        if (it.key() == "rope_theta") {
            const double t = it->is_number() ? it->get<double>() : 0;
            if (!(t > 0 && t <= static_cast<double>(std::numeric_limits<float>::max())))
                throw std::invalid_argument("\"fixed\": \"rope_theta\" must be a finite number > 0 (within float32) "
                                            "or null, not " + it->dump());
            caps.fixed_rope_theta = static_cast<float>(t);
        } else if (it.key() == "softmax_scale") {
            if (!it->is_string() || it->get<std::string>() != kFixedScaleWord)
                throw std::invalid_argument(std::string("\"fixed\": \"softmax_scale\" must be \"") + kFixedScaleWord +
                                            "\" or null, not " + it->dump());
            caps.fixed_scale = KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM;
        } else {
            throw std::invalid_argument("\"fixed\": unknown parameter \"" + it.key() +
                                        "\" (known: rope_theta, softmax_scale)");
        }
    }
}

// ABI 1.3's pipeline rules: [{"dtypes": ["f16"], "min_new": 64, "pipeline": {...}}] ("dtypes" absent = every
// dtype, "min_new" absent = 0), checked as a plugin's table is when it is loaded.
void read_pipeline_rules(const json& a, kvc_caps& caps) {
    if (!a.is_array()) throw std::invalid_argument("field \"pipeline_rules\" is not an array");
    if (a.size() > KVC_MAX_PIPELINE_RULES)
        throw std::invalid_argument("\"pipeline_rules\": " + std::to_string(a.size()) + " rules, at most " +
                                    std::to_string(KVC_MAX_PIPELINE_RULES));
    caps.n_pipeline_rules = static_cast<uint32_t>(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
        const json& r = a[i];
        const std::string where = "\"pipeline_rules\"[" + std::to_string(i) + "]";
        if (!r.is_object()) throw std::invalid_argument(where + " is not an object");
        for (auto it = r.begin(); it != r.end(); ++it)
            if (it.key() != "dtypes" && it.key() != "min_new" && it.key() != "pipeline")
                throw std::invalid_argument(where + ": unknown field \"" + it.key() +
                                            "\" (a rule holds: dtypes, min_new, pipeline)");
        kvc_pipeline_rule& rule = caps.pipeline_rules[i];
        if (r.contains("dtypes")) {
            if (!r["dtypes"].is_array() || r["dtypes"].empty())
                throw std::invalid_argument(where + ": \"dtypes\" must be a non-empty array of dtype names");
            for (const json& w : r["dtypes"]) {
                uint32_t d = 0;
                while (d <= KVC_DTYPE_Q8_0 && !(w.is_string() && w.get<std::string>() == dtype_name(d))) ++d;
                if (d > KVC_DTYPE_Q8_0) throw std::invalid_argument(where + ": unknown dtype " + w.dump());
                rule.cache_dtypes |= 1u << d;
            }
        }
        if (r.contains("min_new")) {
            if (!r["min_new"].is_number_unsigned() || r["min_new"].get<uint64_t>() > 0xffffffffu)
                throw std::invalid_argument(where + ": \"min_new\" must be a non-negative integer");
            rule.min_new = r["min_new"].get<uint32_t>();
        }
        if (!r.contains("pipeline")) throw std::invalid_argument(where + ": missing field \"pipeline\"");
        rule.pipeline = prop::to_abi(prop::pipeline_from_json(r["pipeline"]));
    }
    if (const std::string why = prop::pipeline_rules_problem(caps); !why.empty())
        throw std::invalid_argument("\"pipeline_rules\": " + why);
}

} // namespace

Declared declared_from_json(const json& j, bool need_pipeline) {
    if (!j.is_object()) throw std::invalid_argument("not a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) {
        bool known = false;
        for (const char* f : kFields) known = known || it.key() == f;
        if (known) continue;
        std::string list;
        for (const char* f : kFields) list += std::string(list.empty() ? "" : ", ") + f;
        throw std::invalid_argument("unknown field \"" + it.key() + "\" (a declaration holds: " + list + ")");
    }
    Declared d;
    d.caps.struct_size = sizeof d.caps;
    if (!j.contains("capabilities")) throw std::invalid_argument("missing field \"capabilities\"");
    const json& words = j["capabilities"];
    if (!words.is_array()) throw std::invalid_argument("field \"capabilities\" is not an array of words");
    for (const json& w : words) {
        if (w.is_string() && w.get<std::string>() == kEvictWord)
            throw std::invalid_argument(
                "\"capabilities\": \"evict\" is not supported on the vectors route: a dump cannot say which rows "
                "the cache dropped, so grade could not judge them. Declare \"window\" (and \"sinks\") without "
                "eviction here, or judge an evicting cache through `kvcheck validate --plugin` or `--connect` "
                "(docs/windowed-caches.md)");
        bool known = false;
        for (const CapWord& cw : kWords)
            if (w.is_string() && w.get<std::string>() == cw.word) {
                d.caps.*cw.field |= cw.bits;
                known = true;
            }
        if (!known) {
            std::string list;
            for (const CapWord& cw : kWords) list += std::string(list.empty() ? "" : ", ") + cw.word;
            throw std::invalid_argument("\"capabilities\": unknown word " + w.dump() + " (known: " + list + ")");
        }
    }
    if (j.contains("limits")) {
        const json& l = j["limits"];
        if (!l.is_object()) throw std::invalid_argument("field \"limits\" is not an object");
        for (auto it = l.begin(); it != l.end(); ++it) {
            const Limit* found = nullptr;
            for (const Limit& x : kLimits)
                if (it.key() == x.key) found = &x;
            if (!found) throw std::invalid_argument("\"limits\": unknown limit \"" + it.key() + "\"");
            if (it->is_null()) continue;
            if (!it->is_number_unsigned() || it->get<uint64_t>() > 0xffffffffu)
                throw std::invalid_argument("\"limits\": \"" + it.key() + "\" must be a non-negative integer or null");
            d.caps.*(found->field) = it->get<uint32_t>();
        }
    }
    if (j.contains("fixed")) read_fixed(j["fixed"], d.caps);
    const bool has_p = j.contains("pipeline"), has_prec = j.contains("precision");
    if (has_p && has_prec)
        throw std::invalid_argument("give the pipeline once: \"pipeline\" or the older \"precision\", not both");
    if (has_p) {
        d.pipeline = prop::pipeline_from_json(j["pipeline"]); // throws invalid_argument with the problem
        d.has_pipeline = true;
        // a q quantized to q8_0 blocks needs head_dim in whole blocks of 32: cases are drawn, and judged supported,
        // with the pipeline in the caps as a plugin declares it (prop::head_dim_multiple)
        d.caps.pipeline = prop::to_abi(d.pipeline);
    } else if (has_prec) {
        const json& w = j["precision"];
        const std::string s = w.is_string() ? w.get<std::string>() : "";
        if (s == "f32") d.pipeline = prop::pipeline_preset(KVC_PRECISION_F32);
        else if (s == "q-and-v-accum-in-cache-dtype" || s == "q_and_v_accum_in_cache_dtype")
            d.pipeline = prop::pipeline_preset(KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE);
        else
            throw std::invalid_argument("\"precision\" must be \"f32\" or \"q-and-v-accum-in-cache-dtype\", not " +
                                        w.dump());
        d.has_pipeline = true;
    } else if (need_pipeline) {
        throw std::invalid_argument("missing field \"pipeline\" (or the older \"precision\")");
    }
    if (j.contains("pipeline_rules")) read_pipeline_rules(j["pipeline_rules"], d.caps);
    d.pipeline_text = prop::pipeline_name(d.pipeline);
    for (size_t i = 0; i < prop::pipeline_rules(d.caps).size(); ++i)
        d.pipeline_text += "; " + prop::graded_by_name(d.caps, static_cast<int>(i)) + ": " +
                           prop::pipeline_name(prop::pipeline_of(d.caps.pipeline_rules[i].pipeline));
    return d;
}

std::vector<std::string> capability_words(const kvc_caps& caps) {
    std::vector<std::string> w;
    for (const CapWord& cw : kWords)
        if (caps.*cw.field & cw.bits) w.emplace_back(cw.word);
    return w;
}

std::vector<std::string> narrower_declaration(const Declared& a, const std::string& a_name, const Declared& b,
                                              const std::string& b_name) {
    std::vector<std::string> why;
    for (const CapWord& cw : kWords)
        if ((a.caps.*cw.field & cw.bits) && !(b.caps.*cw.field & cw.bits))
            why.push_back("\"" + std::string(cw.word) + "\": declared by " + a_name + ", not by " + b_name);
    const auto text = [](uint32_t x) { return x ? std::to_string(x) : std::string("none"); };
    const auto differ = [&](const char* key, uint32_t x, uint32_t y) {
        why.push_back(std::string(key) + ": " + text(x) + " in " + a_name + ", " + text(y) + " in " + b_name);
    };
    for (const Limit& x : kLimits) {
        const uint32_t la = a.caps.*x.field, lb = b.caps.*x.field;
        if (std::string(x.key).rfind("max_", 0) == 0 && lb != 0 && (la == 0 || la > lb)) differ(x.key, la, lb);
    }
    // a value b hard-codes must be the one every case of a was drawn with
    if (b.caps.fixed_rope_theta > 0 && a.caps.fixed_rope_theta != b.caps.fixed_rope_theta) {
        std::ostringstream m;
        m << "fixed rope_theta: ";
        if (a.caps.fixed_rope_theta > 0) m << a.caps.fixed_rope_theta;
        else m << "none";
        m << " in " << a_name << ", " << b.caps.fixed_rope_theta << " in " << b_name;
        why.push_back(m.str());
    }
    if (b.caps.fixed_scale == KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM && a.caps.fixed_scale != b.caps.fixed_scale)
        why.push_back(std::string("fixed softmax_scale: none in ") + a_name + ", " + kFixedScaleWord + " in " + b_name);
    // head_dim multiples: every head_dim a's multiple allows must be one of b's (0 and 1: any head_dim)
    const auto multiple = [](const kvc_caps& c, bool rope) {
        return rope && c.head_dim_multiple_rope > 0 ? c.head_dim_multiple_rope : c.head_dim_multiple;
    };
    for (bool rope : {false, true}) {
        const uint32_t ma = multiple(a.caps, rope), mb = multiple(b.caps, rope);
        if (mb > 1 && (ma == 0 || ma % mb != 0))
            differ(rope ? "head_dim_multiple_rope" : "head_dim_multiple", ma, mb);
    }
    return why;
}

bool same_pipeline(const Declared& a, const Declared& b) {
    if (a.has_pipeline != b.has_pipeline) return false;
    if (prop::rules_to_json(a.caps) != prop::rules_to_json(b.caps)) return false; // ABI 1.3 rules, in order
    return !a.has_pipeline || prop::to_json(a.pipeline) == prop::to_json(b.pipeline);
}

json declared_to_json(const Declared& d) {
    json limits = json::object();
    for (const Limit& x : kLimits)
        if (!abi_1_2_limit(x) || d.caps.*x.field)
            limits[x.key] = d.caps.*x.field ? json(d.caps.*x.field) : json(nullptr);
    json j = {{"capabilities", capability_words(d.caps)}, {"limits", limits}};
    // (only when something is fixed: every other manifest stays as it was)
    if (d.caps.fixed_rope_theta > 0 || d.caps.fixed_scale == KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM)
        j["fixed"] = {{"rope_theta", d.caps.fixed_rope_theta > 0 ? json(d.caps.fixed_rope_theta) : json(nullptr)},
                      {"softmax_scale", d.caps.fixed_scale ? json(kFixedScaleWord) : json(nullptr)}};
    if (d.has_pipeline) j["pipeline"] = prop::to_json(d.pipeline);
    if (!prop::pipeline_rules(d.caps).empty()) j["pipeline_rules"] = prop::rules_to_json(d.caps); // only when given
    return j;
}

std::vector<std::string> unsupported(const prop::Case& c, const kvc_caps& caps) {
    std::vector<std::string> why = prop::missing_caps(prop::required_caps(c), caps);
    const bool rope = c.cfg.rope != KVC_ROPE_NONE;
    const uint32_t mult = rope && caps.head_dim_multiple_rope > 0 ? caps.head_dim_multiple_rope : caps.head_dim_multiple;
    if (mult > 1 && c.cfg.head_dim % mult != 0)
        why.push_back("head_dim " + std::to_string(c.cfg.head_dim) + " not a multiple of " + std::to_string(mult) +
                      (rope ? " (rope)" : ""));
    return why;
}

} // namespace kvc::vec
