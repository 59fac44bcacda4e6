#include "kvcheck/properties/tolerance.hpp"

#include "kvcheck/abi.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace kvc::prop {

// ---- pipelines ----------------------------------------------------------------------------------------------------

bool Pipeline::operator==(const Pipeline& o) const {
    return q == o.q && rope == o.rope && scores == o.scores && probs == o.probs && accum == o.accum &&
           output == o.output && new_rows_unrounded == o.new_rows_unrounded && q8_0_rounding == o.q8_0_rounding;
}

Pipeline pipeline_preset(uint32_t precision) {
    Pipeline p;
    if (precision == KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE) p.q = p.accum = KVC_ROUND_CACHE;
    return p;
}

Pipeline declared_pipeline(const kvc_caps& caps) {
    const bool has = caps.struct_size >= offsetof(kvc_caps, pipeline) + sizeof(kvc_pipeline) &&
                     (caps.pipeline.flags & KVC_PIPELINE_DECLARED);
    return has ? pipeline_of(caps.pipeline) : pipeline_preset(caps.precision);
}

Pipeline pipeline_of(const kvc_pipeline& a) {
    const auto ok = [](uint32_t r) { return r <= KVC_ROUND_CACHE ? r : uint32_t{KVC_ROUND_F32}; };
    Pipeline p;
    p.q = a.q <= KVC_ROUND_Q8_0 ? a.q : uint32_t{KVC_ROUND_F32}; // q alone may be quantized (fp8, q8_0: ABI 1.2)
    p.rope = ok(a.rope);
    p.scores = ok(a.scores);
    p.probs = ok(a.probs);
    p.accum = ok(a.accum);
    p.output = ok(a.output);
    p.new_rows_unrounded = (a.flags & KVC_PIPELINE_NEW_ROWS_UNROUNDED) != 0;
    // both flags at once are refused when the plugin is loaded (target.cpp); here the x86 one would win
    if (a.flags & KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN) p.q8_0_rounding = KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN;
    else if (a.flags & KVC_PIPELINE_Q8_0_RECIP_D_EVEN) p.q8_0_rounding = KVC_PIPELINE_Q8_0_RECIP_D_EVEN;
    return p;
}

kvc_pipeline to_abi(const Pipeline& p) {
    kvc_pipeline a{};
    a.q = p.q;
    a.rope = p.rope;
    a.scores = p.scores;
    a.probs = p.probs;
    a.accum = p.accum;
    a.output = p.output;
    a.flags = KVC_PIPELINE_DECLARED | (p.new_rows_unrounded ? KVC_PIPELINE_NEW_ROWS_UNROUNDED : 0u) | p.q8_0_rounding;
    return a;
}

const char* round_name(uint32_t r) {
    switch (r) {
    case KVC_ROUND_F32: return "f32";
    case KVC_ROUND_F16: return "f16";
    case KVC_ROUND_BF16: return "bf16";
    case KVC_ROUND_CACHE: return "cache";
    case KVC_ROUND_FP8_E4M3: return "fp8_e4m3";
    case KVC_ROUND_FP8_E5M2: return "fp8_e5m2";
    case KVC_ROUND_Q8_0: return "q8_0";
    }
    return "unknown";
}

const char* q8_0_rounding_name(uint32_t flag) {
    switch (flag) {
    case 0: return "ref";
    case KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN: return "x86";
    case KVC_PIPELINE_Q8_0_RECIP_D_EVEN: return "neon";
    }
    return "unknown";
}

