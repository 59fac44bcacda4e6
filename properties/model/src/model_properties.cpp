#include "kvcheck/model/model_properties.hpp"

#include "kvcheck/model/model_oracle.hpp"
#include "kvcheck/model/model_shrink.hpp"
#include "kvcheck/model/weights_io.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>

namespace kvc::model {
namespace {

// A property does not hold: the message is the counterexample. `excess`: how far past the bound the failing value
// lay (|difference| / allowed; a greedy choice: margin / twice the bound); infinite for a failure that compares no
// value with a bound (a count, a refused call).
struct Violation : std::runtime_error {
    // a NaN or an infinity (a NaN logit gives difference / bound = NaN) fails without a bound: as clear as can be
    explicit Violation(const std::string& what, double excess_ = HUGE_VAL)
        : std::runtime_error(what), excess(std::isnan(excess_) ? HUGE_VAL : excess_) {}
    double excess;
};
// The property cannot run on this implementation (a capability it does not declare).
struct Unsupported : std::runtime_error {
    using std::runtime_error::runtime_error;
};

const char* status_text(kvc_status s) {
    switch (s) {
    case KVC_OK: return "KVC_OK";
    case KVC_ERR_INVALID_ARGUMENT: return "KVC_ERR_INVALID_ARGUMENT";
    case KVC_ERR_UNSUPPORTED: return "KVC_ERR_UNSUPPORTED";
    case KVC_ERR_OUT_OF_MEMORY: return "KVC_ERR_OUT_OF_MEMORY";
    default: return "KVC_ERR_INTERNAL";
    }
}

std::string num(double x) {
    std::ostringstream s;
    s.precision(9);
    s << x;
    return s.str();
}

// One case, ready to run: the reference's config, the f32-valued weights and their bytes in the target's format.
struct Ctx {
    const ModelTarget& target;
    ModelCase c;
    ref::ModelConfig cfg;
    ref::Weights<double> w;
    std::string bytes;
    double headroom = 0;

