// The model level through the command line (issue 11): `kvcheck validate --plugin` finds which tables a plugin
// exports and runs the matching properties through the same harness as the operation level — one verdict
// vocabulary (CRASH and TIMEOUT included), the level in the verdict table and the reports, replay files keyed by the
// case seed, the documented exit codes. The plugins: our model engine (both levels in one .so), the C example
// (model level only) and the doubles of tests/model_level/doubles.
#include "cli_rig.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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
    EXPECT_EQ(verdicts(j, "MODEL-KV"), times(4, "NOT_SUPPORTED"));
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
    EXPECT_EQ(verdicts(j, "MODEL-FORK"), times(4, "NOT_SUPPORTED"));
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
    // the first failing case: its replay file, keyed by the case seed, reproduces it; the C example passes it
    nlohmann::json failed;
    for (const auto& c : j["implementations"][0]["cases"])
        if (c["verdict"] == "FAIL") {
            failed = c;
            break;
        }
    ASSERT_TRUE(failed.contains("replay_file")) << failed.dump();
    EXPECT_EQ(failed["level"], "model");
    const std::string file = failed["replay_file"].get<std::string>();
    const nlohmann::json doc = nlohmann::json::parse(read_file(dir_ / file));
    EXPECT_EQ(doc["level"], "model");
    EXPECT_EQ(doc["seed"], failed["seed"]);
    const Outcome again = kvcheck("replay " + quote(file) + " " + model_double(b.name));
    EXPECT_EQ(again.rc, 1) << again.all();
    EXPECT_NE(again.out.find("verdict: FAIL"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find(failed["reason"].get<std::string>().substr(0, 40)), std::string::npos) << again.out;
    const Outcome fixed = kvcheck("replay " + quote(file) + " " + example());
    EXPECT_EQ(fixed.rc, 0) << fixed.all();
    EXPECT_NE(fixed.out.find("verdict: PASS"), std::string::npos) << fixed.out;
}

INSTANTIATE_TEST_SUITE_P(Doubles, ModelCliDoubles,
                         ::testing::Values(Broken{"layer_cache", "MODEL-LOGITS"}, Broken{"rope_reset", "MODEL-CHUNK"},
                                           Broken{"wrong_eps", "MODEL-LOGITS"},
                                           Broken{"tied_mixup", "MODEL-LOGITS"}),
                         [](const auto& info) { return std::string(info.param.name); });

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