namespace {

uint32_t round_from_name(const std::string& s, bool q_stage) {
    for (uint32_t r = 0; r <= (q_stage ? KVC_ROUND_Q8_0 : KVC_ROUND_CACHE); ++r)
        if (s == round_name(r)) return r;
    throw std::invalid_argument("pipeline: stage dtype \"" + s + "\" is not one of f32, f16, bf16, cache" +
                                (q_stage ? ", fp8_e4m3, fp8_e5m2, q8_0" : " (fp8 and q8_0 only for q)"));
}

// The dtype a stage rounds to for a given cache dtype. A quantized cache's own dtype is f32 here: its values are
// dequantized to f32 before any arithmetic. An fp8 or q8_0 q is rounded exactly by the oracle (output_grade.cpp),
// so the bound adds nothing for it either.
uint32_t resolve(uint32_t r, uint32_t cache_dtype) {
    switch (r) {
    case KVC_ROUND_F16: return KVC_DTYPE_F16;
    case KVC_ROUND_BF16: return KVC_DTYPE_BF16;
    case KVC_ROUND_CACHE: return dtype_is_quantized(cache_dtype) ? uint32_t{KVC_DTYPE_F32} : cache_dtype;
    default: return KVC_DTYPE_F32;
    }
}

// Unit roundoff of a dtype: half an ulp at 1.
double unit_roundoff(uint32_t dtype) {
    return dtype == KVC_DTYPE_F16 ? 0x1p-11 : dtype == KVC_DTYPE_BF16 ? 0x1p-8 : 0x1p-24;
}
double u_of(uint32_t r, uint32_t cache_dtype) { return unit_roundoff(resolve(r, cache_dtype)); }

constexpr const char* kPresetQAccum = "q-and-v-accum-in-cache-dtype";

} // namespace

std::string pipeline_name(const Pipeline& p) {
    std::string base;
    Pipeline plain = p;
    plain.new_rows_unrounded = false;
    plain.q8_0_rounding = 0;
    if (plain == pipeline_preset(KVC_PRECISION_F32)) base = "f32";
    else if (plain == pipeline_preset(KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE)) base = kPresetQAccum;
    else
        base = std::string("q=") + round_name(p.q) + " rope=" + round_name(p.rope) + " scores=" +
               round_name(p.scores) + " probs=" + round_name(p.probs) + " accum=" + round_name(p.accum) +
               " out=" + round_name(p.output);
    if (p.q8_0_rounding) base += std::string(" q8_0-rounding=") + q8_0_rounding_name(p.q8_0_rounding);
    return p.new_rows_unrounded ? base + " new-rows-unrounded" : base;
}

bool pipeline_is_f32(const Pipeline& p, uint32_t cache_dtype) {
    for (uint32_t r : {p.q, p.rope, p.scores, p.probs, p.accum, p.output})
        if (resolve(r, cache_dtype) != KVC_DTYPE_F32) return false;
    return true;
}

nlohmann::json to_json(const Pipeline& p) {
    nlohmann::json j = {{"q", round_name(p.q)},         {"rope", round_name(p.rope)},     {"scores", round_name(p.scores)},
            {"probs", round_name(p.probs)}, {"accum", round_name(p.accum)},   {"output", round_name(p.output)},
            {"new_rows_unrounded", p.new_rows_unrounded}};
    if (p.q8_0_rounding) j["q8_0_rounding"] = q8_0_rounding_name(p.q8_0_rounding);
    return j;
}

Pipeline pipeline_from_json(const nlohmann::json& j) {
    if (j.is_string()) {
        const std::string s = j.get<std::string>();
        if (s == "f32") return pipeline_preset(KVC_PRECISION_F32);
        if (s == kPresetQAccum) return pipeline_preset(KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE);
        throw std::invalid_argument("pipeline: unknown preset \"" + s + "\" (f32 or " + kPresetQAccum + ")");
    }
    if (!j.is_object()) throw std::invalid_argument("pipeline: expected a preset name or an object of stages");
    Pipeline p;
    const auto stage = [&](const char* key, uint32_t& out) {
        if (!j.contains(key)) return; // an absent stage is f32
        if (!j[key].is_string()) throw std::invalid_argument(std::string("pipeline: \"") + key + "\" must be a string");
        out = round_from_name(j[key].get<std::string>(), std::string(key) == "q");
    };
    stage("q", p.q);
    stage("rope", p.rope);
    stage("scores", p.scores);
    stage("probs", p.probs);
    stage("accum", p.accum);
    stage("output", p.output);
    for (auto it = j.begin(); it != j.end(); ++it)
        if (it.key() != "q" && it.key() != "rope" && it.key() != "scores" && it.key() != "probs" &&
            it.key() != "accum" && it.key() != "output" && it.key() != "new_rows_unrounded" &&
            it.key() != "q8_0_rounding")
            throw std::invalid_argument("pipeline: unknown stage \"" + it.key() + "\"");
    if (j.contains("new_rows_unrounded")) {
        if (!j["new_rows_unrounded"].is_boolean())
            throw std::invalid_argument("pipeline: \"new_rows_unrounded\" must be true or false");
        p.new_rows_unrounded = j["new_rows_unrounded"].get<bool>();
    }
    if (j.contains("q8_0_rounding")) {
        const nlohmann::json& r = j["q8_0_rounding"];
        if (r == "ref") p.q8_0_rounding = 0;
        else if (r == "x86") p.q8_0_rounding = KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN;
        else if (r == "neon") p.q8_0_rounding = KVC_PIPELINE_Q8_0_RECIP_D_EVEN;
        else
            throw std::invalid_argument("pipeline: \"q8_0_rounding\" must be \"ref\" (ggml's quantize_row_q8_0_ref), "
                                        "\"x86\" (x * 127/amax, ties to even) or \"neon\" (x * 1/d, ties to even)");
    }
    return p;
}

