// The model level through the command line (issue 11): `kvcheck validate --plugin` finds which tables a plugin
// exports and runs the matching properties through the same harness as the operation level — one verdict
// vocabulary (CRASH and TIMEOUT included), the level in the verdict table and the reports, failures shrunk, replay
// files carrying the case as run (the shrunk one) and its case seed, the documented exit codes. The plugins: our
// model engine (both levels in one .so), the C example (model level only) and the doubles of tests/model_level/doubles.
#include "cli_rig.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using namespace kvc::cli_test; // cli_rig.hpp: quote, read_file, Outcome, run_kvcheck

std::string lib(const std::string& name) { return std::string(KVC_LIB_DIR) + "/lib" + name + ".so"; }
std::string model_engine() { return "--plugin " + quote(lib("kvcheck_model_engine_plugin")); }
std::string example() { return "--plugin " + quote(lib("kvcheck_model_example_plugin")); }
std::string model_double(const std::string& d) { return "--plugin " + quote(lib("kvcheck_model_double_" + d)); }

// n copies of verdict v: what verdicts() returns when every case of a property ended v.
std::multiset<std::string> times(int n, const std::string& v) {
    std::multiset<std::string> m;
    for (int i = 0; i < n; ++i) m.insert(v);
    return m;
}

class ModelCli : public ::testing::Test {
protected:
    void SetUp() override { dir_ = fresh_test_dir(KVC_MODEL_CLI_WORK_DIR); }

    Outcome kvcheck(std::string args) { return run_kvcheck(dir_, std::move(args)); }

    nlohmann::json report() const {
        const std::string text = read_file(dir_ / "r.json");
        EXPECT_TRUE(nlohmann::json::accept(text)) << "r.json is not valid JSON";
        return nlohmann::json::parse(text, nullptr, false);
    }

    // The verdict of every case of `property` in the report's only implementation.
    std::multiset<std::string> verdicts(const nlohmann::json& r, const std::string& property) const {
        std::multiset<std::string> v;
        for (const auto& c : r["implementations"][0]["cases"])
            if (c["property"] == property) v.insert(c["verdict"].get<std::string>());
        return v;
    }
    // a property's cases outside the declaration: no verdict, counted apart
    int outside(const nlohmann::json& r, const std::string& property) const {
        for (const auto& p : r["implementations"][0]["properties"])
            if (p["id"] == property) return p["outside_declaration"].get<int>();
        return -1;
    }

    fs::path dir_;
};

// ---- conformant engines ----

// Ours exports both tables: one run judges both levels, and the report says which level each property is of.
TEST_F(ModelCli, ModelEngineIsConformantAtBothLevels) {
    const Outcome r = kvcheck("validate " + model_engine() + " --profile core --cases 3 --report r.json");
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_NE(r.out.find("overall: CONFORMANT"), std::string::npos) << r.out;
    const nlohmann::json j = report();
    EXPECT_EQ(j["run"]["levels"], nlohmann::json::array({"operation", "model"}));
    const nlohmann::json& impl = j["implementations"][0];
    EXPECT_EQ(impl["levels"], nlohmann::json::array({"operation", "model"}));
    EXPECT_TRUE(impl.contains("model")) << impl.dump();
    std::set<std::string> levels;
    bool logits = false;
    for (const auto& p : impl["properties"]) {
        levels.insert(p["level"].get<std::string>());
        if (p["id"] == "MODEL-LOGITS") {
            logits = true;
            EXPECT_EQ(p["level"], "model");
            EXPECT_EQ(p["counts"]["PASS"], 3) << p.dump();
        }
    }
    EXPECT_TRUE(logits);
    EXPECT_EQ(levels, (std::set<std::string>{"operation", "model"}));
    for (const auto& c : impl["cases"]) EXPECT_TRUE(c["level"] == "operation" || c["level"] == "model") << c.dump();
    // the verdict table has a level column when the model level ran
    EXPECT_NE(r.out.find("model      MODEL-LOGITS"), std::string::npos) << r.out;
}

