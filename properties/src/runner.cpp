#include "kvcheck/properties/runner.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/tolerance.hpp"
#include "kvcheck/reference/splitmix64.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>

namespace kvc::prop {

const char* verdict_name(Verdict v) {
    switch (v) {
    case Verdict::Pass: return "PASS";
    case Verdict::Fail: return "FAIL";
    case Verdict::NotSupported: return "NOT_SUPPORTED";
    case Verdict::QualityWarning: return "QUALITY_WARNING";
    case Verdict::Error: return "ERROR";
    case Verdict::Crash: return "CRASH";
    case Verdict::Timeout: return "TIMEOUT";
    }
    return "ERROR";
}

std::optional<Verdict> verdict_from_name(const std::string& s) {
    for (Verdict v : {Verdict::Pass, Verdict::Fail, Verdict::NotSupported, Verdict::QualityWarning, Verdict::Error,
                      Verdict::Crash, Verdict::Timeout})
        if (s == verdict_name(v)) return v;
    return std::nullopt;
}

std::string case_id(const std::string& property, int index) { return property + "/" + std::to_string(index); }

uint64_t case_seed(uint64_t run_seed, const std::string& property, int index) {
    uint64_t h = run_seed ^ 0x6b76636865636bull; // FNV-1a over the property id, mixed with the run seed and index
    for (unsigned char ch : property) h = (h ^ ch) * 0x100000001b3ull;
    h ^= static_cast<uint64_t>(index) * kSplitMix64Gamma; // spreads consecutive indices over the whole word
    h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

namespace {

int size_for(const RunSettings& s, int index) { // ramp 0..100 like rc::check
    return s.cases <= 1 ? 50 : static_cast<int>(static_cast<long>(index % s.cases) * 100 / (s.cases - 1));
}

rc::Shrinkable<Case> shrinkable_case(const Property& p, const RunSettings& s, int index, const kvc_caps* limits) {
    kvc_caps allow = full_caps();
    if (limits) {
        // Dtypes and RoPE variants are drawn among the declared ones from the start, not drawn from all and then
        // filtered to NOT_SUPPORTED: an implementation that declares f32, f16 and bf16 and both RoPE variants (and
        // any quantized dtypes) draws, seed for seed, the cases it always drew (the lists the generator picks from
        // are the same, in the same order); a 1.0/1.1 plugin never declares a quantized dtype (target.cpp).
        uint32_t known = 0;
        for (uint32_t d = KVC_DTYPE_F32; d <= KVC_DTYPE_Q8_0; ++d) known |= 1u << d;
        if (limits->dtypes & known) allow.dtypes = limits->dtypes & known; // none declared: f32/f16/bf16, refused
        allow.rope_variants = limits->rope_variants & ((1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ));
        allow.pipeline = limits->pipeline; // a q8_0 query (KVC_ROUND_Q8_0) draws head_dim in whole blocks of 32
        allow.precision = limits->precision; // a 16-bit precision class forms 16-bit scores: no large-score regime
        // every pipeline rule's chunk-length edges are drawn, and its 16-bit scores rule out the large-score regime
        allow.n_pipeline_rules = limits->n_pipeline_rules;
        std::copy(std::begin(limits->pipeline_rules), std::end(limits->pipeline_rules), std::begin(allow.pipeline_rules));
        allow.quant = limits->quant;
        allow.max_layers = limits->max_layers;
        allow.max_q_heads = limits->max_q_heads;
        allow.max_kv_heads = limits->max_kv_heads;
        allow.max_head_dim = limits->max_head_dim;
        allow.max_seqs = limits->max_seqs;
        allow.max_tokens = limits->max_tokens;
        allow.head_dim_multiple = limits->head_dim_multiple; // granularity: a shape limit, drawn inside
        allow.head_dim_multiple_rope = limits->head_dim_multiple_rope;
        // windows, sinks and eviction likewise: drawn only where declared, so that nothing else changes
        allow.features |= limits->features & (KVC_FEATURE_WINDOW | KVC_FEATURE_SINKS | KVC_FEATURE_EVICT);
        allow.max_window = limits->max_window;
        // latent (head_dim_v) and partial-rotary shapes likewise (generators.cpp draws them last)
        allow.features |= limits->features & (KVC_FEATURE_HEAD_DIM_V | KVC_FEATURE_ROPE_RANGE);
        allow.max_head_dim_v = limits->max_head_dim_v;
        allow.max_sinks = limits->max_sinks;
        allow.fixed_rope_theta = limits->fixed_rope_theta; // what it hard-codes: every case is drawn with it
        allow.fixed_scale = limits->fixed_scale;
        // FORK and RELEASE combine the two operations only where both are declared: a cache with one of them is
        // judged on it, not given cases that are NOT_SUPPORTED for the other
        if (p.feature == KVC_FEATURE_FORK || p.feature == KVC_FEATURE_RELEASE)
            allow.features &= ~((KVC_FEATURE_FORK | KVC_FEATURE_RELEASE) & ~limits->features);
    }
    return p.gen(allow)(rc::Random(case_seed(s.seed, p.id, index)), size_for(s, index));
}

} // namespace

Case generate_case(const Property& p, const RunSettings& s, int index, const kvc_caps* limits) {
    return shrinkable_case(p, s, index, limits).value();
}

std::optional<CaseResult> outside_declaration(const kvc_caps& caps, const Property& p, const Case& c) {
    const auto missing = missing_caps(required_caps(c), caps);
    if (missing.empty() && (!p.feature || (caps.features & p.feature))) return std::nullopt;
    CaseResult r;
    r.property = p.id;
    r.counterexample = c;
    r.verdict = Verdict::NotSupported;
    r.outside_declaration = true;
    std::ostringstream m;
    m << "needs";
    for (const auto& x : missing) m << " " << x;
    if (missing.empty()) m << " the feature this property is about";
    r.reason = m.str();
    return r;
}

CaseResult evaluate_case(const Target& t, const Property& p, const Case& c) {
    if (std::optional<CaseResult> outside = outside_declaration(t.caps, p, c)) return std::move(*outside);
    CaseResult r;
    r.property = p.id;
    r.counterexample = c;
    try {
        Case declared = c; // the q8_0 rounding the implementation declares decides the codes its cache must hold
        declared.cfg.q8_0_rounding = declared_pipeline(t.caps).q8_0_rounding;
        const Outcome o = p.check(t, declared);
        r.headroom = o.headroom;
        r.notes = o.notes;
        r.quant_loss = o.quant_loss;
        r.graded_by = o.graded_by;
        if (!o.not_run.empty()) { // a part of the property could not run (properties.hpp): never a PASS
            r.verdict = Verdict::NotSupported;
            r.reason = o.not_run;
            return r;
        }
        if (o.fails_f32_class)
            r.notes.push_back("passes its declared precision pipeline but would fail the f32 class");
        const std::vector<Pipeline> graders = pipelines_for_dtype(t.caps, c.cfg.cache_dtype);
        if (c.cfg.cache_dtype != KVC_DTYPE_F32 &&
            std::any_of(graders.begin(), graders.end(), [](const Pipeline& g) { return g.new_rows_unrounded; }))
            r.notes.push_back("declares new rows attended before rounding to the cache dtype: its outputs depend on "
                              "how a prompt is split into calls");
        if (o.headroom > kQualityWarningHeadroom) {
            r.verdict = Verdict::QualityWarning;
            std::ostringstream m;
            m << "passes, but the worst error uses " << o.headroom * 100 << "% of the allowed bound";
            r.reason = m.str();
        }
    } catch (const Violation& v) {
        r.verdict = Verdict::Fail;
        r.failed_property = v.property();
        r.reason = v.what();
        r.mismatch = v.mismatch();
        if (!v.mismatch().graded_by.empty()) r.graded_by = {v.mismatch().graded_by}; // the failing call's grader
    } catch (const AbiError& e) {
        // Only declared capabilities are exercised, so a refusal is an error, never a skip.
        r.verdict = Verdict::Error;
        r.reason = std::string("a call within the declared capabilities failed: ") + e.what();
        r.out_of_memory = e.status() == KVC_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        r.out_of_memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
        r.verdict = Verdict::Error;
        r.reason = std::string("harness error: ") + e.what();
    }
    return r;
}

CaseResult run_case(const Target& t, const Property& p, const RunSettings& s, int index) {
    CaseResult first = evaluate_case(t, p, generate_case(p, s, index, &t.caps));
    first.id = case_id(p.id, index);
    first.seed = case_seed(s.seed, p.id, index);
    return shrink_case(t, p, s, index, std::move(first));
}

CaseResult shrink_case(const Target& t, const Property& p, const RunSettings& s, int index, CaseResult first) {
    CaseResult best = std::move(first);
    if (best.verdict != Verdict::Fail || s.max_shrink_runs <= 0) return best;
    rc::Shrinkable<Case> current = shrinkable_case(p, s, index, &t.caps);
    // Greedy descent: take the first shrink that still fails the same property, then shrink that.
    int runs = 0;
    bool progress = true;
    while (progress && runs < s.max_shrink_runs) {
        progress = false;
        auto shrinks = current.shrinks();
        while (auto candidate = shrinks.next()) {
            if (++runs > s.max_shrink_runs) break;
            CaseResult r = evaluate_case(t, p, candidate->value());
            if (r.verdict == Verdict::Fail && r.failed_property == best.failed_property) {
                r.id = best.id;
                r.seed = best.seed;
                r.shrink_steps = best.shrink_steps + 1;
                best = std::move(r);
                current = std::move(*candidate);
                progress = true;
                break;
            }
        }
    }
    return best;
}

nlohmann::json json_number(double x) {
    if (std::isnan(x)) return "NaN";
    if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
    return x;
}

double number_from_json(const nlohmann::json& j) {
    if (j.is_number()) return j.get<double>();
    if (j.is_string()) {
        const std::string& s = j.get_ref<const std::string&>();
        if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
        if (s == "Infinity") return std::numeric_limits<double>::infinity();
        if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    }
    throw std::invalid_argument("expected a number, \"NaN\", \"Infinity\" or \"-Infinity\", not " + j.dump());
}

namespace {

double number_or(const nlohmann::json& object, const char* key, double fallback) {
    if (!object.contains(key)) return fallback;
    try {
        return number_from_json(object[key]);
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("\"") + key + "\": " + e.what());
    }
}

// An integer field of at most `hi` (a coordinate: -1 = does not apply): checked before it is narrowed, so a huge
// number, a fraction or a float such as 2.2e57 is an error naming the field, never a wrapped value or undefined
// behaviour (a double -> int conversion out of range is UB; fuzzing found it: tests/fuzz/corpus/replay/).
int64_t integer_or(const nlohmann::json& object, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
    if (!object.contains(key)) return fallback;
    const nlohmann::json& v = object[key];
    const bool in_range = v.is_number_unsigned()  ? v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                          : v.is_number_integer() ? v.get<int64_t>() >= lo && v.get<int64_t>() <= hi
                                                  : false;
    if (!in_range)
        throw std::invalid_argument(std::string("\"") + key + "\": expected an integer from " + std::to_string(lo) +
                                    " to " + std::to_string(hi) + ", not " + v.dump());
    return v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
}

int coordinate_or(const nlohmann::json& object, const char* key) {
    return static_cast<int>(integer_or(object, key, -1, -1, std::numeric_limits<int>::max()));
}

} // namespace

std::string mismatch_text(const Mismatch& m) {
    std::string text = m.describe();
    const std::size_t tail = text.rfind(": expected ");
    if (tail == std::string::npos || (std::isfinite(m.expected) && std::isfinite(m.actual))) return text;
    const auto number = [](double x) {
        if (std::isfinite(x)) {
            std::ostringstream s;
            s.precision(9);
            s << x;
            return s.str();
        }
        return json_number(x).get<std::string>();
    };
    return text.substr(0, tail) + ": expected " + number(m.expected) + ", got " + number(m.actual);
}

nlohmann::json to_json(const Mismatch& m) {
    return {{"what", m.what},   {"op", m.op},     {"seq", m.seq},
            {"layer", m.layer}, {"pos", m.pos},   {"head", m.head},
            {"dim", m.dim},     {"expected", json_number(m.expected)}, {"actual", json_number(m.actual)},
            {"text", mismatch_text(m)}};
}

// Read as strictly as to_json() writes: every field present, `what` a name of printable ASCII (it is shown on the
// terminal; the check names are ours), `text` a string. A replay file is hand-editable, and the same reader takes a
// case process's result, so a loose field here would be a wrong first mismatch printed as if recorded.
Mismatch mismatch_from_json(const nlohmann::json& m) {
    try {
        if (!m.is_object()) throw std::invalid_argument("not an object");
        for (const char* key : {"what", "op", "seq", "layer", "pos", "head", "dim", "expected", "actual"})
            if (!m.contains(key)) throw std::invalid_argument(std::string("missing field \"") + key + "\"");
        Mismatch mm;
        if (!m["what"].is_string()) throw std::invalid_argument("\"what\": expected a string, not " + m["what"].dump());
        mm.what = m["what"].get<std::string>();
        const bool named = !mm.what.empty() && mm.what.size() <= 200 &&
                           std::all_of(mm.what.begin(), mm.what.end(), [](char ch) { return ch >= 0x20 && ch < 0x7f; });
        if (!named)
            throw std::invalid_argument("\"what\": expected 1 to 200 printable ASCII characters, not " +
                                        m["what"].dump());
        if (m.contains("text") && !m["text"].is_string())
            throw std::invalid_argument("\"text\": expected a string, not " + m["text"].dump());
        mm.op = coordinate_or(m, "op");
        mm.seq = coordinate_or(m, "seq");
        mm.layer = coordinate_or(m, "layer");
        mm.pos = coordinate_or(m, "pos");
        mm.head = coordinate_or(m, "head");
        mm.dim = coordinate_or(m, "dim");
        mm.expected = number_or(m, "expected", 0.0);
        mm.actual = number_or(m, "actual", 0.0);
        return mm;
    } catch (const nlohmann::json::exception& e) {
        throw std::invalid_argument(std::string("mismatch: ") + e.what());
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("mismatch: ") + e.what());
    }
}