double tolerance_floor(const Pipeline& p, uint32_t cache_dtype) {
    double u = 0x1p-24;
    for (uint32_t r : {p.q, p.rope, p.scores, p.probs, p.accum, p.output}) u = std::max(u, u_of(r, cache_dtype));
    return u == 0x1p-24 ? 1e-5 : u;
}

// ---- the bound ----------------------------------------------------------------------------------------------------

namespace {

// Confidence multiplier of the probabilistic sum bounds: for N independent rounding errors |e_k| <= b, Hoeffding
// gives P(|sum e_k| > lambda * b * sqrt(N)) <= 2 exp(-lambda^2 / 2) = 3e-8 at lambda = 6, per element.
constexpr double kLambda = 6.0;
constexpr double kSafety = 2.2;

// Absolute bound on output element o of a pipeline (tolerance.hpp, docs/tolerance.md).
double element_bound(const CaseConfig& cfg, const Pipeline& p, const Expected& e, size_t o, uint32_t n) {
    const uint32_t dt = cfg.cache_dtype, d = cfg.head_dim;
    const double u32 = 0x1p-24;
    const double u_q = p.q == KVC_ROUND_F32 || p.q == KVC_ROUND_FP8_E4M3 || p.q == KVC_ROUND_FP8_E5M2 ||
                               p.q == KVC_ROUND_Q8_0
                           ? 0.0
                           : u_of(p.q, dt);
    const double u_r = u_of(p.rope, dt), u_s = u_of(p.scores, dt), u_p = u_of(p.probs, dt);
    const double u_a = u_of(p.accum, dt), u_o = u_of(p.output, dt);
    const bool rope = cfg.rope != KVC_ROPE_NONE;
    const double out = std::fabs(static_cast<double>(e.oracle[o]));
    // first order in the score perturbation of each row: sum_j w_j * ds_j * |v_j - out| (worst case, no averaging)
    // q rounded before anything else: a rotated element's rounding reaches both of its pair (s_rope), an element
    // outside a RoPE range only itself (bounded by s_qk, which counts every element)
    const bool whole_head_rotated = rope && cfg.rope_len() == d;
    double b = u_q * (!rope ? e.s_qk[o] : whole_head_rotated ? e.s_rope[o] : e.s_rope[o] + e.s_qk[o]);
    if (rope) b += 4.0 * u_r * e.s_rope[o] + e.s_angle[o];          // rotation: tables, products, f32 angles
    b += std::min<double>(d, kLambda * std::sqrt(static_cast<double>(d))) * u32 * e.s_qk[o]; // f32 dot products
    b += 2.0 * u_s * e.s_score[o];                                   // score rounded, max subtracted
    b += 4.0 * u32 * e.s_diff[o];                                    // exp evaluated in f32
    // probabilities rounded: sum_j w_j * eps_j * |v_j|
    b += 2.0 * u_p * e.s_abs[o];
    // the V accumulator: n additions and up to n rescales (online softmax) or split merges, each rounding a
    // partial sum of at most 2 * s_part (oracle.hpp), independently: Hoeffding over 2n roundings
    b += kLambda * std::sqrt(2.0 * n) * u_a * 2.0 * e.s_part[o];
    // the denominator sum_j p_j in f32 (positive terms, partial sums at most the total: a 16-bit denominator
    // stagnates after 2^mantissa terms, which no kernel seen does), the final division and output rounding
    b += kLambda * std::sqrt(static_cast<double>(n)) * u32 * out;
    // the division and the output rounding act on the computed value, which is off by up to b already
    b += (u32 + u_o) * (out + b);
    // Each term above is a bound a correct kernel can come close to (the first-order ones are worst cases): the
    // factor 2 keeps every correct kernel below half its bound, the QUALITY_WARNING line, and 10 % more covers the
    // second-order effects the model leaves out (the curvature of exp, products of two roundings).
    return kSafety * b;
}

struct Scan {
    double headroom = 0, error = 0, allowed = 0;
    // sum over the outputs of (error / allowed)^2: how much error there is in all, each element in units of its own
    // bound (what a hypothesis about the cause must explain, not only the worst element)
    double squared = 0;
    bool bad = false; // a NaN or an infinity
    Worst worst;
};

Scan scan(const CaseConfig& cfg, const Pipeline& p, const float* actual, const Expected& e) {
    Scan r;
    const uint32_t d = cfg.dv(), Hq = cfg.n_q_heads; // output rows have head_dim_v dims
    const double floor = tolerance_floor(p, cfg.cache_dtype);
    for (uint32_t i = 0; i < e.n_new; ++i)
        for (uint32_t h = 0; h < Hq; ++h) {
            const double vs = e.v_scale[static_cast<size_t>(i) * Hq + h];
            for (uint32_t x = 0; x < d; ++x) {
                const size_t o = (static_cast<size_t>(i) * Hq + h) * d + x;
                const double want = static_cast<double>(e.oracle[o]);
                if (!std::isfinite(actual[o])) {
                    if (!r.bad) r.worst = {i, h, x, want, actual[o]};
                    r.bad = true;
                    r.headroom = std::numeric_limits<double>::infinity();
                    continue;
                }
                if (r.bad) continue;
                const double err = std::fabs(actual[o] - want) / vs;
                const double allowed = std::max(element_bound(cfg, p, e, o, e.visible[i]) / vs, floor);
                r.squared += (err / allowed) * (err / allowed);
                if (err / allowed > r.headroom) {
                    r.headroom = err / allowed;
                    r.error = err;
                    r.allowed = allowed;
                    r.worst = {i, h, x, want, actual[o]};
                }
            }
        }
    return r;
}

// Narrower pipelines a failing implementation's error may come from, most specific first (for the diagnosis).
std::vector<std::pair<Pipeline, std::string>> candidates(uint32_t cache_dtype) {
    const std::string dt = dtype_name(cache_dtype);
    std::vector<std::pair<Pipeline, std::string>> c;
    Pipeline q_only;
    q_only.q = KVC_ROUND_CACHE;
    c.push_back({q_only, "q rounded to " + dt});
    Pipeline probs_only; // what FlashAttention's 16-bit kernels do before the P.V product
    probs_only.probs = KVC_ROUND_CACHE;
    c.push_back({probs_only, "the probabilities rounded to " + dt + " before they weight V"});
    c.push_back({pipeline_preset(KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE),
                 "q rounded to " + dt + " and V accumulated in " + dt});
    Pipeline all16;
    all16.q = all16.rope = all16.scores = all16.probs = all16.accum = all16.output = KVC_ROUND_CACHE;
    c.push_back({all16, "every stage (q, RoPE, scores, probabilities, accumulator, output) rounded to " + dt});
    return c;
}

} // namespace