TEST_F(ModelCli, ModelEngineIsConformantAtTheModelLevelEveryProperty) {
    const Outcome r = kvcheck("validate " + model_engine() + " --level model --cases 4 --report r.json");
    EXPECT_EQ(r.rc, 0) << r.all();
    const nlohmann::json j = report();
    EXPECT_EQ(j["run"]["levels"], nlohmann::json::array({"model"}));
    EXPECT_EQ(j["implementations"][0]["properties"].size(), 7u);
    EXPECT_TRUE(verdicts(j, "MODEL-KV").empty());
    EXPECT_EQ(outside(j, "MODEL-KV"), 4);
    EXPECT_EQ(verdicts(j, "MODEL-FORK"), times(4, "PASS"));
}

// The C example exports the model table only: the run is the model level alone, without being asked.
TEST_F(ModelCli, TheCExampleIsConformantAndOnlyTheModelLevelRuns) {
    const Outcome r = kvcheck("validate " + example() + " --cases 4 --report r.json --junit r.xml");
    EXPECT_EQ(r.rc, 0) << r.all();
    const nlohmann::json j = report();
    EXPECT_EQ(j["run"]["levels"], nlohmann::json::array({"model"}));
    EXPECT_EQ(j["implementations"][0]["levels"], nlohmann::json::array({"model"}));
    EXPECT_EQ(j["implementations"][0]["name"], "model-example-c");
    EXPECT_EQ(verdicts(j, "MODEL-KV"), times(4, "PASS"));
    EXPECT_TRUE(verdicts(j, "MODEL-FORK").empty());
    EXPECT_EQ(outside(j, "MODEL-FORK"), 4);
    EXPECT_NE(read_file(dir_ / "r.xml").find("MODEL-LOGITS"), std::string::npos);
}

// ---- the doubles fail the property that names their bug ----

struct Broken {
    const char* name;
    const char* property;
};

class ModelCliDoubles : public ModelCli, public ::testing::WithParamInterface<Broken> {};