nlohmann::json to_json(const CaseResult& r) {
    nlohmann::json j = {{"id", r.id},
                        {"property", r.property},
                        {"verdict", verdict_name(r.verdict)},
                        {"reason", r.reason},
                        {"headroom", json_number(r.headroom)},
                        {"seed", r.seed},
                        {"shrink_steps", r.shrink_steps},
                        {"notes", r.notes}};
    if (!r.failed_property.empty()) j["failed_property"] = r.failed_property;
    if (r.mismatch) j["mismatch"] = to_json(*r.mismatch);
    if (r.out_of_memory) j["out_of_memory"] = true;
    if (r.outside_declaration) j["outside_declaration"] = true;
    if (!r.model_case.is_null()) j["model_case"] = r.model_case;
    if (r.quant_loss >= 0) j["quantization_loss"] = json_number(r.quant_loss); // absent: not a quantized case
    if (!r.graded_by.empty()) j["graded_by"] = r.graded_by; // absent: no pipeline rules declared
    if (r.verdict == Verdict::Fail) {
        j["counterexample"] = to_json(r.counterexample);
        j["counterexample_text"] = describe(r.counterexample);
    }
    return j;
}

CaseResult case_result_from_json(const nlohmann::json& j) {
    try {
        CaseResult r;
        r.id = j.at("id").get<std::string>();
        r.property = j.at("property").get<std::string>();
        const auto v = verdict_from_name(j.at("verdict").get<std::string>());
        if (!v) throw std::invalid_argument("case result: unknown verdict");
        r.verdict = *v;
        r.reason = j.value("reason", "");
        r.headroom = number_or(j, "headroom", 0.0);
        if (j.contains("seed") && !j["seed"].is_number_unsigned())
            throw std::invalid_argument("\"seed\": expected an integer from 0 to 2^64-1, not " + j["seed"].dump());
        r.seed = j.value("seed", uint64_t{0});
        r.shrink_steps = static_cast<int>(integer_or(j, "shrink_steps", 0, 0, std::numeric_limits<int>::max()));
        r.notes = j.value("notes", std::vector<std::string>{});
        r.failed_property = j.value("failed_property", "");
        if (j.contains("mismatch")) r.mismatch = mismatch_from_json(j["mismatch"]);
        r.out_of_memory = j.value("out_of_memory", false);
        r.outside_declaration = j.value("outside_declaration", false);
        if (r.outside_declaration && r.verdict != Verdict::NotSupported)
            throw std::invalid_argument("case result: a case outside the declaration has no verdict but NOT_SUPPORTED");
        if (j.contains("model_case") && !j["model_case"].is_object())
            throw std::invalid_argument("\"model_case\" is not an object");
        if (j.contains("model_case")) r.model_case = j["model_case"];
        r.quant_loss = j.contains("quantization_loss") ? number_or(j, "quantization_loss", -1.0) : -1.0;
        r.graded_by = j.value("graded_by", std::vector<std::string>{});
        if (j.contains("counterexample")) r.counterexample = case_from_json(j["counterexample"]);
        return r;
    } catch (const nlohmann::json::exception& e) {
        throw std::invalid_argument(std::string("case result: ") + e.what());
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("case result: ") + e.what());
    }
}

nlohmann::json replay_document(const CaseResult& r) {
    nlohmann::json j = {{"kvcheck_replay", 1},
                        {"id", r.id},
                        {"property", r.property},
                        {"seed", r.seed},
                        {"expected_failure", r.reason},
                        {"case", to_json(r.counterexample)},
                        {"case_text", describe(r.counterexample)}};
    if (r.mismatch) j["expected_mismatch"] = to_json(*r.mismatch);
    return j;
}

} // namespace kvc::prop