    Ctx(const ModelTarget& t, ModelCase mc) : target(t), c(std::move(mc)) {
        cfg = config_of(c.desc);
        w = draw_weights(cfg, c.seed, c.embed_rms);
        bytes = c.weights_format == KVCM_WEIGHTS_SAFETENSORS ? write_safetensors(cfg, w)
                                                             : write_flat_f32(cfg, w, c.desc.max_context);
    }
    std::unique_ptr<Model> create() const { return std::make_unique<Model>(target, c.desc, c.weights_format, bytes); }
    bool has(uint32_t f) const { return target.has(f); }
};

// One logit row the engine returned: the position of the token it follows, and the call that produced it.
struct Row {
    size_t pos;
    std::vector<float> logits;
    std::string how;
};

// A sequence as the harness drives it: its history and every row the engine returned for it.
struct Feed {
    Model& model;
    uint32_t seq;
    std::vector<int> history;
    std::vector<Row> rows;
};

void feed(Ctx& x, Feed& f, const std::vector<int>& tokens, const std::string& how) {
    const std::vector<float> out = f.model.forward(f.seq, tokens);
    const size_t V = x.c.desc.vocab_size, start = f.history.size();
    f.history.insert(f.history.end(), tokens.begin(), tokens.end());
    if (x.has(KVCM_FEATURE_ALL_LOGITS)) {
        for (size_t i = 0; i < tokens.size(); ++i)
            f.rows.push_back({start + i, std::vector<float>(out.begin() + static_cast<long>(i * V),
                                                            out.begin() + static_cast<long>((i + 1) * V)), how});
    } else {
        f.rows.push_back({start + tokens.size() - 1, out, how});
    }
}

// A prompt in one call when the engine takes prompts, else one token per call.
void feed_prompt(Ctx& x, Feed& f, const std::vector<int>& prompt) {
    if (x.has(KVCM_FEATURE_PROMPT) || prompt.size() == 1) {
        feed(x, f, prompt, "prompt call (" + std::to_string(prompt.size()) + " tokens)");
        return;
    }
    for (size_t i = 0; i < prompt.size(); ++i)
        feed(x, f, {prompt[i]}, "prompt token " + std::to_string(i) + " (one per call)");
}

void feed_singles(Ctx& x, Feed& f, const std::vector<int>& tokens, const std::string& what) {
    for (size_t i = 0; i < tokens.size(); ++i) feed(x, f, {tokens[i]}, what + " " + std::to_string(i));
}

int argmax(const std::vector<float>& v) {
    int best = 0;
    for (int i = 1; i < static_cast<int>(v.size()); ++i)
        if (v[static_cast<size_t>(i)] > v[static_cast<size_t>(best)]) best = i; // first maximum on ties
    return best;
}

// Every row of f against the reference's recompute of f's history; greedy tokens from first_greedy_pos on.
void compare_logits(Ctx& x, const Feed& f, const std::string& label, size_t first_greedy_pos = SIZE_MAX) {
    const Oracle o = compute_oracle(x.cfg, x.w, f.history);
    for (const Row& r : f.rows) {
        const Eigen::Index p = static_cast<Eigen::Index>(r.pos);
        const double a = allowed(o.logits, o.logit_est, p);
        for (size_t i = 0; i < r.logits.size(); ++i) {
            const double e = r.logits[i], ref = o.logits(p, static_cast<Eigen::Index>(i));
            const double diff = std::fabs(e - ref);
            if (!(diff <= a))
                throw Violation(label + ", " + r.how + ": sequence " + std::to_string(f.seq) + ", position " +
                                std::to_string(r.pos) + " (the logits after token " + std::to_string(r.pos) +
                                " of the history), logit index " + std::to_string(i) + ": engine " + num(e) +
                                ", reference " + num(ref) + ", |difference| " + num(diff) + " > allowed " + num(a) +
                                " (naive f32 estimate of the row " + num(o.logit_est[r.pos]) + ")",
                                diff / a);
            x.headroom = std::max(x.headroom, diff / a);
        }
        // greedy: the token the engine chose from this row must be the reference's unless the margin is in the bound
        if (r.pos >= first_greedy_pos && r.pos + 1 < f.history.size()) {
            const int chosen = f.history[r.pos + 1];
            Eigen::Index best = 0;
            o.logits.row(p).maxCoeff(&best);
            const double margin = o.logits(p, best) - o.logits(p, chosen);
            if (best != chosen && margin > 2 * a)
                throw Violation(label + ", greedy step after position " + std::to_string(r.pos) + ": the engine chose " +
                                std::to_string(chosen) + ", the reference " + std::to_string(best) + " by a margin " +
                                num(margin) + " > twice the bound " + num(a),
                                margin / (2 * a));
        }
    }
}

// ---- the properties: each runs one case and throws Violation or Unsupported ----

void logits(Ctx& x) {
    auto m = x.create();
    std::vector<Feed> feeds{{*m, 0, {}, {}}};
    if (x.c.desc.max_seqs >= 2) feeds.push_back({*m, 1, {}, {}});
    feed_prompt(x, feeds[0], x.c.prompt);
    if (feeds.size() > 1) feed_prompt(x, feeds[1], x.c.prompt2);
    for (int step = 0; step < x.c.n_steps; ++step)
        for (Feed& f : feeds) // sequences interleaved step by step
            if (f.history.size() < x.c.desc.max_context)
                feed(x, f, {argmax(f.rows.back().logits)}, "greedy step " + std::to_string(step));
    compare_logits(x, feeds[0], "MODEL-LOGITS", x.c.prompt.size() - 1);
    if (feeds.size() > 1) compare_logits(x, feeds[1], "MODEL-LOGITS", x.c.prompt2.size() - 1);
}

void kv(Ctx& x) {
    auto m = x.create();
    Feed f{*m, 0, {}, {}};
    feed_prompt(x, f, x.c.prompt);
    feed_singles(x, f, x.c.tail, "tail token");
    const uint32_t T = static_cast<uint32_t>(f.history.size());
    const Oracle o = compute_oracle(x.cfg, x.w, f.history);
    std::vector<std::vector<float>> ks(x.c.desc.n_layers), vs(x.c.desc.n_layers);
    for (uint32_t l = 0; l < x.c.desc.n_layers; ++l) m->read_kv(0, l, 0, T, ks[l], vs[l]);
    const Eigen::Index kv_dim = static_cast<Eigen::Index>(x.c.desc.n_kv_heads) * x.c.desc.head_dim;
    // Whether the engine's rows of layer l match the reference's layer other (a diagnosis, not a verdict).
    auto matches = [&](const std::vector<float>& got, const ref::Mat<double>& exact, const std::vector<double>& est) {
        for (Eigen::Index p = 0; p < exact.rows(); ++p) {
            const double a = allowed(exact, est, p);
            for (Eigen::Index i = 0; i < kv_dim; ++i)
                if (!(std::fabs(got[static_cast<size_t>(p * kv_dim + i)] - exact(p, i)) <= a)) return false;
        }
        return true;
    };
    for (uint32_t l = 0; l < x.c.desc.n_layers; ++l)
        for (int which = 0; which < 2; ++which) {
            const std::vector<float>& got = which == 0 ? ks[l] : vs[l];
            const ref::Mat<double>& exact = which == 0 ? o.k[l] : o.v[l];
            const std::vector<double>& est = which == 0 ? o.k_est[l] : o.v_est[l];
            for (Eigen::Index p = 0; p < exact.rows(); ++p) {
                const double a = allowed(exact, est, p);
                for (Eigen::Index i = 0; i < kv_dim; ++i) {
                    const double e = got[static_cast<size_t>(p * kv_dim + i)], ref = exact(p, i);
                    const double diff = std::fabs(e - ref);
                    if (!(diff <= a)) {
                        std::string why;
                        for (uint32_t other = 0; other < x.c.desc.n_layers; ++other)
                            if (other != l && matches(got, which == 0 ? o.k[other] : o.v[other],
                                                      which == 0 ? o.k_est[other] : o.v_est[other]))
                                why = " (the rows match the reference's layer " + std::to_string(other) + ")";
                        throw Violation(std::string("MODEL-KV: layer ") + std::to_string(l) + " cached " +
                                        (which == 0 ? "K" : "V") + " at position " + std::to_string(p) + ", KV head " +
                                        std::to_string(i / x.c.desc.head_dim) + ", dim " +
                                        std::to_string(i % x.c.desc.head_dim) + ": engine " + num(e) + ", reference " +
                                        num(ref) + ", |difference| " + num(diff) + " > allowed " + num(a) + why,
                                        diff / a);
                    }
                    x.headroom = std::max(x.headroom, diff / a);
                }
            }
        }
    if (m->try_read_kv(0, 0, T, 1) == KVC_OK)
        throw Violation("MODEL-KV: read_kv of position " + std::to_string(T) + " (past the " + std::to_string(T) +
                        " tokens held) returned KVC_OK");
}

void chunk(Ctx& x) {
    if (!x.has(KVCM_FEATURE_PROMPT) && !x.has(KVCM_FEATURE_CHUNKED))
        throw Unsupported("the engine takes one token per call (neither PROMPT nor CHUNKED): nothing to split");
    std::vector<std::pair<std::string, std::vector<int>>> splits; // mode name, call sizes
    const int p = static_cast<int>(x.c.prompt.size());
    if (x.has(KVCM_FEATURE_PROMPT)) splits.emplace_back("whole", std::vector<int>{p});
    if (x.has(KVCM_FEATURE_CHUNKED)) {
        std::vector<int> s = x.c.chunks;
        if (!x.has(KVCM_FEATURE_PROMPT) && s[0] > 1) { // the first call onto an empty sequence: one token
            s.insert(s.begin() + 1, s[0] - 1);
            s[0] = 1;
        }
        splits.emplace_back("chunked", s);
    }
    splits.emplace_back("token by token", std::vector<int>(static_cast<size_t>(p), 1));
    for (const auto& [mode, sizes] : splits) {
        auto m = x.create();
        Feed f{*m, 0, {}, {}};
        size_t at = 0;
        for (size_t k = 0; k < sizes.size(); ++k) {
            const std::vector<int> part(x.c.prompt.begin() + static_cast<long>(at),
                                        x.c.prompt.begin() + static_cast<long>(at) + sizes[k]);
            feed(x, f, part, "prompt " + mode + ", call " + std::to_string(k) + " of " + std::to_string(sizes.size()) +
                                 " (" + std::to_string(sizes[k]) + " tokens at position " + std::to_string(at) + ")");
            at += static_cast<size_t>(sizes[k]);
        }
        feed_singles(x, f, x.c.tail, "prompt " + mode + ", then tail token");
        compare_logits(x, f, "MODEL-CHUNK");
    }
}

void fork(Ctx& x) {
    if (!x.has(KVCM_FEATURE_FORK)) throw Unsupported("fork is not declared (KVCM_FEATURE_FORK)");
    if (x.c.desc.max_seqs < 2) throw Unsupported("fork needs two sequences; the engine declares max_seqs 1");
    auto m = x.create();
    Feed parent{*m, 0, {}, {}};
    feed_prompt(x, parent, x.c.prompt);
    m->fork(0, 1);
    Feed child{*m, 1, parent.history, {}};
    const std::vector<int> a = x.c.tail.empty() ? std::vector<int>{x.c.prompt[0]} : x.c.tail;
    const std::vector<int> b = x.c.tail2.empty() ? std::vector<int>{x.c.prompt.back()} : x.c.tail2;
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) { // interleaved: child first, then parent
        if (i < b.size()) feed(x, child, {b[i]}, "child token " + std::to_string(i) + " after the fork");
        if (i < a.size()) feed(x, parent, {a[i]}, "parent token " + std::to_string(i) + " after the fork");
    }
    compare_logits(x, parent, "MODEL-FORK (parent)");
    compare_logits(x, child, "MODEL-FORK (child)");
}

void release(Ctx& x) {
    if (!x.has(KVCM_FEATURE_RELEASE)) throw Unsupported("release is not declared (KVCM_FEATURE_RELEASE)");
    auto m = x.create();
    {
        Feed before{*m, 0, {}, {}};
        feed_prompt(x, before, x.c.prompt);
        feed_singles(x, before, x.c.tail, "tail token");
    }
    m->release(0);
    const kvcm_memory mem = m->memory();
    if (mem.live_bytes != 0)
        throw Violation("MODEL-RELEASE: after releasing the only sequence, memory reports " +
                        std::to_string(mem.live_bytes) + " live bytes (expected 0)");
    if (m->try_release(0) == KVC_OK)
        throw Violation("MODEL-RELEASE: releasing sequence 0 again (it holds no token) returned KVC_OK");
    Feed after{*m, 0, {}, {}};
    feed_prompt(x, after, x.c.prompt2);
    feed_singles(x, after, x.c.tail2, "tail token after the release");
    compare_logits(x, after, "MODEL-RELEASE (the history after the release)");
}

void memory(Ctx& x) {
    auto m = x.create();
    const kvcm_model_desc& d = x.c.desc;
    const uint64_t per_token = 2ull * d.n_layers * d.n_kv_heads * d.head_dim * 4; // f32 cache
    std::vector<Feed> feeds{{*m, 0, {}, {}}};
    if (d.max_seqs >= 2) feeds.push_back({*m, 1, {}, {}});
    auto check = [&](const std::string& after) {
        const kvcm_memory mem = m->memory();
        uint64_t held = 0;
        for (const Feed& f : feeds) held += f.history.size();
        if (mem.bytes_per_token != per_token)
            throw Violation("MODEL-MEMORY after " + after + ": bytes_per_token " + std::to_string(mem.bytes_per_token) +
                            ", expected 2 * " + std::to_string(d.n_layers) + " layers * " +
                            std::to_string(d.n_kv_heads) + " KV heads * " + std::to_string(d.head_dim) +
                            " dims * 4 bytes = " + std::to_string(per_token));
        if (mem.live_bytes != held * per_token)
            throw Violation("MODEL-MEMORY after " + after + ": live_bytes " + std::to_string(mem.live_bytes) +
                            ", expected " + std::to_string(held) + " tokens * " + std::to_string(per_token) + " = " +
                            std::to_string(held * per_token));
        if (mem.reserved_bytes < mem.live_bytes)
            throw Violation("MODEL-MEMORY after " + after + ": reserved_bytes " + std::to_string(mem.reserved_bytes) +
                            " below live_bytes " + std::to_string(mem.live_bytes));
    };
    check("create");
    feed_prompt(x, feeds[0], x.c.prompt);
    check("sequence 0's prompt");
    if (feeds.size() > 1) {
        feed_prompt(x, feeds[1], x.c.prompt2);
        check("sequence 1's prompt");
    }
    for (size_t i = 0; i < x.c.tail.size(); ++i) {
        feed(x, feeds[0], {x.c.tail[i]}, "tail");
        check("tail token " + std::to_string(i));
    }
}

void projections(Ctx& x) {
    if (!x.has(KVCM_FEATURE_KV_PROJECTIONS)) throw Unsupported("kv_projections is not declared");
    const uint32_t limit = x.target.caps().max_context;
    if (limit != 0 && limit < 101) throw Unsupported("the documents' count needs 101 tokens of context");
    ModelCase c = x.c; // the documents' run: a 2-token prompt, 99 greedy steps, every generated token fed
    c.desc.max_context = 101;
    c.desc.max_seqs = 1;
    c.prompt = {x.c.prompt[0], x.c.prompt2[0]};
    Ctx y(x.target, c);
    auto m = y.create();
    const uint64_t at_create = m->kv_projections();
    Feed f{*m, 0, {}, {}};
    feed_prompt(y, f, c.prompt);
    for (int step = 0; step < 99; ++step) feed(y, f, {argmax(f.rows.back().logits)}, "greedy step");
    const uint64_t n = m->kv_projections() - at_create;
    if (at_create != 0 || n != 101) {
        const long recompute = ref::generate<double>(y.cfg, y.w, c.prompt, 99).kv_projections;
        throw Violation("MODEL-PROJECTIONS: a 2-token prompt and 99 greedy steps (101 tokens fed) made the engine "
                        "report " + std::to_string(n) + " K/V projections (" + std::to_string(at_create) +
                        " at create); with a cache each token is projected once: 2 + 99 = 101; the reference's "
                        "full recompute projects " + std::to_string(recompute));
    }
}

const std::map<std::string, std::function<void(Ctx&)>>& table() {
    static const std::map<std::string, std::function<void(Ctx&)>> t = {
        {"MODEL-LOGITS", logits}, {"MODEL-KV", kv},           {"MODEL-CHUNK", chunk},
        {"MODEL-FORK", fork},     {"MODEL-RELEASE", release}, {"MODEL-MEMORY", memory},
        {"MODEL-PROJECTIONS", projections}};
    return t;
}

// A capability the property needs and the caps do not declare, in words; empty when it can run.
std::string missing(const ModelTarget& t, const std::string& id) {
    if (id == "MODEL-KV" && !t.has(KVCM_FEATURE_READ_KV)) return "the cache cannot be read back (no KVCM_FEATURE_READ_KV)";
    if (id == "MODEL-FORK" && !t.has(KVCM_FEATURE_FORK)) return "fork is not declared (KVCM_FEATURE_FORK)";
    if (id == "MODEL-FORK" && t.caps().max_seqs == 1) return "fork needs two sequences; max_seqs is 1";
    if (id == "MODEL-RELEASE" && !t.has(KVCM_FEATURE_RELEASE)) return "release is not declared (KVCM_FEATURE_RELEASE)";
    if (id == "MODEL-CHUNK" && !t.has(KVCM_FEATURE_PROMPT) && !t.has(KVCM_FEATURE_CHUNKED))
        return "one token per call (neither KVCM_FEATURE_PROMPT nor KVCM_FEATURE_CHUNKED): nothing to split";
    if (id == "MODEL-PROJECTIONS" && !t.has(KVCM_FEATURE_KV_PROJECTIONS))
        return "the engine does not count its projections (no KVCM_FEATURE_KV_PROJECTIONS)";
    return "";
}

} // namespace