TEST_P(ModelCliDoubles, FailTheRightPropertyAndReplay) {
    const Broken b = GetParam();
    const Outcome r = kvcheck("validate " + model_double(b.name) + " --filter '^" + b.property +
                              "/' --cases 40 --report r.json");
    ASSERT_EQ(r.rc, 1) << r.all();
    EXPECT_NE(r.out.find("NOT CONFORMANT"), std::string::npos) << r.out;
    const nlohmann::json j = report();
    const std::multiset<std::string> v = verdicts(j, b.property);
    EXPECT_GT(v.count("FAIL"), 0u) << r.out;
    EXPECT_EQ(v.count("FAIL") + v.count("PASS"), v.size()) << r.out; // nothing but the bug
    // the first failing case: its replay file reproduces it; the C example passes it
    nlohmann::json failed;
    for (const auto& c : j["implementations"][0]["cases"])
        if (c["verdict"] == "FAIL") {
            failed = c;
            break;
        }
    ASSERT_TRUE(failed.contains("replay_file")) << failed.dump();
    EXPECT_EQ(failed["level"], "model");
    // the first failure is shrunk, and the report, the replay file and the printed text carry the shrunk case
    EXPECT_GT(failed["shrink_steps"].get<int>(), 0) << failed.dump();
    EXPECT_NE(failed["reason"].get<std::string>().find("shrunk in "), std::string::npos) << failed.dump();
    ASSERT_TRUE(failed.contains("model_case")) << failed.dump();
    EXPECT_NE(r.out.find(failed["counterexample_text"].get<std::string>()), std::string::npos) << r.out;
    const std::string file = failed["replay_file"].get<std::string>();
    const nlohmann::json doc = nlohmann::json::parse(read_file(dir_ / file));
    EXPECT_EQ(doc["level"], "model");
    EXPECT_EQ(doc["seed"], failed["seed"]);
    EXPECT_EQ(doc["case"], failed["model_case"]);
    EXPECT_EQ(doc["shrink_steps"], failed["shrink_steps"]);
    // the replay runs the shrunk case, says so, and fails it the same way
    const Outcome again = kvcheck("replay " + quote(file) + " " + model_double(b.name));
    EXPECT_EQ(again.rc, 1) << again.all();
    EXPECT_NE(again.out.find("verdict: FAIL"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("the recorded case, shrunk in"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("  " + failed["counterexample_text"].get<std::string>()), std::string::npos) << again.out;
    const std::string reason = failed["reason"].get<std::string>();
    const std::string failure = reason.substr(0, reason.find("\nshrunk in ")); // the case and its failure
    EXPECT_NE(again.out.find("reason: " + failure), std::string::npos) << again.out;
    const Outcome fixed = kvcheck("replay " + quote(file) + " " + example());
    EXPECT_EQ(fixed.rc, 0) << fixed.all();
    EXPECT_NE(fixed.out.find("verdict: PASS"), std::string::npos) << fixed.out;
}

INSTANTIATE_TEST_SUITE_P(Doubles, ModelCliDoubles,
                         ::testing::Values(Broken{"layer_cache", "MODEL-LOGITS"}, Broken{"rope_reset", "MODEL-CHUNK"},
                                           Broken{"wrong_eps", "MODEL-LOGITS"},
                                           Broken{"tied_mixup", "MODEL-LOGITS"}),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- shrinking ----

// Sizes of a model case as the report writes it, summed: shrinking lowers some and raises none.
long case_size(const nlohmann::json& c) {
    long n = 0;
    for (const char* k : {"n_layers", "n_heads", "n_kv_heads", "head_dim", "dim", "hidden_dim", "vocab_size",
                          "max_context", "max_seqs"})
        n += c["desc"][k].get<long>();
    for (const char* k : {"prompt", "prompt2", "tail", "tail2", "chunks"}) n += static_cast<long>(c[k].size());
    return n + c["n_steps"].get<long>();
}

// The same failing case with --shrink-first 0 (as drawn) and by default (shrunk): the shrunk one is smaller in every
// size, keeps the two layers the bug needs, and the message keeps the case seed. A replay file without "case" still
// replays, drawing the case from its seed: the unshrunk one.
TEST_F(ModelCli, AFailureIsShrunkAndItsReplayFileRunsTheShrunkCase) {
    const std::string args = "validate " + model_double("layer_cache") + " --filter '^MODEL-LOGITS/1$' --cases 2 ";
    const Outcome drawn = kvcheck(args + "--shrink-first 0 --counterexamples drawn --report r.json");
    ASSERT_EQ(drawn.rc, 1) << drawn.all();
    const nlohmann::json d = report()["implementations"][0]["cases"][0];
    ASSERT_EQ(d["verdict"], "FAIL") << d.dump();
    EXPECT_EQ(d["shrink_steps"], 0);
    EXPECT_EQ(d["notes"], nlohmann::json::array({"not shrunk: only the first 0 failures of MODEL-LOGITS are shrunk "
                                                 "(--shrink-first)"}));
    const Outcome shrunk = kvcheck(args + "--counterexamples shrunk --report r.json");
    ASSERT_EQ(shrunk.rc, 1) << shrunk.all();
    const nlohmann::json s = report()["implementations"][0]["cases"][0];
    ASSERT_EQ(s["verdict"], "FAIL") << s.dump();
    EXPECT_EQ(s["notes"], nlohmann::json::array());
    const int steps = s["shrink_steps"].get<int>();
    EXPECT_GT(steps, 0);
    EXPECT_NE(s["reason"].get<std::string>().find("shrunk in " + std::to_string(steps) + " steps"), std::string::npos);
    EXPECT_NE(shrunk.out.find("from case seed " + std::to_string(d["seed"].get<uint64_t>())), std::string::npos)
        << shrunk.out;
    const nlohmann::json& a = d["model_case"];
    const nlohmann::json& b = s["model_case"];
    EXPECT_EQ(a["seed"], b["seed"]);
    for (const char* k : {"n_layers", "n_heads", "n_kv_heads", "head_dim", "dim", "hidden_dim", "vocab_size",
                          "max_context", "max_seqs"})
        EXPECT_LE(b["desc"][k], a["desc"][k]) << k;
    for (const char* k : {"prompt", "prompt2", "tail", "tail2", "chunks"}) EXPECT_LE(b[k].size(), a[k].size()) << k;
    EXPECT_LT(case_size(b), case_size(a)) << a.dump() << "\n" << b.dump();
    EXPECT_EQ(b["desc"]["n_layers"], 2); // layer 1 reading layer 0's cache: two layers, no fewer
    std::cout << "drawn:  " << d["counterexample_text"].get<std::string>() << "\nshrunk: "
              << s["counterexample_text"].get<std::string>() << "\n";

    // the replay of each file runs its own case
    const Outcome replay_shrunk = kvcheck("replay shrunk/MODEL-LOGITS-1.json " + model_double("layer_cache"));
    EXPECT_EQ(replay_shrunk.rc, 1) << replay_shrunk.all();
    EXPECT_NE(replay_shrunk.out.find("  " + s["counterexample_text"].get<std::string>()), std::string::npos)
        << replay_shrunk.out;
    nlohmann::json old = nlohmann::json::parse(read_file(dir_ / "shrunk/MODEL-LOGITS-1.json"));
    old.erase("case");
    old.erase("shrink_steps");
    std::ofstream(dir_ / "old.json") << old.dump();
    const Outcome replay_old = kvcheck("replay old.json " + model_double("layer_cache"));
    EXPECT_EQ(replay_old.rc, 1) << replay_old.all();
    EXPECT_NE(replay_old.out.find("the case drawn from seed"), std::string::npos) << replay_old.out;
    EXPECT_NE(replay_old.out.find("  " + d["counterexample_text"].get<std::string>()), std::string::npos)
        << replay_old.out;
    EXPECT_NE(replay_old.out.find("verdict: FAIL"), std::string::npos) << replay_old.out;
}

// Shrinking runs the engine on smaller models; one that crashes there (crash_small: the layer-cache bug, and abort()
// below d_model 8) must not cost the failure already found: the FAIL is kept unshrunk, with a note saying why, and
// its replay file holds the case as drawn. Loaded in the case process (--isolation fork) the process that dies is the
// case process; served (the default) it is serve-plugin's, and the note names the request it died in.
TEST_F(ModelCli, AFailureWhoseShrinkingCrashesIsKeptUnshrunk) {
    for (const bool served : {false, true}) {
        const Outcome r = kvcheck("validate " + model_double("crash_small") + " --filter '^MODEL-LOGITS/' --cases 8 "
                                  "--shrink-first all --report r.json" + (served ? "" : " --isolation fork"));
        EXPECT_EQ(r.rc, 1) << r.all();
        int kept = 0;
        const nlohmann::json j = report();
        for (const auto& c : j["implementations"][0]["cases"]) {
            if (c["verdict"] != "FAIL") continue;
            ASSERT_EQ(c["notes"].size(), 1u) << c.dump();
            const std::string note = c["notes"][0].get<std::string>();
            if (served) {
                EXPECT_EQ(note.rfind("not shrunk: while shrinking, the reply to model forward", 0), 0u) << c.dump();
                EXPECT_NE(note.find("the serve-plugin process died of SIGABRT"), std::string::npos) << c.dump();
            } else {
                EXPECT_EQ(note.rfind("not shrunk: while shrinking, the case process died of SIGABRT", 0), 0u)
                    << c.dump();
            }
            EXPECT_EQ(c["shrink_steps"], 0);
            ASSERT_TRUE(c.contains("model_case")) << c.dump();
            EXPECT_GE(c["model_case"]["desc"]["dim"].get<int>(), 8); // the case as drawn
            const Outcome again = kvcheck("replay " + quote(c["replay_file"].get<std::string>()) + " " +
                                          model_double("crash_small"));
            EXPECT_EQ(again.rc, 1) << again.all();
            EXPECT_NE(again.out.find("verdict: FAIL"), std::string::npos) << again.out;
            ++kept;
        }
        EXPECT_GT(kept, 0) << r.out;
    }
}

// A correct engine is never shrunk: nothing fails, and the report says so case by case.
TEST_F(ModelCli, ACorrectEngineIsNeverShrunk) {
    const Outcome r = kvcheck("validate " + example() + " --filter '^MODEL-(LOGITS|CHUNK)/' --cases 3 --report r.json");
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_EQ(r.out.find("shrunk"), std::string::npos) << r.out;
    const nlohmann::json cases = report()["implementations"][0]["cases"];
    EXPECT_EQ(cases.size(), 6u);
    for (const auto& c : cases) {
        EXPECT_EQ(c["verdict"], "PASS") << c.dump();
        EXPECT_EQ(c["shrink_steps"], 0) << c.dump();
        EXPECT_FALSE(c.contains("model_case")) << c.dump();
    }
    EXPECT_FALSE(fs::exists(dir_ / "kvcheck-counterexamples"));
}

// A replay file's "case" is read as strictly as the rest: anything wrong in it is bad input naming the field, and no
// case process starts.
TEST_F(ModelCli, AMalformedCaseInAReplayFileIsBadInput) {
    const nlohmann::json good_case = {
        {"seed", 7},
        {"weights_format", "flat_f32"},
        {"embed_rms", 0},
        {"desc",
         {{"dim", 2}, {"hidden_dim", 1}, {"n_layers", 2}, {"n_heads", 1}, {"n_kv_heads", 1}, {"head_dim", 2},
          {"vocab_size", 2}, {"rope", "neox"}, {"rope_theta", 10000}, {"rms_eps", 1e-5}, {"tied", true},
          {"cache_dtype", "f32"}, {"max_context", 2}, {"max_seqs", 1}}},
        {"prompt", {1}},
        {"prompt2", {0}},
        {"n_steps", 1},
        {"chunks", {1}},
        {"tail", nlohmann::json::array()},
        {"tail2", nlohmann::json::array()}};
    const auto replay_with = [&](const nlohmann::json& c) {
        const nlohmann::json doc = {{"kvcheck_replay", 1}, {"level", "model"}, {"property", "MODEL-LOGITS"},
                                    {"seed", 7},           {"case", c},        {"shrink_steps", 3}};
        std::ofstream(dir_ / "case.json") << doc.dump();
        return kvcheck("replay case.json " + example());
    };
    const Outcome ok = replay_with(good_case);
    EXPECT_EQ(ok.rc, 0) << ok.all(); // the well-formed case runs, as it is
    EXPECT_NE(ok.out.find("dim 2, hidden_dim 1, n_layers 2"), std::string::npos) << ok.out;
    const auto expect_bad = [&](const std::function<void(nlohmann::json&)>& change, const std::string& message) {
        nlohmann::json c = good_case;
        change(c);
        const Outcome r = replay_with(c);
        EXPECT_EQ(r.rc, 2) << r.all();
        EXPECT_NE(r.err.find("case.json: "), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
        EXPECT_EQ(r.out.find("verdict:"), std::string::npos) << r.out; // nothing ran
    };
    expect_bad([](auto& c) { c["desc"]["n_layers"] = 4294967297ull; }, "\"desc.n_layers\" is 4294967297");
    expect_bad([](auto& c) { c["desc"]["n_layers"] = 100; }, "n_layers is 100, expected 1 to 4");
    expect_bad([](auto& c) { c["prompt"] = {2}; }, "prompt[0] is token 2, not below vocab_size 2");
    expect_bad([](auto& c) { c["chunks"] = {1, 1}; }, "chunks sum to 2 tokens, the prompt has 1");
    expect_bad([](auto& c) { c["layers"] = 1; }, "unknown field \"layers\"");
    expect_bad([](auto& c) { c.erase("tail"); }, "missing field \"tail\"");
    expect_bad([](auto& c) { c["desc"]["rope_theta"] = 1e300; }, "out of the range of a float32");
    expect_bad([](auto& c) { c["desc"]["head_dim"] = 3; c["desc"]["dim"] = 3; }, "head_dim 3 is odd");
    expect_bad([](auto& c) { c["seed"] = 8; }, "the case's seed 8 is not the case seed 7");
    expect_bad([](auto& c) { c = "a case"; }, "not an object");
}

// ---- CRASH and TIMEOUT at the model level: each case runs in a child, as at the operation level ----

TEST_F(ModelCli, ForwardThatCrashesGivesCrash) {
    const Outcome r = kvcheck("validate " + model_double("crash_forward") + " --filter '^MODEL-LOGITS/' --cases 2 "
                              "--report r.json");
    EXPECT_EQ(r.rc, 1) << r.all();
    EXPECT_EQ(verdicts(report(), "MODEL-LOGITS"), times(2, "CRASH")) << r.out;
    EXPECT_NE(r.out.find("SIGABRT"), std::string::npos) << r.out;
    // the same with exec isolation: the case runs in a re-executed kvcheck (__isolated-child)
    const Outcome e = kvcheck("validate " + model_double("crash_forward") + " --filter '^MODEL-LOGITS/' --cases 2 "
                              "--isolation exec --report r.json");
    EXPECT_EQ(e.rc, 1) << e.all();
    EXPECT_EQ(verdicts(report(), "MODEL-LOGITS"), times(2, "CRASH")) << e.out;
    EXPECT_NE(e.out.find("isolation: exec"), std::string::npos) << e.out;
}

// The only test here that depends on time: the per-case timeout itself (2 s; forward() never returns).
TEST_F(ModelCli, ForwardThatHangsGivesTimeout) {
    const Outcome r = kvcheck("validate " + model_double("hang_forward") + " --filter '^MODEL-LOGITS/' --cases 1 "
                              "--timeout 2 --report r.json");
    EXPECT_EQ(r.rc, 1) << r.all();
    EXPECT_EQ(verdicts(report(), "MODEL-LOGITS"), (std::multiset<std::string>{"TIMEOUT"})) << r.out;
}

// ---- exit codes ----

TEST_F(ModelCli, MalformedModelTableIsBadInput) {
    const Outcome r = kvcheck("validate " + model_double("bad_major") + " --cases 1");
    EXPECT_EQ(r.rc, 2) << r.all();
    EXPECT_NE(r.err.find("model-level table"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("ABI 2.0"), std::string::npos) << r.err;
}

TEST_F(ModelCli, GetCapsThatCrashesWhileLoadingIsExit4) {
    const Outcome r = kvcheck("validate " + model_double("caps_crash") + " --cases 1");
    EXPECT_EQ(r.rc, 4) << r.all();
    EXPECT_NE(r.err.find("failed while being loaded"), std::string::npos) << r.err;
}

TEST_F(ModelCli, LevelTheLibraryDoesNotExportIsBadInput) {
    const Outcome r = kvcheck("validate " + example() + " --level operation --cases 1");
    EXPECT_EQ(r.rc, 2) << r.all();
    EXPECT_NE(r.err.find("exports no operation-level table"), std::string::npos) << r.err;
}

TEST_F(ModelCli, ReplayOfAModelCaseNeedsItsSeedAndAModelTable) {
    std::ofstream(dir_ / "no-seed.json") << R"({"kvcheck_replay": 1, "level": "model", "property": "MODEL-LOGITS"})";
    Outcome r = kvcheck("replay no-seed.json " + example());
    EXPECT_EQ(r.rc, 2) << r.all();
    EXPECT_NE(r.err.find("case seed"), std::string::npos) << r.err;
    std::ofstream(dir_ / "unknown.json")
        << R"({"kvcheck_replay": 1, "level": "model", "property": "EQUIV", "seed": 1})";
    r = kvcheck("replay unknown.json " + example());
    EXPECT_EQ(r.rc, 2) << r.all();
    EXPECT_NE(r.err.find("unknown model-level property"), std::string::npos) << r.err;
    std::ofstream(dir_ / "ok.json")
        << R"({"kvcheck_replay": 1, "level": "model", "property": "MODEL-LOGITS", "seed": 7})";
    r = kvcheck("replay ok.json --builtin cpu");
    EXPECT_EQ(r.rc, 2) << r.all();
    EXPECT_NE(r.err.find("exports no model-level table"), std::string::npos) << r.err;
    r = kvcheck("replay ok.json " + example());
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_NE(r.out.find("case seed 7"), std::string::npos) << r.out;
}

// ---- list ----

TEST_F(ModelCli, ListShowsTheModelLevelAndWhatAPluginExports) {
    Outcome r = kvcheck("list");
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_NE(r.out.find("\nmodel level"), std::string::npos) << r.out;
    for (const char* id : {"MODEL-LOGITS", "MODEL-KV", "MODEL-CHUNK", "MODEL-FORK", "MODEL-RELEASE", "MODEL-MEMORY",
                           "MODEL-PROJECTIONS"})
        EXPECT_NE(r.out.find(id), std::string::npos) << id;
    r = kvcheck("list " + model_engine());
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_NE(r.out.find("exports: operation, model"), std::string::npos) << r.out;
    r = kvcheck("list --json " + example());
    EXPECT_EQ(r.rc, 0) << r.all();
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["plugin"]["levels"], nlohmann::json::array({"model"}));
    EXPECT_EQ(j["model_properties"].size(), 7u);
}

} // namespace
