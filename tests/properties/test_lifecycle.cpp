// Model-based stateful test (rc::state): random sequences of append / decode / fork / release against a simple
// model of sequence lengths, driving one cache through the harness's session, which checks after every command
// that outputs equal the reference, past rows are unchanged, lengths agree and reported memory equals the formula.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include "implementations.hpp"
#include "kvcheck/properties/runner.hpp"

#include <dlfcn.h>

namespace {

using namespace kvc::prop;

struct Model {
    std::vector<uint32_t> len; // per sequence
    uint32_t max_tokens = 0;
};

struct Sut {
    Session* session;
};

using Command = rc::state::Command<Model, Sut>;

void apply_checked(Sut& sut, const Op& op) {
    try {
        sut.session->apply(op);
    } catch (const Violation& v) {
        RC_FAIL("[" + v.property() + "] " + v.what() + "\n  " + v.mismatch().describe());
    } catch (const std::exception& e) {
        RC_FAIL(std::string("call failed: ") + e.what());
    }
}

struct Append : Command {
    uint32_t seq, n;
    explicit Append(const Model& m)
        : seq(*rc::gen::inRange<uint32_t>(0, static_cast<uint32_t>(m.len.size()))),
          n(*rc::gen::inRange<uint32_t>(1, 20)) {}
    void checkPreconditions(const Model& m) const override { RC_PRE(m.len[seq] + n <= m.max_tokens); }
    void apply(Model& m) const override { m.len[seq] += n; }
    void run(const Model&, Sut& sut) const override {
        Op op;
        op.appends.push_back({seq, n});
        apply_checked(sut, op);
    }
    void show(std::ostream& os) const override { os << "Append(seq " << seq << ", " << n << " tokens)"; }
};

struct Decode : Command {
    uint32_t seq;
    explicit Decode(const Model& m) : seq(*rc::gen::inRange<uint32_t>(0, static_cast<uint32_t>(m.len.size()))) {}
    void checkPreconditions(const Model& m) const override { RC_PRE(m.len[seq] > 0 && m.len[seq] < m.max_tokens); }
    void apply(Model& m) const override { m.len[seq] += 1; }
    void run(const Model&, Sut& sut) const override {
        Op op;
        op.appends.push_back({seq, 1});
        apply_checked(sut, op);
    }
    void show(std::ostream& os) const override { os << "Decode(seq " << seq << ")"; }
};

struct Fork : Command {
    uint32_t parent, child;
    explicit Fork(const Model& m)
        : parent(*rc::gen::inRange<uint32_t>(0, static_cast<uint32_t>(m.len.size()))),
          child(*rc::gen::inRange<uint32_t>(0, static_cast<uint32_t>(m.len.size()))) {}
    void checkPreconditions(const Model& m) const override {
        RC_PRE(parent != child && m.len[parent] > 0 && m.len[child] == 0);
    }
    void apply(Model& m) const override { m.len[child] = m.len[parent]; }
    void run(const Model&, Sut& sut) const override {
        Op op;
        op.kind = OpKind::Fork;
        op.seq = parent;
        op.child = child;
        apply_checked(sut, op);
    }
    void show(std::ostream& os) const override { os << "Fork(" << parent << " -> " << child << ")"; }
};

struct Release : Command {
    uint32_t seq;
    explicit Release(const Model& m) : seq(*rc::gen::inRange<uint32_t>(0, static_cast<uint32_t>(m.len.size()))) {}
    void checkPreconditions(const Model& m) const override { RC_PRE(m.len[seq] > 0); }
    void apply(Model& m) const override { m.len[seq] = 0; }
    void run(const Model&, Sut& sut) const override {
        Op op;
        op.kind = OpKind::Release;
        op.seq = seq;
        apply_checked(sut, op);
    }
    void show(std::ostream& os) const override { os << "Release(seq " << seq << ")"; }
};

class Lifecycle : public ::testing::TestWithParam<std::string> {};

TEST_P(Lifecycle, EveryCommandKeepsEveryProperty) {
    const Target t = kvc::testing::load_implementation(GetParam());
    const bool fork_ok = t.caps.features & KVC_FEATURE_FORK, release_ok = t.caps.features & KVC_FEATURE_RELEASE;
    const bool ok = rc::check("lifecycle of " + GetParam(), [&] {
        CaseConfig cfg;
        cfg.n_kv_heads = *rc::gen::inRange<uint32_t>(1, 3);
        cfg.n_q_heads = cfg.n_kv_heads * ((t.caps.features & KVC_FEATURE_GQA) ? *rc::gen::inRange<uint32_t>(1, 4) : 1);
        cfg.n_layers = *rc::gen::inRange<uint32_t>(1, 3);
        cfg.head_dim = *rc::gen::elementOf(std::vector<uint32_t>{2, 4, 8, 16});
        cfg.block_size_hint = *rc::gen::elementOf(std::vector<uint32_t>{1, 3, 4, 7, 16});
        cfg.max_seqs = 4;
        cfg.max_tokens = 64;
        Checks ch;
        ch.property = "LIFECYCLE";
        ch.equiv = ch.content = ch.lengths = ch.all_unchanged = ch.fork_shares = ch.memory = true;
        Session session(t, cfg, *rc::gen::inRange<uint64_t>(0, 1u << 30), ch);
        Model m{std::vector<uint32_t>(cfg.max_seqs, 0), cfg.max_tokens};
        Sut sut{&session};
        rc::state::check(m, sut, [&](const Model& s) -> rc::Gen<std::shared_ptr<const Command>> {
            using namespace rc::state::gen;
            if (fork_ok && release_ok) return execOneOfWithArgs<Append, Decode, Fork, Release>()(s);
            if (fork_ok) return execOneOfWithArgs<Append, Decode, Fork>()(s);
            if (release_ok) return execOneOfWithArgs<Append, Decode, Release>()(s);
            return execOneOfWithArgs<Append, Decode>()(s);
        });
    });
    EXPECT_TRUE(ok);
}

// The life of the plugin's library itself: once the last Target is gone, the library stays mapped (load_plugin opens
// it with RTLD_NODELETE), so threads a plugin keeps past its caches never run unmapped code in the harness's process.
// Each ctest entry is its own process, so nothing else holds the double here; without the flag it is unmapped.
TEST(PluginLibrary, StaysMappedAfterTheLastTargetIsGone) {
    const std::string path = kvc::testing::double_path("correct");
    if (void* earlier = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) { // a whole-binary run: another test loaded it
        dlclose(earlier);
        GTEST_SKIP() << "the double is already loaded in this process (run this test on its own, as ctest does)";
    }
    {
        const Target t = load_plugin(path);
        kvc_cache* c = nullptr;
        kvc_config cfg{};
        cfg.struct_size = sizeof cfg;
        cfg.n_layers = 1;
        cfg.n_q_heads = cfg.n_kv_heads = 1;
        cfg.head_dim = 4;
        cfg.cache_dtype = KVC_DTYPE_F32;
        cfg.max_seqs = 1;
        cfg.max_tokens = 4;
        cfg.scale = 0.5f;
        ASSERT_EQ(t.api->create(&cfg, &c), KVC_OK);
        t.api->destroy(c);
    }
    void* still = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    EXPECT_NE(still, nullptr) << "the plugin's library was unmapped when its last Target went away";
    if (still) dlclose(still);
}

INSTANTIATE_TEST_SUITE_P(AllImplementations, Lifecycle, ::testing::ValuesIn(kvc::testing::implementation_names()),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (char& ch : s)
                                 if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return s;
                         });

} // namespace
