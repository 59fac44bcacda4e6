#include "kvcheck/model/model_shrink.hpp"

#include <algorithm>

namespace kvc::model {
namespace {

// The values below x tried in its place, from lo in steps of `step`: lo, halfway, one step down; biggest reduction
// first, each once.
std::vector<uint32_t> toward(uint32_t x, uint32_t lo, uint32_t step = 1) {
    std::vector<uint32_t> v;
    if (x <= lo) return v;
    for (uint32_t y : {lo, lo + (x - lo) / 2 / step * step, x - step})
        if (y >= lo && y < x && std::find(v.begin(), v.end(), y) == v.end()) v.push_back(y);
    return v;
}

uint32_t length(const std::vector<int>& v) { return static_cast<uint32_t>(v.size()); }

std::vector<int> prefix(const std::vector<int>& v, uint32_t n) {
    return std::vector<int>(v.begin(), v.begin() + std::min<long>(n, static_cast<long>(v.size())));
}

// The chunk sizes of a prompt cut to its first p tokens: the calls that still fit, the last one cut short.
std::vector<int> chunks_for(const std::vector<int>& chunks, uint32_t p) {
    std::vector<int> out;
    int left = static_cast<int>(p);
    for (int n : chunks) {
        if (left == 0) break;
        out.push_back(std::min(n, left));
        left -= out.back();
    }
    return out;
}

// What a property reads of a case's histories (model_properties.cpp). What it does not read goes to its least in one
// candidate: one token of a prompt, no steps, empty tails, the prompt in one call.
struct Reads {
    bool prompt = true; // all of it (MODEL-PROJECTIONS reads its first token only)
    bool prompt2 = false, n_steps = false, chunks = false, tail = false, tail2 = false;
};

Reads reads(const std::string& property, const ModelCase& c) {
    const bool two = c.desc.max_seqs >= 2; // sequence 1 runs prompt2 beside sequence 0
    Reads r;
    if (property == "MODEL-LOGITS") {
        r.prompt2 = two;
        r.n_steps = true;
    } else if (property == "MODEL-KV") {
        r.tail = true;
    } else if (property == "MODEL-CHUNK") {
        r.chunks = r.tail = true;
    } else if (property == "MODEL-FORK") {
        r.tail = r.tail2 = true;
    } else if (property == "MODEL-RELEASE") {
        r.prompt2 = r.tail = r.tail2 = true;
    } else if (property == "MODEL-MEMORY") {
        r.prompt2 = two;
        r.tail = true;
    } else if (property == "MODEL-PROJECTIONS") {
        r.prompt = false;
    } else { // a property this list does not know: nothing is known to be unread
        r = Reads{true, true, true, true, true, true};
    }
    return r;
}

// Every size smaller_than compares, the tokens' sum last (a smaller vocabulary lowers it).
std::vector<uint64_t> sizes(const ModelCase& c) {
    const kvcm_model_desc& d = c.desc;
    uint64_t tokens = 0;
    for (const std::vector<int>* v : {&c.prompt, &c.prompt2, &c.tail, &c.tail2})
        for (int t : *v) tokens += static_cast<uint64_t>(std::max(t, 0));
    return {d.n_layers,      d.n_kv_heads,       d.n_heads,
            d.head_dim,      d.dim,              d.hidden_dim,
            d.vocab_size,    d.max_seqs,         d.max_context,
            c.prompt.size(), c.prompt2.size(),   static_cast<uint64_t>(std::max(c.n_steps, 0)),
            c.tail.size(),   c.tail2.size(),     c.chunks.size(),
            tokens};
}

bool same(const ModelCase& a, const ModelCase& b) {
    const kvcm_model_desc &x = a.desc, &y = b.desc;
    return a.seed == b.seed && a.weights_format == b.weights_format && a.embed_rms == b.embed_rms &&
           x.dim == y.dim && x.hidden_dim == y.hidden_dim && x.n_layers == y.n_layers && x.n_heads == y.n_heads &&
           x.n_kv_heads == y.n_kv_heads && x.head_dim == y.head_dim && x.vocab_size == y.vocab_size &&
           x.rope == y.rope && x.rope_theta == y.rope_theta && x.rms_eps == y.rms_eps && x.tied == y.tied &&
           x.cache_dtype == y.cache_dtype && x.max_context == y.max_context && x.max_seqs == y.max_seqs &&
           a.prompt == b.prompt && a.prompt2 == b.prompt2 && a.n_steps == b.n_steps && a.chunks == b.chunks &&
           a.tail == b.tail && a.tail2 == b.tail2;
}

} // namespace

bool smaller_than(const ModelCase& a, const ModelCase& b) {
    const std::vector<uint64_t> x = sizes(a), y = sizes(b);
    bool below = false;
    for (size_t i = 0; i < x.size(); ++i) {
        if (x[i] > y[i]) return false;
        below = below || x[i] < y[i];
    }
    return below;
}

std::vector<ModelCase> shrink_candidates(const ModelCase& c, const std::string& property, const kvcm_caps& caps) {
    std::vector<ModelCase> out;
    if (!case_error(c).empty()) return out; // the candidates are made from a well-formed case
    const uint32_t p = length(c.prompt);
    const uint32_t least_prompt = property == "MODEL-CHUNK" && p >= 2 ? 2 : 1; // a prompt to split
    const uint32_t least_seqs = property == "MODEL-FORK" ? 2 : 1;               // a parent and a child
    const auto add = [&](const ModelCase& n) {
        if (!case_error(n).empty() || !outside_caps(n, caps).empty() || !smaller_than(n, c)) return;
        if (n.prompt.size() < least_prompt || n.desc.max_seqs < std::min(least_seqs, c.desc.max_seqs)) return;
        if (std::none_of(out.begin(), out.end(), [&](const ModelCase& o) { return same(o, n); })) out.push_back(n);
    };
    const kvcm_model_desc& d = c.desc;

    { // what the property does not read, at its least
        const Reads r = reads(property, c);
        ModelCase n = c;
        if (!r.prompt) n.prompt = prefix(c.prompt, 1);
        if (!r.prompt2) n.prompt2 = prefix(c.prompt2, 1);
        if (!r.n_steps) n.n_steps = 0;
        if (!r.tail) n.tail.clear();
        if (!r.tail2) n.tail2.clear();
        n.chunks = chunks_for(r.chunks ? c.chunks : std::vector<int>{static_cast<int>(p)}, length(n.prompt));
        add(n);
    }
    for (uint32_t l : toward(d.n_layers, 1)) {
        ModelCase n = c;
        n.desc.n_layers = l;
        add(n);
    }
    // heads: n_heads = n_kv_heads * group; d_model follows n_heads * head_dim where it was that
    const bool dim_follows = d.dim == d.n_heads * d.head_dim;
    const uint32_t group = d.n_heads / d.n_kv_heads;
    const auto heads = [&](uint32_t kv, uint32_t g, uint32_t head_dim) {
        ModelCase n = c;
        n.desc.n_kv_heads = kv;
        n.desc.n_heads = kv * g;
        n.desc.head_dim = head_dim;
        if (dim_follows) n.desc.dim = n.desc.n_heads * head_dim;
        add(n);
    };
    heads(1, 1, d.head_dim);
    for (uint32_t kv : toward(d.n_kv_heads, 1)) heads(kv, group, d.head_dim);
    for (uint32_t g : toward(group, 1)) heads(d.n_kv_heads, g, d.head_dim);
    for (uint32_t v : toward(d.vocab_size, std::min<uint32_t>(d.vocab_size, 2))) {
        ModelCase n = c;
        n.desc.vocab_size = v;
        for (std::vector<int>* list : {&n.prompt, &n.prompt2, &n.tail, &n.tail2})
            for (int& t : *list) t %= static_cast<int>(v);
        add(n);
    }
    for (uint32_t h : toward(d.hidden_dim, 1)) {
        ModelCase n = c;
        n.desc.hidden_dim = h;
        add(n);
    }
    const uint32_t hd_step = d.rope == KVC_ROPE_NONE ? 1 : 2; // RoPE turns pairs
    for (uint32_t h : toward(d.head_dim, hd_step, hd_step)) heads(d.n_kv_heads, group, h);
    { // d_model on its own: only where it need not be n_heads * head_dim (FREE_HEAD_DIM; outside_caps says)
        std::vector<uint32_t> dims = toward(d.dim, 1);
        if (d.n_heads * d.head_dim < d.dim) dims.insert(dims.begin(), d.n_heads * d.head_dim);
        for (uint32_t dim : dims) {
            ModelCase n = c;
            n.desc.dim = dim;
            add(n);
        }
    }
    for (uint32_t s : toward(d.max_seqs, least_seqs)) {
        ModelCase n = c;
        n.desc.max_seqs = s;
        add(n);
    }
    // the histories: shorter (the first tokens kept; the prompt also without its first token), fewer steps and calls
    for (uint32_t n_tokens : toward(p, least_prompt)) {
        ModelCase n = c;
        n.prompt = prefix(c.prompt, n_tokens);
        n.chunks = chunks_for(c.chunks, n_tokens);
        add(n);
    }
    if (p > least_prompt) {
        ModelCase n = c;
        n.prompt.erase(n.prompt.begin());
        n.chunks.front() -= 1;
        if (n.chunks.front() == 0) n.chunks.erase(n.chunks.begin());
        add(n);
    }
    for (uint32_t n_tokens : toward(length(c.prompt2), 1)) {
        ModelCase n = c;
        n.prompt2 = prefix(c.prompt2, n_tokens);
        add(n);
    }
    for (uint32_t steps : toward(static_cast<uint32_t>(c.n_steps), 0)) {
        ModelCase n = c;
        n.n_steps = static_cast<int>(steps);
        add(n);
    }
    for (std::vector<int> ModelCase::*list : {&ModelCase::tail, &ModelCase::tail2})
        for (uint32_t n_tokens : toward(length(c.*list), 0)) {
            ModelCase n = c;
            n.*list = prefix(c.*list, n_tokens);
            add(n);
        }
    if (c.chunks.size() > 1) { // fewer calls: the prompt in one, the first two or the last two merged
        ModelCase n = c;
        n.chunks = {static_cast<int>(p)};
        add(n);
        n.chunks = c.chunks;
        n.chunks[1] += n.chunks[0];
        n.chunks.erase(n.chunks.begin());
        add(n);
        n.chunks = c.chunks;
        n.chunks[n.chunks.size() - 2] += n.chunks.back();
        n.chunks.pop_back();
        add(n);
    }
    { // the least max_context the histories fit (case_error's rules), and not below 2: MODEL-FORK feeds one more
        const uint32_t longest = std::max(p, length(c.prompt2));
        const uint32_t need = std::max({longest > 1 ? 2 * longest : 1, p + static_cast<uint32_t>(c.n_steps),
                                        p + length(c.tail), longest + length(c.tail2), std::min(d.max_context, 2u)});
        for (uint32_t ctx : toward(d.max_context, need)) {
            ModelCase n = c;
            n.desc.max_context = ctx;
            add(n);
        }
    }
    return out;
}

PropertyResult shrink_model_failure(const ModelTarget& target, const std::string& property, PropertyResult first,
                                    int max_runs) {
    if (first.verdict != Verdict::Fail || !first.the_case || max_runs <= 0) return first;
    PropertyResult best = first;
    const double clear = std::min(kClearExcess, first.excess);
    int runs = 0, steps = 0;
    for (bool progress = true; progress && runs < max_runs;) {
        progress = false;
        for (const ModelCase& c : shrink_candidates(*best.the_case, property, target.caps())) {
            if (runs >= max_runs) break;
            ++runs;
            PropertyResult r = run_model_case(target, property, c);
            // the same property (run_model_case runs only that one), failed as clearly
            if (r.verdict != Verdict::Fail || !(r.excess >= clear)) continue;
            best = std::move(r);
            ++steps;
            progress = true;
            break;
        }
    }
    best.first_seed = first.first_seed;
    best.case_seed = first.case_seed;
    best.cases_run = first.cases_run;
    best.shrink_steps = steps;
    best.shrink_runs = runs;
    if (steps == 0)
        best.message = first.message + "\nnot shrunk: no smaller case fails " + property + " (" +
                       std::to_string(runs) + " tried)";
    else
        best.message = best.the_case->describe() + "\n" + best.failure + "\nshrunk in " + std::to_string(steps) +
                       " steps (" + std::to_string(runs) + " runs) from case seed " +
                       std::to_string(first.the_case->seed) + "; that seed alone draws the case before shrinking";
    return best;
}

} // namespace kvc::model