const std::vector<std::string>& model_property_ids() {
    static const std::vector<std::string> ids = {"MODEL-LOGITS",  "MODEL-KV",     "MODEL-CHUNK",      "MODEL-FORK",
                                                 "MODEL-RELEASE", "MODEL-MEMORY", "MODEL-PROJECTIONS"};
    return ids;
}

std::string model_property_summary(const std::string& id) {
    static const std::map<std::string, std::string> summaries = {
        {"MODEL-LOGITS", "every logit of every step equals the reference's full recompute within the bound; greedy "
                         "tokens agree where the margin exceeds it"},
        {"MODEL-KV", "layer l's cached K (RoPE applied) and V equal the reference's layer-l K and V [read_kv]"},
        {"MODEL-CHUNK", "the prompt whole, in chunks or token by token gives the same logits [prompt or chunked]"},
        {"MODEL-FORK", "parent and child continue from the shared prefix, each equal to its own history [fork]"},
        {"MODEL-RELEASE", "a released sequence restarts at position 0 with nothing of its past [release]"},
        {"MODEL-MEMORY", "bytes per token = 2*L*H_kv*d_h*4; live bytes = tokens held * bytes per token"},
        {"MODEL-PROJECTIONS", "a 2-token prompt and 99 greedy steps project 101 tokens' K/V, not 5,049 "
                              "[kv_projections]"}};
    const auto it = summaries.find(id);
    return it == summaries.end() ? std::string() : it->second;
}