std::vector<double> allowed_errors(const CaseConfig& cfg, const Pipeline& p, const Expected& e) {
    const uint32_t d = cfg.dv(), Hq = cfg.n_q_heads; // output rows have head_dim_v dims
    const double floor = tolerance_floor(p, cfg.cache_dtype);
    std::vector<double> a(e.oracle.size());
    for (uint32_t i = 0; i < e.n_new; ++i)
        for (uint32_t h = 0; h < Hq; ++h) {
            const double vs = e.v_scale[static_cast<size_t>(i) * Hq + h];
            for (uint32_t x = 0; x < d; ++x) {
                const size_t o = (static_cast<size_t>(i) * Hq + h) * d + x;
                a[o] = std::max(element_bound(cfg, p, e, o, e.visible[i]) / vs, floor);
            }
        }
    return a;
}

double headroom_under(const CaseConfig& cfg, const Pipeline& p, const float* actual, const Expected& e) {
    return scan(cfg, p, actual, e).headroom;
}

Grade grade_outputs(const CaseConfig& cfg, const Pipeline& declared, const float* actual, const Expected& e,
                    const Expected* unrounded_new_rows, bool name_pipelines) {
    const Scan mine = scan(cfg, declared, actual, e);
    Grade g;
    g.nan = mine.bad;
    g.error = mine.error;
    g.allowed = mine.allowed;
    g.headroom = mine.headroom;
    g.worst = mine.worst;
    g.pass = !mine.bad && mine.headroom <= 1.0;
    const bool wide = pipeline_is_f32(declared, cfg.cache_dtype);
    if (g.pass && !wide) g.fails_f32_class = scan(cfg, pipeline_preset(KVC_PRECISION_F32), actual, e).headroom > 1.0;
    if (g.pass) return g;
    std::ostringstream m;
    m.precision(6);
    if (mine.bad) {
        m << (std::isnan(g.worst.actual) ? "NaN" : "an infinity") << " in the output (token " << g.worst.token
          << ", head " << g.worst.head << ", dim " << g.worst.dim << ")";
        g.message = m.str();
        return g;
    }
    m << "error " << g.error << " (relative to max|v|) exceeds the bound " << g.allowed << " of pipeline "
      << pipeline_name(declared) << " at token " << g.worst.token << ", head " << g.worst.head << ", dim "
      << g.worst.dim << ": expected " << g.worst.expected << ", got " << g.worst.actual;
    // Name a likely cause only when it explains the error: the same pipeline over new rows attended before their
    // rounding, or a narrower pipeline whose bound the error fits while using a fair share of it. The first
    // hypothesis moves the expected outputs, so fitting the bound is not enough: an error of another cause that
    // lies just above the bound can fall under it by chance. It must also account for most of the error in all
    // (the squared errors, each in units of its bound, at least halved).
    const auto explains = [&](const Scan& under) {
        return !under.bad && under.headroom <= 1.0 && under.squared <= 0.5 * mine.squared;
    };
    if (unrounded_new_rows && !declared.new_rows_unrounded && cfg.cache_dtype != KVC_DTYPE_F32 &&
        explains(scan(cfg, declared, actual, *unrounded_new_rows))) {
        if (dtype_is_quantized(cfg.cache_dtype))
            m << "; the chunk's new rows were attended before quantization to " << dtype_name(cfg.cache_dtype)
              << " (the cache stores them quantized, so outputs depend on how a prompt is chunked); declare "
              << "KVC_PIPELINE_NEW_ROWS_UNROUNDED if that is intended";
        else
            m << "; the outputs are consistent with the new rows attended before rounding to the cache dtype "
              << dtype_name(cfg.cache_dtype) << " (the cache stores them rounded, so outputs depend on how a prompt "
              << "is chunked); declare KVC_PIPELINE_NEW_ROWS_UNROUNDED if that is intended";
    } else if (name_pipelines && wide && cfg.cache_dtype != KVC_DTYPE_F32 && !dtype_is_quantized(cfg.cache_dtype)) {
        // every narrower pipeline whose bound the error fits while using a fair share of it (16-bit stages are
        // hard to tell apart from one another by outputs alone, so all that fit are named), the one whose bound the
        // error fills most first: the narrowest explanation
        std::vector<std::pair<double, std::string>> fitting;
        for (const auto& [cand, words] : candidates(cfg.cache_dtype)) {
            const double h = scan(cfg, cand, actual, e).headroom;
            if (h <= 1.0 && h >= 0.02) fitting.emplace_back(h, words);
        }
        std::stable_sort(fitting.begin(), fitting.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        std::string fits;
        for (const auto& f : fitting) fits += (fits.empty() ? "" : "; or ") + f.second;
        if (!fits.empty())
            m << "; the error is consistent with " << fits << ", while the implementation declares the f32 pipeline";
    }
    g.message = m.str();
    return g;
}

} // namespace kvc::prop
