// Writes outside what a plugin was lent, at both levels, through the kvcheck binary (every case in a process of its
// own): just before a buffer and 320 bytes past it are FAILs naming the buffer, a write that runs on into the
// protected pages is a CRASH naming it, a model get_caps that overruns kvcm_caps is exit 4 as at the operation level,
// and a model create that rewrites its const description is graded by the harness's own description. The doubles:
// tests/doubles/reach_cache.c (operation level) and tests/model_level/doubles/scribbling_model.c (model level).
// KVC_TEST_KVCHECK=PATH runs the tests against another kvcheck build (cli_rig.hpp).
#include "cli_rig.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace {

using namespace kvc::cli_test; // cli_rig.hpp: quote, read_file, Outcome, run_kvcheck

std::string plugin(const std::string& name) { return "--plugin " + quote(std::string(KVC_LIB_DIR) + "/lib" + name + ".so"); }

class LentGuards : public ::testing::Test {
protected:
    void SetUp() override { dir_ = fresh_test_dir(KVC_LENT_GUARDS_WORK_DIR); }

    // `kvcheck validate` of one property of one plugin; the report's cases of that property.
    nlohmann::json validate(const std::string& lib, const std::string& property, int cases, Outcome* outcome) {
        *outcome = run_kvcheck(dir_, "validate " + plugin(lib) + " --filter '^" + property + "/' --cases " +
                                         std::to_string(cases) + " --shrink-first 0 --report r.json");
        nlohmann::json got = nlohmann::json::array();
        const nlohmann::json j = nlohmann::json::parse(read_file(dir_ / "r.json"), nullptr, false);
        if (j.is_discarded()) return got;
        for (const auto& c : j["implementations"][0]["cases"])
            if (c["property"] == property) got.push_back(c);
        return got;
    }

    // Every case that ran ended `verdict` with a reason holding `words`; at least `at_least` of them did.
    void expect_every_case(const std::string& lib, const std::string& property, int cases, const std::string& verdict,
                           const std::string& words, int at_least) {
        Outcome r;
        const nlohmann::json got = validate(lib, property, cases, &r);
        EXPECT_EQ(r.rc, 1) << lib << ": " << r.all();
        std::map<std::string, int> count;
        for (const auto& c : got) {
            const std::string v = c["verdict"].get<std::string>();
            ++count[v];
            if (v == "NOT_SUPPORTED") continue;
            EXPECT_EQ(v, verdict) << lib << " " << c["id"] << ": " << c.value("reason", "");
            EXPECT_NE(c.value("reason", "").find(words), std::string::npos)
                << lib << " " << c["id"] << ": " << c.value("reason", "");
        }
        EXPECT_GE(count[verdict], at_least) << lib << ": " << r.out;
    }

    // Every case passed, or failed with a reason holding `words`; at least one failed.
    void expect_failures_only(const std::string& lib, const std::string& property, int cases,
                              const std::string& words) {
        Outcome r;
        const nlohmann::json got = validate(lib, property, cases, &r);
        EXPECT_EQ(r.rc, 1) << lib << ": " << r.all();
        int failed = 0;
        for (const auto& c : got) {
            const std::string v = c["verdict"].get<std::string>();
            if (v == "PASS" || v == "NOT_SUPPORTED") continue;
            ++failed;
            EXPECT_EQ(v, "FAIL") << lib << " " << c["id"] << ": " << c.value("reason", "");
            EXPECT_NE(c.value("reason", "").find(words), std::string::npos)
                << lib << " " << c["id"] << ": " << c.value("reason", "");
        }
        EXPECT_GT(failed, 0) << lib << ": " << r.out;
    }

    fs::path dir_;
};

// ---- the operation level: `out` of append_attend ----

TEST_F(LentGuards, OneFloatJustBeforeOutFailsEveryCase) {
    expect_every_case("kvcheck_double_reach_out_before", "EQUIV", 8, "FAIL",
                      "wrote 4 bytes before `out` in append_attend", 4);
}

TEST_F(LentGuards, OneFloat320BytesPastOutFailsEveryCase) {
    expect_every_case("kvcheck_double_reach_out_past_320", "EQUIV", 8, "FAIL",
                      "wrote 324 bytes past `out` in append_attend", 4);
}

