// ABI 1.3: a rounding pipeline per cache dtype and call shape (kvc_caps.pipeline_rules; docs/tolerance.md, "A
// pipeline per cache dtype and call shape"). A kernel that switches arithmetic with the dtype or the chunk length is
// graded, call by call, by the pipeline of the path it takes, never by the loosest of them.
#include "kvcheck/abi.hpp"
#include "kvcheck/properties/tolerance.hpp"

#include <cstddef>

namespace kvc::prop {

namespace {

constexpr uint32_t kKnownDtypes = (1u << (KVC_DTYPE_Q8_0 + 1)) - 1u;
constexpr uint32_t kKnownFlags = KVC_PIPELINE_DECLARED | KVC_PIPELINE_NEW_ROWS_UNROUNDED |
                                 KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN | KVC_PIPELINE_Q8_0_RECIP_D_EVEN;
constexpr uint32_t kQ8_0Flags = KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN | KVC_PIPELINE_Q8_0_RECIP_D_EVEN;

bool has_rules_member(const kvc_caps& caps) {
    return caps.struct_size >= offsetof(kvc_caps, pipeline_rules) + sizeof caps.pipeline_rules;
}

// The dtypes a rule covers: its bits, or every dtype for 0.
uint32_t covered(const kvc_pipeline_rule& r) { return r.cache_dtypes ? r.cache_dtypes : kKnownDtypes; }

std::string dtypes_text(uint32_t bits) {
    if (bits == 0) return "every dtype";
    std::string s;
    for (uint32_t d = 0; d < 32; ++d)
        if (bits & (1u << d)) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
    return s;
}

std::string rule_text(const kvc_pipeline_rule& r) {
    std::string s = dtypes_text(r.cache_dtypes);
    if (r.min_new > 1) s += ", n >= " + std::to_string(r.min_new);
    return s;
}

} // namespace

std::vector<kvc_pipeline_rule> pipeline_rules(const kvc_caps& caps) {
    if (!has_rules_member(caps)) return {};
    const uint32_t n = caps.n_pipeline_rules < KVC_MAX_PIPELINE_RULES ? caps.n_pipeline_rules
                                                                      : uint32_t{KVC_MAX_PIPELINE_RULES};
    return std::vector<kvc_pipeline_rule>(caps.pipeline_rules, caps.pipeline_rules + n);
}

bool rule_covers(const kvc_pipeline_rule& r, uint32_t cache_dtype, uint32_t n_new) {
    return cache_dtype < 32 && (covered(r) & (1u << cache_dtype)) && r.min_new <= (n_new > 0 ? n_new : 1u);
}

ChosenPipeline pipeline_for(const kvc_caps& caps, uint32_t cache_dtype, uint32_t n_new) {
    const std::vector<kvc_pipeline_rule> rules = pipeline_rules(caps);
    for (size_t i = 0; i < rules.size(); ++i)
        if (rule_covers(rules[i], cache_dtype, n_new)) return {pipeline_of(rules[i].pipeline), static_cast<int>(i)};
    return {declared_pipeline(caps), -1};
}

std::vector<Pipeline> pipelines_for_dtype(const kvc_caps& caps, uint32_t cache_dtype) {
    std::vector<Pipeline> ps = {declared_pipeline(caps)};
    for (const kvc_pipeline_rule& r : pipeline_rules(caps))
        if (cache_dtype < 32 && (covered(r) & (1u << cache_dtype))) ps.push_back(pipeline_of(r.pipeline));
    return ps;
}

std::string graded_by_name(const kvc_caps& caps, int rule) {
    const std::vector<kvc_pipeline_rule> rules = pipeline_rules(caps);
    if (rule < 0 || static_cast<size_t>(rule) >= rules.size()) return "the default pipeline";
    return "pipeline rule " + std::to_string(rule + 1) + " (" + rule_text(rules[static_cast<size_t>(rule)]) + ")";
}

std::string pipeline_rules_problem(const kvc_caps& caps) {
    if (!has_rules_member(caps) || caps.n_pipeline_rules == 0) return "";
    if (caps.n_pipeline_rules > KVC_MAX_PIPELINE_RULES)
        return "n_pipeline_rules " + std::to_string(caps.n_pipeline_rules) + " is above KVC_MAX_PIPELINE_RULES (" +
               std::to_string(KVC_MAX_PIPELINE_RULES) + ")";
    const uint32_t q8_0_default = declared_pipeline(caps).q8_0_rounding;
    for (uint32_t i = 0; i < caps.n_pipeline_rules; ++i) {
        const kvc_pipeline_rule& r = caps.pipeline_rules[i];
        const kvc_pipeline& p = r.pipeline;
        const std::string which = "pipeline rule " + std::to_string(i + 1);
        if (!(p.flags & KVC_PIPELINE_DECLARED)) return which + ": its pipeline lacks KVC_PIPELINE_DECLARED";
        if (p.flags & ~kKnownFlags) return which + ": unknown pipeline flags " + std::to_string(p.flags & ~kKnownFlags);
        if ((p.flags & kQ8_0Flags) == kQ8_0Flags)
            return which + ": declares both KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN and KVC_PIPELINE_Q8_0_RECIP_D_EVEN";
        if (p.q > KVC_ROUND_Q8_0) return which + ": stage q is " + std::to_string(p.q) + ", not a kvc_round";
        for (uint32_t s : {p.rope, p.scores, p.probs, p.accum, p.output})
            if (s > KVC_ROUND_CACHE)
                return which + ": a stage other than q is " + std::to_string(s) +
                       " (only f32, f16, bf16 and cache round the stages after q)";
        if (r.cache_dtypes & ~caps.dtypes)
            return which + " covers " + dtypes_text(r.cache_dtypes & ~caps.dtypes) +
                   ", a cache dtype the plugin does not declare";
        const uint32_t q8_0 = pipeline_of(p).q8_0_rounding;
        if ((covered(r) & caps.dtypes & (1u << KVC_DTYPE_Q8_0)) && q8_0 != q8_0_default)
            return which + " declares the q8_0 rounding " + q8_0_rounding_name(q8_0) + " but the pipeline declares " +
                   q8_0_rounding_name(q8_0_default) +
                   ": a q8_0 cache's codes are rounded one way whatever the call, so every rule covering q8_0 "
                   "declares the same KVC_PIPELINE_Q8_0_* flags as kvc_caps.pipeline";
    }
    return "";
}

nlohmann::json rules_to_json(const kvc_caps& caps) {
    nlohmann::json a = nlohmann::json::array();
    for (const kvc_pipeline_rule& r : pipeline_rules(caps)) {
        nlohmann::json j;
        if (r.cache_dtypes) {
            std::vector<std::string> ds;
            for (uint32_t d = 0; d < 32; ++d)
                if (r.cache_dtypes & (1u << d)) ds.emplace_back(dtype_name(d));
            j["dtypes"] = ds;
        }
        j["min_new"] = r.min_new;
        j["pipeline"] = to_json(pipeline_of(r.pipeline));
        a.push_back(j);
    }
    return a;
}

} // namespace kvc::prop
