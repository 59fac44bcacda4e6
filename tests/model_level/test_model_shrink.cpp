// Shrinking model-level counterexamples (properties/model/src/model_shrink.cpp): every candidate of a case is a
// well-formed case inside the engine's caps and strictly smaller, checked here by rules written out again rather than
// through case_error; a broken engine's failure shrinks to a smaller case that still fails the same property (and that
// a correct engine passes); a correct engine is never shrunk; the JSON form of a case round-trips, and a malformed
// one is a clear error.
#include "kvcheck/model/model_case.hpp"
#include "kvcheck/model/model_properties.hpp"
#include "kvcheck/model/model_shrink.hpp"
#include "model_engine_abi.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <numeric>
#include <set>
#include <string>

extern "C" {
const kvcm_model_api* kvcm_model_example_entry(uint32_t, uint32_t);
const kvcm_model_api* kvcm_double_layer_cache_entry(uint32_t, uint32_t);
const kvcm_model_api* kvcm_double_rope_reset_entry(uint32_t, uint32_t);
const kvcm_model_api* kvcm_double_tied_mixup_entry(uint32_t, uint32_t);
const kvcm_model_api* kvcm_double_wrong_eps_entry(uint32_t, uint32_t);
}

namespace {

using namespace kvc::model;

constexpr uint64_t kSeed = 20261130; // test_model_level.cpp's: the doubles' first failures are known there

kvcm_caps caps_of(kvcm_entry_fn entry) { return ModelTarget::from_entry(entry).caps(); }

// Small limits, every feature, both formats: the candidates must respect limits that bite.
kvcm_caps tight_free() {
    kvcm_caps c{};
    c.struct_size = sizeof c;
    c.features = KVCM_FEATURE_PROMPT | KVCM_FEATURE_CHUNKED | KVCM_FEATURE_FORK | KVCM_FEATURE_RELEASE |
                 KVCM_FEATURE_READ_KV | KVCM_FEATURE_TIED | KVCM_FEATURE_UNTIED | KVCM_FEATURE_FREE_HEAD_DIM;
    c.weight_formats = (1u << KVCM_WEIGHTS_SAFETENSORS) | (1u << KVCM_WEIGHTS_FLAT_F32);
    c.cache_dtypes = 1u << KVC_DTYPE_F32;
    c.rope_variants = (1u << KVC_ROPE_NONE) | (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.max_context = 12;
    c.max_seqs = 2;
    c.max_layers = 2;
    c.max_heads = 6;
    c.max_kv_heads = 2;
    c.max_head_dim = 8;
    c.max_dim = 24;
    c.max_hidden_dim = 10;
    c.max_vocab = 20;
    return c;
}

// No free head dim, RoPE NONE only (odd head dims), tied only, one sequence, theta and eps fixed.
kvcm_caps tight_fixed() {
    kvcm_caps c{};
    c.struct_size = sizeof c;
    c.features = KVCM_FEATURE_ALL_LOGITS | KVCM_FEATURE_RELEASE | KVCM_FEATURE_READ_KV | KVCM_FEATURE_TIED;
    c.weight_formats = 1u << KVCM_WEIGHTS_FLAT_F32;
    c.cache_dtypes = 1u << KVC_DTYPE_F32;
    c.rope_variants = 1u << KVC_ROPE_NONE;
    c.max_context = 20;
    c.max_seqs = 1;
    c.max_layers = 3;
    c.max_heads = 4;
    c.max_kv_heads = 4;
    c.max_head_dim = 16;
    c.max_dim = 16;
    c.max_hidden_dim = 0; // no limit
    c.max_vocab = 0;
    c.fixed_rope_theta = 10000.0f;
    c.fixed_rms_eps = 1e-5f;
    return c;
}

bool within(uint32_t v, uint32_t limit) { return limit == 0 || v <= limit; }

// The rules a case must keep, written out again (not through case_error or outside_caps, which they check).
void expect_well_formed(const ModelCase& c, const kvcm_caps& caps, const std::string& what) {
    const kvcm_model_desc& d = c.desc;
    SCOPED_TRACE(what + ": " + c.describe());
    EXPECT_EQ(case_error(c), "");
    EXPECT_EQ(outside_caps(c, caps), "");
    EXPECT_GE(d.n_layers, 1u);
    EXPECT_TRUE(within(d.n_layers, caps.max_layers));
    EXPECT_GE(d.n_kv_heads, 1u);
    EXPECT_TRUE(within(d.n_kv_heads, caps.max_kv_heads));
    EXPECT_GE(d.n_heads, 1u);
    EXPECT_TRUE(within(d.n_heads, caps.max_heads));
    EXPECT_EQ(d.n_heads % d.n_kv_heads, 0u);
    EXPECT_GE(d.head_dim, 1u);
    EXPECT_TRUE(within(d.head_dim, caps.max_head_dim));
    if (d.rope != KVC_ROPE_NONE) { EXPECT_EQ(d.head_dim % 2, 0u); }
    EXPECT_TRUE(caps.rope_variants & (1u << d.rope));
    if (!(caps.features & KVCM_FEATURE_FREE_HEAD_DIM)) { EXPECT_EQ(d.dim, d.n_heads * d.head_dim); }
    EXPECT_GE(d.dim, 1u);
    EXPECT_TRUE(within(d.dim, caps.max_dim));
    EXPECT_GE(d.hidden_dim, 1u);
    EXPECT_TRUE(within(d.hidden_dim, caps.max_hidden_dim));
    EXPECT_GE(d.vocab_size, 1u);
    EXPECT_TRUE(within(d.vocab_size, caps.max_vocab));
    EXPECT_TRUE(caps.features & (d.tied ? KVCM_FEATURE_TIED : KVCM_FEATURE_UNTIED));
    EXPECT_TRUE(caps.weight_formats & (1u << c.weights_format));
    EXPECT_TRUE(within(d.max_context, caps.max_context));
    EXPECT_TRUE(within(d.max_seqs, caps.max_seqs));
    if (caps.fixed_rope_theta > 0) { EXPECT_EQ(d.rope_theta, caps.fixed_rope_theta); }
    if (caps.fixed_rms_eps > 0) { EXPECT_EQ(d.rms_eps, caps.fixed_rms_eps); }
    const size_t ctx = d.max_context, p = c.prompt.size(), p2 = c.prompt2.size();
    EXPECT_GE(p, 1u);
    EXPECT_GE(p2, 1u);
    EXPECT_LE(p, std::max<size_t>(1, ctx / 2));
    EXPECT_LE(p2, std::max<size_t>(1, ctx / 2));
    EXPECT_LE(p + static_cast<size_t>(c.n_steps), ctx);
    EXPECT_LE(p + c.tail.size(), ctx);
    EXPECT_LE(std::max(p, p2) + c.tail2.size(), ctx);
    for (const std::vector<int>* list : {&c.prompt, &c.prompt2, &c.tail, &c.tail2})
        for (int t : *list) {
            EXPECT_GE(t, 0);
            EXPECT_LT(static_cast<uint32_t>(t), d.vocab_size);
        }
    for (int n : c.chunks) EXPECT_GE(n, 1);
    EXPECT_EQ(std::accumulate(c.chunks.begin(), c.chunks.end(), size_t{0}), p);
}

// Every size of a no larger than b's, the sum of them smaller; what shrinking never changes, unchanged.
void expect_smaller(const ModelCase& a, const ModelCase& b, const std::string& property) {
    const auto sizes = [](const ModelCase& c) {
        const kvcm_model_desc& d = c.desc;
        long tokens = 0;
        for (const std::vector<int>* list : {&c.prompt, &c.prompt2, &c.tail, &c.tail2})
            tokens = std::accumulate(list->begin(), list->end(), tokens);
        return std::vector<long>{d.n_layers,          d.n_kv_heads,        d.n_heads,          d.head_dim,
                                 d.dim,               d.hidden_dim,        d.vocab_size,       d.max_seqs,
                                 d.max_context,       long(c.prompt.size()), long(c.prompt2.size()), c.n_steps,
                                 long(c.tail.size()), long(c.tail2.size()), long(c.chunks.size()), tokens};
    };
    const std::vector<long> x = sizes(a), y = sizes(b);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_LE(x[i], y[i]) << "size " << i << " grew: " << a.describe();
    EXPECT_LT(std::accumulate(x.begin(), x.end(), 0L), std::accumulate(y.begin(), y.end(), 0L)) << a.describe();
    EXPECT_TRUE(smaller_than(a, b));
    EXPECT_FALSE(smaller_than(b, a));
    EXPECT_EQ(a.seed, b.seed);
    EXPECT_EQ(a.weights_format, b.weights_format);
    EXPECT_EQ(a.desc.rope, b.desc.rope);
    EXPECT_EQ(a.desc.rope_theta, b.desc.rope_theta);
    EXPECT_EQ(a.desc.rms_eps, b.desc.rms_eps);
    EXPECT_EQ(a.desc.tied, b.desc.tied);
    EXPECT_EQ(a.embed_rms, b.embed_rms);
    if (property == "MODEL-FORK") { EXPECT_GE(a.desc.max_seqs, std::min(2u, b.desc.max_seqs)); }
    if (property == "MODEL-CHUNK" && b.prompt.size() >= 2) { EXPECT_GE(a.prompt.size(), 2u); }
}

TEST(ModelShrink, EveryCandidateIsWellFormedInsideTheCapsAndSmaller) {
    const std::vector<std::pair<std::string, kvcm_caps>> all_caps = {
        {"our engine", caps_of(kvcm_model_engine_entry)},
        {"the C example", caps_of(kvcm_model_example_entry)},
        {"tight, free head dim", tight_free()},
        {"tight, fixed parameters", tight_fixed()}};
    size_t checked = 0, deepest = 0;
    for (const auto& [name, caps] : all_caps)
        for (uint64_t seed = 0; seed < 4; ++seed)
            for (const std::string& property : model_property_ids()) {
                const ModelCase drawn = draw_case(kSeed + seed * 7919 + property.size(), caps);
                expect_well_formed(drawn, caps, name + ", drawn");
                // a descent to the bottom, through a different candidate at each step
                ModelCase c = drawn;
                for (size_t depth = 0;; ++depth) {
                    const std::vector<ModelCase> list = shrink_candidates(c, property, caps);
                    std::set<std::string> texts; // the JSON form holds every field: equal texts, equal cases
                    for (const ModelCase& n : list) texts.insert(to_json(n).dump());
                    EXPECT_EQ(texts.size(), list.size()) << "a candidate repeated";
                    std::set<std::string> again; // deterministic
                    for (const ModelCase& n : shrink_candidates(c, property, caps)) again.insert(to_json(n).dump());
                    EXPECT_EQ(again, texts);
                    for (size_t i = 0; i < list.size(); ++i) {
                        expect_well_formed(list[i], caps, name + ", " + property + ", candidate");
                        expect_smaller(list[i], c, property);
                        EXPECT_EQ(to_json(case_from_json(to_json(list[i]))), to_json(list[i]));
                        ++checked;
                    }
                    if (list.empty()) {
                        deepest = std::max(deepest, depth);
                        break;
                    }
                    c = list[(seed + depth) % list.size()]; // vary which one is taken
                    ASSERT_LT(depth, 2000u) << "the descent does not end";
                }
                if (::testing::Test::HasFailure()) return;
            }
    std::cout << checked << " candidates checked; the longest descent took " << deepest << " steps\n";
    EXPECT_GT(checked, 10000u);
}

// A drawn case round-trips through JSON exactly, floats included.
TEST(ModelShrink, TheJsonFormRoundTrips) {
    const kvcm_caps caps = caps_of(kvcm_model_engine_entry);
    for (uint64_t seed = 0; seed < 200; ++seed) {
        const ModelCase c = draw_case(seed, caps);
        const ModelCase back = case_from_json(nlohmann::json::parse(to_json(c).dump()));
        EXPECT_EQ(back.describe(), c.describe());
        EXPECT_EQ(back.desc.rope_theta, c.desc.rope_theta);
        EXPECT_EQ(back.desc.rms_eps, c.desc.rms_eps);
        EXPECT_EQ(back.embed_rms, c.embed_rms);
        EXPECT_EQ(to_json(back), to_json(c));
        EXPECT_EQ(0, std::memcmp(&back.desc, &c.desc, sizeof c.desc));
    }
}

// What a replay file may hold in its "case": anything wrong is std::invalid_argument naming the field.
TEST(ModelShrink, AMalformedCaseIsAClearError) {
    const nlohmann::json good = to_json(draw_case(kSeed, caps_of(kvcm_model_example_entry)));
    ASSERT_NO_THROW(case_from_json(good));
    const auto error = [&](const std::function<void(nlohmann::json&)>& change) {
        nlohmann::json j = good;
        change(j);
        try {
            case_from_json(j);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        ADD_FAILURE() << "accepted " << j.dump();
        return std::string();
    };
    const auto has = [](const std::string& text, const std::string& part) {
        EXPECT_NE(text.find(part), std::string::npos) << text;
    };
    has(error([](auto& j) { j["layers"] = 2; }), "unknown field \"layers\"");
    has(error([](auto& j) { j["desc"]["bias"] = true; }), "unknown field \"desc.bias\"");
    has(error([](auto& j) { j.erase("prompt"); }), "missing field \"prompt\"");
    has(error([](auto& j) { j["desc"].erase("rms_eps"); }), "missing field \"rms_eps\" in desc");
    has(error([](auto& j) { j = nlohmann::json::array(); }), "not an object");
    has(error([](auto& j) { j["desc"]["n_layers"] = 4294967297ull; }), "\"desc.n_layers\" is 4294967297");
    has(error([](auto& j) { j["desc"]["n_layers"] = 9; }), "n_layers is 9, expected 1 to 4");
    has(error([](auto& j) { j["desc"]["n_layers"] = -1; }), "\"desc.n_layers\" is -1");
    has(error([](auto& j) { j["desc"]["dim"] = 2.5; }), "\"desc.dim\" is 2.5");
    has(error([](auto& j) { j["desc"]["rope"] = "alibi"; }), "\"desc.rope\" is \"alibi\"");
    has(error([](auto& j) { j["desc"]["rope_theta"] = 1e300; }), "out of the range of a float32");
    has(error([](auto& j) { j["desc"]["rms_eps"] = 0; }), "rms_eps");
    has(error([](auto& j) { j["desc"]["tied"] = 1; }), "\"desc.tied\" is 1, expected true or false");
    has(error([](auto& j) { j["desc"]["cache_dtype"] = "f16"; }), "cache_dtype");
    has(error([](auto& j) { j["weights_format"] = "gguf"; }), "weights_format");
    has(error([](auto& j) { j["seed"] = -3; }), "\"seed\" is -3");
    has(error([](auto& j) { j["prompt"][0] = 100000; }), "prompt[0] is token 100000, not below vocab_size");
    has(error([](auto& j) { j["prompt"][0] = "a"; }), "\"prompt[0]\" is \"a\"");
    has(error([](auto& j) { j["tail"] = nlohmann::json::array(); for (int i = 0; i < 65; ++i) j["tail"].push_back(0); }),
        "\"tail\" has 65 entries");
    has(error([](auto& j) { j["chunks"] = {0}; }), "\"chunks[0]\" is 0");
    has(error([](auto& j) { j["chunks"].push_back(1); }), "chunks sum to");
    has(error([](auto& j) { j["desc"]["n_heads"] = 3; j["desc"]["n_kv_heads"] = 2; }),
        "n_heads");
    has(error([](auto& j) { j["n_steps"] = 65; }), "\"n_steps\" is 65, more than 64");
}

// The cases shrinking reaches are cases like any other: the honest engines pass every one on a descent to the
// bottom (the bound holds on one-dimensional models, one-wide MLPs, two-token vocabularies). KVCHECK_SHRINK_SEEDS=N
// walks N seeds per property instead of 3.
TEST(ModelShrink, HonestEnginesPassTheCasesShrinkingReaches) {
    const char* env = std::getenv("KVCHECK_SHRINK_SEEDS");
    const uint64_t seeds = env ? std::strtoull(env, nullptr, 10) : 3;
    int ran = 0;
    double worst = 0;
    for (kvcm_entry_fn entry : {kvcm_model_engine_entry, kvcm_model_example_entry}) {
        const ModelTarget t = ModelTarget::from_entry(entry);
        for (const std::string& property : model_property_ids()) {
            if (property == "MODEL-PROJECTIONS") continue; // 101 tokens whatever the case: 3 cases in test_model_level
            for (uint64_t seed = 0; seed < seeds; ++seed) {
                ModelCase c = draw_case(kSeed + 1000 + seed, t.caps());
                for (size_t depth = 0;; ++depth) {
                    const PropertyResult r = run_model_case(t, property, c);
                    if (r.verdict == Verdict::NotSupported) break;
                    ASSERT_EQ(r.verdict, Verdict::Pass) << t.name() << " " << property << ": " << r.message;
                    worst = std::max(worst, r.worst_headroom);
                    ++ran;
                    const std::vector<ModelCase> list = shrink_candidates(c, property, t.caps());
                    if (list.empty()) break;
                    c = list[(seed + depth) % list.size()];
                }
            }
        }
    }
    std::cout << ran << " cases on descents passed, worst headroom " << worst << "\n";
    EXPECT_GT(ran, 100);
}

// ---- shrinking a broken engine's failure ----

struct Measured {
    const char* name;
    kvcm_entry_fn entry;
    const char* property;
};

std::string sizes_text(const ModelCase& c) {
    return std::to_string(c.desc.n_layers) + " layers, " + std::to_string(c.desc.n_heads) + "/" +
           std::to_string(c.desc.n_kv_heads) + " heads, dim " + std::to_string(c.desc.dim) + ", hidden " +
           std::to_string(c.desc.hidden_dim) + ", vocab " + std::to_string(c.desc.vocab_size) + ", " +
           std::to_string(c.prompt.size()) + "+" + std::to_string(c.prompt2.size()) + " prompt tokens, " +
           std::to_string(c.n_steps) + " steps, tails " + std::to_string(c.tail.size()) + "+" +
           std::to_string(c.tail2.size()) + ", " + std::to_string(c.chunks.size()) + " chunks, context " +
           std::to_string(c.desc.max_context);
}

class ModelShrinkDoubles : public ::testing::TestWithParam<Measured> {};

// The first failure of seed kSeed's run, shrunk: a strictly smaller case that still fails the same property with the
// same kind of failure, the message says so and keeps the seed, the shrunk case fails again when run as it is, and
// the correct C example passes it (the shrunk case is a fair case, not a degenerate one the bound cannot judge).
TEST_P(ModelShrinkDoubles, TheFirstFailureShrinksAndStillFails) {
    const Measured m = GetParam();
    const ModelTarget t = ModelTarget::from_entry(m.entry);
    const PropertyResult first = run_model_property(t, m.property, kSeed, 200);
    ASSERT_EQ(first.verdict, Verdict::Fail) << first.message;
    ASSERT_TRUE(first.the_case.has_value());
    const PropertyResult s = run_model_property(t, m.property, kSeed, 200, kMaxShrinkRuns);
    ASSERT_EQ(s.verdict, Verdict::Fail) << s.message;
    ASSERT_TRUE(s.the_case.has_value());
    std::cout << m.name << " " << m.property << ", case seed " << first.case_seed << "\n  drawn:  "
              << sizes_text(*first.the_case) << "\n  shrunk: " << sizes_text(*s.the_case) << "\n  in "
              << s.shrink_steps << " steps, " << s.shrink_runs << " runs\n"
              << s.message << "\n";
    EXPECT_EQ(s.case_seed, first.case_seed);
    EXPECT_GT(s.shrink_steps, 0);
    EXPECT_LE(s.shrink_runs, kMaxShrinkRuns);
    EXPECT_TRUE(smaller_than(*s.the_case, *first.the_case));
    EXPECT_EQ(s.message.rfind(s.the_case->describe() + "\n" + s.failure, 0), 0u) << s.message;
    EXPECT_NE(s.message.find("shrunk in " + std::to_string(s.shrink_steps) + " steps"), std::string::npos);
    EXPECT_NE(s.message.find("from case seed " + std::to_string(first.case_seed)), std::string::npos);
    EXPECT_EQ(s.failure.rfind(m.property, 0), 0u) << s.failure; // the failure of the same property
    EXPECT_GE(s.excess, std::min(kClearExcess, first.excess)); // and as clear
    // run as it is, the shrunk case fails again, identically
    const PropertyResult again = run_model_case(t, m.property, *s.the_case);
    EXPECT_EQ(again.verdict, Verdict::Fail);
    EXPECT_EQ(again.failure, s.failure);
    // deterministic: the same run shrinks to the same case
    EXPECT_EQ(run_model_property(t, m.property, kSeed, 200, kMaxShrinkRuns).message, s.message);
    const PropertyResult fixed =
        run_model_case(ModelTarget::from_entry(kvcm_model_example_entry), m.property, *s.the_case);
    EXPECT_EQ(fixed.verdict, Verdict::Pass) << fixed.message;
}

INSTANTIATE_TEST_SUITE_P(Doubles, ModelShrinkDoubles,
                         ::testing::Values(Measured{"layer_cache", kvcm_double_layer_cache_entry, "MODEL-LOGITS"},
                                           Measured{"layer_cache_kv", kvcm_double_layer_cache_entry, "MODEL-KV"},
                                           Measured{"rope_reset", kvcm_double_rope_reset_entry, "MODEL-CHUNK"},
                                           Measured{"tied_mixup", kvcm_double_tied_mixup_entry, "MODEL-LOGITS"},
                                           Measured{"wrong_eps", kvcm_double_wrong_eps_entry, "MODEL-LOGITS"}),
                         [](const auto& info) { return std::string(info.param.name); });

// What each bug needs survives: a layer reading the layer below's cache needs two layers (not one), a classifier
// mix-up needs none of the attention (one layer is enough), a RoPE reset per call needs a chunk after the first.
TEST(ModelShrink, TheShrunkCasesKeepWhatEachBugNeeds) {
    const auto shrunk = [](kvcm_entry_fn entry, const char* property) {
        const PropertyResult r = run_model_property(ModelTarget::from_entry(entry), property, kSeed, 200, kMaxShrinkRuns);
        EXPECT_EQ(r.verdict, Verdict::Fail) << r.message;
        return r.the_case.value_or(ModelCase{});
    };
    EXPECT_EQ(shrunk(kvcm_double_layer_cache_entry, "MODEL-LOGITS").desc.n_layers, 2u);
    EXPECT_EQ(shrunk(kvcm_double_tied_mixup_entry, "MODEL-LOGITS").desc.n_layers, 1u);
    const ModelCase chunk = shrunk(kvcm_double_rope_reset_entry, "MODEL-CHUNK");
    EXPECT_GE(chunk.chunks.size(), 2u) << chunk.describe();
    EXPECT_TRUE(std::any_of(chunk.chunks.begin() + 1, chunk.chunks.end(), [](int n) { return n >= 2; }))
        << chunk.describe();
}

// Shrinking happens only to a FAIL: a correct engine's run is the same with or without it, and a result that is not
// a FAIL comes back from shrink_model_failure unchanged.
TEST(ModelShrink, ACorrectEngineIsNeverShrunk) {
    const ModelTarget t = ModelTarget::from_entry(kvcm_model_example_entry);
    for (const char* id : {"MODEL-LOGITS", "MODEL-CHUNK", "MODEL-KV", "MODEL-FORK"}) {
        const PropertyResult plain = run_model_property(t, id, kSeed, 20);
        const PropertyResult with = run_model_property(t, id, kSeed, 20, kMaxShrinkRuns);
        EXPECT_NE(with.verdict, Verdict::Fail) << with.message;
        EXPECT_EQ(with.verdict, plain.verdict);
        EXPECT_EQ(with.message, plain.message);
        EXPECT_EQ(with.shrink_steps, 0);
        EXPECT_EQ(with.shrink_runs, 0);
        const PropertyResult again = shrink_model_failure(t, id, plain);
        EXPECT_EQ(again.message, plain.message);
        EXPECT_EQ(again.shrink_runs, 0);
    }
}

// An engine whose logits are NaN: every difference is NaN, a failure without a bound, and shrinking takes it down
// like any other (a NaN "excess" once compared false with every threshold, and no candidate was ever accepted).
kvcm_model_api nan_api;
kvc_status (*example_forward)(kvcm_model*, uint32_t, uint32_t, const int32_t*, float*) = nullptr;
kvc_status nan_forward(kvcm_model* m, uint32_t seq, uint32_t n, const int32_t* tokens, float* logits) {
    const kvc_status s = example_forward(m, seq, n, tokens, logits);
    if (s == KVC_OK && logits) logits[0] = std::numeric_limits<float>::quiet_NaN();
    return s;
}
const kvcm_model_api* nan_entry(uint32_t major, uint32_t minor) {
    const kvcm_model_api* inner = kvcm_model_example_entry(major, minor);
    if (!inner) return nullptr;
    nan_api = *inner;
    example_forward = inner->forward;
    nan_api.forward = nan_forward;
    return &nan_api;
}

TEST(ModelShrink, ANanFailureIsShrunkToo) {
    const PropertyResult r =
        run_model_property(ModelTarget::from_entry(nan_entry), "MODEL-LOGITS", kSeed, 20, kMaxShrinkRuns);
    ASSERT_EQ(r.verdict, Verdict::Fail) << r.message;
    EXPECT_GT(r.shrink_steps, 0) << r.message;
    EXPECT_NE(r.message.find("shrunk in"), std::string::npos) << r.message;
}

} // namespace