PropertyResult run_model_case(const ModelTarget& target, const std::string& id, const ModelCase& c) {
    PropertyResult r;
    r.id = id;
    r.first_seed = c.seed;
    const auto it = table().find(id);
    if (it == table().end()) {
        r.verdict = Verdict::Error;
        r.message = "unknown model property \"" + id + "\"";
        return r;
    }
    std::string why = missing(target, id);
    if (const std::string outside = outside_caps(c, target.caps()); why.empty() && !outside.empty())
        why = "the case lies outside what the engine declares: " + outside;
    if (!why.empty()) {
        r.verdict = Verdict::NotSupported;
        r.message = why;
        return r;
    }
    try {
        Ctx x(target, c);
        it->second(x);
        r.worst_headroom = x.headroom;
        r.cases_run = 1;
        r.message = "1 case, headroom " + num(x.headroom);
        return r;
    } catch (const Violation& e) {
        r.verdict = Verdict::Fail;
        r.failure = e.what();
        r.excess = e.excess;
    } catch (const LentViolation& e) { // a write outside a lent buffer: the property that made the call fails
        r.verdict = Verdict::Fail;
        r.failure = id + ": " + e.what();
        r.excess = HUGE_VAL;
    } catch (const Unsupported& e) {
        r.verdict = Verdict::NotSupported;
        r.message = e.what();
        return r;
    } catch (const CallError& e) {
        r.verdict = Verdict::Error; // a declared capability refused, or a call failing inside the caps
        r.failure = id + ": " + e.what() + " (" + status_text(e.status()) + ")";
        r.out_of_memory = e.status() == KVC_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        r.out_of_memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
        r.verdict = Verdict::Error;
        r.failure = id + ": harness error: " + e.what();
    }
    r.case_seed = c.seed;
    r.the_case = c;
    r.message = c.describe() + "\n" + r.failure;
    return r;
}