// Two buffers misused in one call (before `out`, into the const `q`). Served by kvcheck serve-plugin (the default
// isolation) the reply carries both violations, which the case process reports as it reports its own guards'
// findings: every case gets the verdict and the words it gets under fork isolation, where the guards are local.
TEST_F(LentGuards, TwoBuffersMisusedInOneCallGetTheSameWordsServedOrNot) {
    std::map<std::string, std::string> reasons[2];
    for (int forked = 0; forked < 2; ++forked) {
        const Outcome r = run_kvcheck(dir_, "validate " + plugin("kvcheck_double_reach_out_and_q") +
                                                (forked ? " --isolation fork" : "") +
                                                " --filter '^EQUIV/' --cases 6 --shrink-first 0 --report r.json");
        EXPECT_EQ(r.rc, 1) << r.all();
        const nlohmann::json j = nlohmann::json::parse(read_file(dir_ / "r.json"), nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << r.all();
        EXPECT_EQ(j["implementations"][0]["isolation"], forked ? "fork" : "server");
        for (const auto& c : j["implementations"][0]["cases"]) {
            if (c["verdict"] == "NOT_SUPPORTED") continue;
            EXPECT_EQ(c["verdict"], "FAIL") << c.dump();
            const std::string reason = c.value("reason", "");
            EXPECT_TRUE(reason.find("before `out`") != std::string::npos ||
                        reason.find("into `q`") != std::string::npos)
                << reason;
            reasons[forked][c["id"].get<std::string>()] = reason;
        }
    }
    EXPECT_GE(reasons[0].size(), 4u);
    EXPECT_EQ(reasons[0], reasons[1]);
}

TEST_F(LentGuards, AWriteIntoTheProtectedPagesPastOutIsACrashNamingIt) {
    expect_every_case("kvcheck_double_reach_out_rows_past", "EQUIV", 4, "CRASH",
                      "bytes past `out`, into a protected guard page, in append_attend", 2);
}

// ---- the operation level: the arrays create's const config points to ----

// The double sets every scale to 1 and quantizes with that. The graders keep copies of their own, so the bug was
// always a FAIL; what the copy adds is the write itself, named.
TEST_F(LentGuards, WritingIntoTheConfigsScalesIsAFail) {
    expect_failures_only("kvcheck_double_config_scales_writer", "CACHE-CONTENT", 40,
                         "wrote into `k_scales`, a const input, in create");
}

// ---- the model level: logits_out of forward, kvcm_caps of get_caps, the description of create ----

TEST_F(LentGuards, OneFloatJustBeforeTheLogitsFailsEveryModelCase) {
    expect_every_case("kvcheck_model_double_scribble_logits_before", "MODEL-LOGITS", 6, "FAIL",
                      "wrote 4 bytes before `logits_out` in forward", 6);
}

TEST_F(LentGuards, OneFloat320BytesPastTheLogitsFailsEveryModelCase) {
    expect_every_case("kvcheck_model_double_scribble_logits_past_320", "MODEL-LOGITS", 6, "FAIL",
                      "wrote 324 bytes past `logits_out` in forward", 6);
}

// In a heap block's slack the float would go unseen in some cases and crash the case process in others.
TEST_F(LentGuards, OneFloatJustPastTheLogitsFailsEveryModelCase) {
    expect_every_case("kvcheck_model_double_scribble_logits_past_one", "MODEL-LOGITS", 6, "FAIL",
                      "wrote 4 bytes past `logits_out` in forward", 6);
}

TEST_F(LentGuards, AWriteIntoTheProtectedPagesPastTheLogitsIsACrashNamingThem) {
    expect_every_case("kvcheck_model_double_scribble_logits_rows_past", "MODEL-LOGITS", 3, "CRASH",
                      "bytes past `logits_out`, into a protected guard page, in forward", 3);
}

TEST_F(LentGuards, AModelGetCapsWritingPastKvcmCapsIsExit4) {
    const Outcome r =
        run_kvcheck(dir_, "validate " + plugin("kvcheck_model_double_scribble_caps_overrun") + " --cases 1");
    EXPECT_EQ(r.rc, 4) << r.all();
    EXPECT_NE(r.err.find("failed while being loaded"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("wrote 256 bytes past `kvcm_caps` in get_caps"), std::string::npos) << r.err;
}

// The double returns one logit per row once its description says vocab_size 1: a harness that read the description
// back would lend one logit and compare one. The engine gets a copy; the harness sizes and grades by its own.
TEST_F(LentGuards, ARewrittenDescriptionIsAFailAndTheHarnessKeepsItsOwn) {
    for (const char* property : {"MODEL-CHUNK", "MODEL-LOGITS", "MODEL-MEMORY"})
        expect_every_case("kvcheck_model_double_scribble_desc_rewrite", property, 4, "FAIL",
                          "wrote into `kvcm_model_desc`, a const input, in create", 4);
}

} // namespace