PropertyResult run_model_property(const ModelTarget& target, const std::string& id, uint64_t seed, int n_cases,
                                  int max_shrink_runs) {
    PropertyResult r;
    r.id = id;
    r.first_seed = seed;
    for (int k = 0; k < n_cases; ++k) {
        const uint64_t case_seed = seed + static_cast<uint64_t>(k);
        PropertyResult one = run_model_case(target, id, draw_case(case_seed, target.caps()));
        if (one.verdict == Verdict::Pass) {
            r.worst_headroom = std::max(r.worst_headroom, one.worst_headroom);
            ++r.cases_run;
            continue;
        }
        one.first_seed = seed;
        one.cases_run = r.cases_run;
        if (one.the_case) one.message += "\nreplay: seed " + std::to_string(case_seed) + ", 1 case";
        if (one.verdict == Verdict::Fail && max_shrink_runs > 0)
            return shrink_model_failure(target, id, std::move(one), max_shrink_runs);
        return one;
    }
    r.message = std::to_string(r.cases_run) + " cases from seed " + std::to_string(seed) + ", worst headroom " +
                num(r.worst_headroom);
    return r;
}

std::vector<PropertyResult> run_model_properties(const ModelTarget& target, uint64_t seed, int n_cases) {
    std::vector<PropertyResult> out;
    for (const std::string& id : model_property_ids()) out.push_back(run_model_property(target, id, seed, n_cases));
    return out;
}

} // namespace kvc::model
