// The pipe route end to end (docs/protocol.md): the built kvcheck judging plugins through `--connect "kvcheck
// serve-plugin LIB.so"` exactly as through `--plugin LIB.so`, and clients that break the protocol getting a verdict
// that names the request, never a harness crash or hang.
#include "../cli/cli_rig.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

namespace {

using namespace kvc::cli_test;

const fs::path kWork = KVC_PIPE_WORK_DIR;
const std::string kKvcheck = KVC_CLI_BINARY;
const std::string kLib = KVC_LIB_DIR;

// Per property of the report's one implementation: the verdict counts, as JSON text.
std::map<std::string, std::string> counts_by_property(const fs::path& report) {
    const nlohmann::json j = nlohmann::json::parse(read_file(report));
    std::map<std::string, std::string> out;
    for (const auto& p : j.at("implementations").at(0).at("properties")) out[p.at("id")] = p.at("counts").dump();
    return out;
}

// Per case of the report's one implementation: its verdict and, where graded by a bound, its headroom. The same
// arithmetic on the same cases gives the same numbers on both routes.
std::map<std::string, std::string> verdicts_by_case(const fs::path& report) {
    const nlohmann::json j = nlohmann::json::parse(read_file(report));
    std::map<std::string, std::string> out;
    for (const auto& c : j.at("implementations").at(0).at("cases"))
        out[c.at("id")] = c.at("verdict").get<std::string>() + (c.contains("headroom") ? " " + c.at("headroom").dump() : "");
    return out;
}

std::string serve(const std::string& lib) { return kKvcheck + " serve-plugin " + kLib + "/" + lib; }

class Parity : public ::testing::TestWithParam<std::string> {};

// Every case gets the same verdict (and headroom) through the plugin route (the plugin loaded in the grading process:
// fork isolation) and through the pipe route: the protocol carries every capability and config field a plugin can
// declare (windows, fixed parameters, MLA shapes).
TEST_P(Parity, SameVerdictsThroughPluginAndPipe) {
    const fs::path dir = fresh_test_dir(kWork, "parity_");
    const std::string lib = GetParam();
    const std::string common = " --profile core --cases 6 --timeout 20";
    const Outcome a = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + lib) + common + " --isolation fork" +
                                           " --report plugin.json --counterexamples ce-plugin");
    const Outcome b = run_kvcheck(dir, "validate --connect " + quote(serve(lib)) + common +
                                           " --report pipe.json --counterexamples ce-pipe");
    ASSERT_TRUE(a.rc == 0 || a.rc == 1) << a.all();
    EXPECT_EQ(a.rc, b.rc) << b.all();
    EXPECT_EQ(counts_by_property(dir / "plugin.json"), counts_by_property(dir / "pipe.json")) << b.all();
    EXPECT_EQ(verdicts_by_case(dir / "plugin.json"), verdicts_by_case(dir / "pipe.json")) << b.all();
}

INSTANTIATE_TEST_SUITE_P(Doubles, Parity,
                         ::testing::Values("libkvcheck_example.so", "libkvcheck_double_correct.so",
                                           "libkvcheck_double_q_keeper.so", "libkvcheck_double_q_hoarder.so",
                                           "libkvcheck_double_skip_self.so", "libkvcheck_double_rewriter.so",
                                           "libkvcheck_double_misreport.so", "libkvcheck_double_crash.so",
                                           "libkvcheck_double_win_ring.so", "libkvcheck_double_win_plus_one.so",
                                           "libkvcheck_double_win_no_free.so", "libkvcheck_double_pipe_fixed_decl.so",
                                           "libkvcheck_double_pipe_fixed_plain.so", "libkvcheck_double_mla_correct.so",
                                           // ABI 1.3 pipeline rules: carried by the caps reply from protocol 1.5
                                           "libkvcheck_double_pipe_ggml_rules.so",
                                           "libkvcheck_double_pipe_ggml_long16.so",
                                           "libkvcheck_double_mla_v_from_k.so",
                                           "libkvcheck_cpu_engine_plugin.so",
                                           // writes outside what they are lent: serve-plugin guards its buffers
                                           "libkvcheck_double_overrun_out_past.so",
                                           "libkvcheck_double_overrun_memory_past.so",
                                           "libkvcheck_double_overrun_k_out_before.so",
                                           "libkvcheck_double_overrun_length_past.so",
                                           "libkvcheck_double_overrun_writes_q.so",
                                           "libkvcheck_double_overrun_batch_out_past.so",
                                           "libkvcheck_double_reach_out_before.so",
                                           "libkvcheck_double_reach_out_past_320.so",
                                           "libkvcheck_double_reach_out_rows_past.so",
                                           "libkvcheck_double_config_scales_writer.so"),
                         [](const auto& info) {
                             std::string n = info.param.substr(3, info.param.size() - 6);
                             for (char& c : n)
                                 if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                             return n;
                         });

// A failure found through the pipe is shrunk, written as a replay file, and the replay command reproduces it.
TEST(Pipe, ReplayReproducesAFailureThroughThePipe) {
    const fs::path dir = fresh_test_dir(kWork);
    const std::string connect = quote(serve("libkvcheck_double_skip_self.so"));
    const Outcome v = run_kvcheck(dir, "validate --connect " + connect + " --profile core --cases 3 --filter EQUIV");
    ASSERT_EQ(v.rc, 1) << v.all();
    EXPECT_NE(v.out.find("kvcheck replay"), std::string::npos) << v.out;
    EXPECT_NE(v.out.find("--connect"), std::string::npos) << v.out;
    bool replayed = false;
    for (const auto& f : fs::directory_iterator(dir / "kvcheck-counterexamples")) {
        const Outcome r = run_kvcheck(dir, "replay " + quote(f.path().string()) + " --connect " + connect);
        EXPECT_EQ(r.rc, 1) << r.all();
        EXPECT_NE(r.out.find("verdict: FAIL"), std::string::npos) << r.out;
        replayed = true;
        break;
    }
    EXPECT_TRUE(replayed);
}

struct Broken {
    const char* mode;
    const char* verdict; // in the verdict table's EQUIV row: the column that must count the cases
    const char* words;   // in the reason
};

void PrintTo(const Broken& b, std::ostream* os) { *os << b.mode; }

class BrokenClient : public ::testing::TestWithParam<Broken> {};

// A client that breaks the protocol at its first append_attend: the verdict and the words that name the request.
TEST_P(BrokenClient, GetsAVerdictNamingTheRequest) {
    const Broken b = GetParam();
    const fs::path dir = fresh_test_dir(kWork, std::string("broken_") + b.mode + "_");
    const Outcome o = run_kvcheck(dir, "validate --connect " + quote(std::string(KVC_BAD_CLIENT) + " " + b.mode) +
                                           " --profile core --cases 1 --filter EQUIV --timeout 2 --report r.json");
    ASSERT_EQ(o.rc, 1) << o.all();
    const nlohmann::json j = nlohmann::json::parse(read_file(dir / "r.json"));
    const auto& c = j.at("implementations").at(0).at("cases").at(0);
    EXPECT_EQ(c.at("verdict").get<std::string>(), b.verdict) << c.dump();
    EXPECT_NE(c.at("reason").get<std::string>().find(b.words), std::string::npos) << c.dump();
    EXPECT_NE(c.at("reason").get<std::string>().find("append_attend"), std::string::npos) << c.dump();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, BrokenClient,
    ::testing::Values(Broken{"crash", "CRASH", "signal 11"}, Broken{"exit", "CRASH", "exited with status 0"},
                      Broken{"short", "CRASH", "a short frame"}, Broken{"hang", "TIMEOUT", "it hangs"},
                      Broken{"oversized", "ERROR", "length 3221225472"}, Broken{"wrong_length", "ERROR", "exactly"},
                      Broken{"wrong_seq", "ERROR", "request number"}, Broken{"bad_status", "ERROR", "status 99"},
                      Broken{"long_message", "ERROR", "error message of 100000 bytes"},
                      Broken{"garbage", "ERROR", "magic 0x5a5a5a5a"}),
    [](const auto& info) { return std::string(info.param.mode); });

// Bytes written with no request outstanding break the protocol at the next request, which the reason names.
TEST(Pipe, BytesOutOfTurnAreAnError) {
    const fs::path dir = fresh_test_dir(kWork);
    const Outcome o = run_kvcheck(dir, "validate --connect " + quote(std::string(KVC_BAD_CLIENT) + " out_of_turn") +
                                           " --profile core --cases 1 --filter EQUIV --report r.json");
    ASSERT_EQ(o.rc, 1) << o.all();
    const std::string reason =
        nlohmann::json::parse(read_file(dir / "r.json")).at("implementations").at(0).at("cases").at(0).at("reason");
    EXPECT_NE(reason.find("out of turn"), std::string::npos) << reason;
}

// A client speaking protocol 1.2 keeps its frames: its caps and create frames are 1.2's lengths (it exits on any
// other), and what 1.2 cannot carry (windows, a V head dim) is taken off its declaration, so it is never given a
// config it would misread. Create and append_attend then go through; the case ends at its first read_kv, which this
// client does not answer.
TEST(Pipe, AClientSpeaking12GetsThe12Frames) {
    const fs::path dir = fresh_test_dir(kWork);
    const Outcome o = run_kvcheck(dir, "validate --connect " + quote(std::string(KVC_BAD_CLIENT) + " minor_2") +
                                           " --profile core --cases 2 --filter EQUIV --report r.json");
    ASSERT_EQ(o.rc, 1) << o.all();
    const nlohmann::json j = nlohmann::json::parse(read_file(dir / "r.json"));
    const auto& impl = j.at("implementations").at(0);
    for (const auto& c : impl.at("cases"))
        EXPECT_NE(c.at("reason").get<std::string>().find("read_kv failed (UNSUPPORTED)"), std::string::npos)
            << c.dump();
    const auto& features = impl.at("capabilities").at("features");
    EXPECT_EQ(std::find(features.begin(), features.end(), "window"), features.end()) << features.dump();
    EXPECT_EQ(std::find(features.begin(), features.end(), "head_dim_v"), features.end()) << features.dump();
}

// A client that cannot complete the handshake stops the run before any case, with its words (exit 4), and one that
// speaks another major version is refused as bad input (exit 2).
TEST(Pipe, HandshakeFailures) {
    const fs::path dir = fresh_test_dir(kWork);
    const Outcome exited = run_kvcheck(dir, "validate --connect " + quote(std::string(KVC_BAD_CLIENT) + " exit_at_hello"));
    EXPECT_EQ(exited.rc, 4) << exited.all();
    EXPECT_NE(exited.err.find("exited with status 3"), std::string::npos) << exited.err;
    const Outcome garbage =
        run_kvcheck(dir, "validate --connect " + quote(std::string(KVC_BAD_CLIENT) + " garbage_at_hello"));
    EXPECT_EQ(garbage.rc, 4) << garbage.all();
    EXPECT_NE(garbage.err.find("bad reply frame to hello"), std::string::npos) << garbage.err;
    const Outcome major = run_kvcheck(dir, "validate --connect " + quote(std::string(KVC_BAD_CLIENT) + " major_2"));
    EXPECT_EQ(major.rc, 2) << major.all();
    EXPECT_NE(major.err.find("protocol 2.0"), std::string::npos) << major.err;
    const Outcome missing = run_kvcheck(dir, "validate --connect " + quote(serve("no-such-plugin.so")));
    EXPECT_EQ(missing.rc, 2) << missing.all();
    EXPECT_NE(missing.err.find("cannot open the file"), std::string::npos) << missing.err;
    const Outcome both = run_kvcheck(dir, "validate --builtin example --connect true");
    EXPECT_EQ(both.rc, 2) << both.all();
}

} // namespace

// --isolation server: the plugin runs in `kvcheck serve-plugin`, and the case process that grades
// never loads it. A plugin that forges its verdict from inside the grading process (a relay that rewrites FAIL to
// PASS on every pipe it can write to; a hand-made PASS line and exit 0) reaches only the protocol there: its NaN
// outputs are judged, or its garbage breaks the connection. Both forgers end CONFORMANT under fork isolation (seen by
// hand, docs/bad-input.md), which is why this route exists.
struct Forger {
    const char* lib;
    const char* column; // the verdict every EQUIV case must get
};

void PrintTo(const Forger& f, std::ostream* os) { *os << f.lib; }

class ServerIsolation : public ::testing::TestWithParam<Forger> {};

// The default for a host operation-level plugin is server isolation, so a forger ends NOT CONFORMANT without any
// option; under fork isolation, asked for, it forges its PASS (exit 0), which shows the double forges for real and the
// server is what stops it.
TEST_P(ServerIsolation, AForgerEndsNotConformant) {
    const Forger f = GetParam();
    for (const std::string isolation : {"", " --isolation server", " --isolation fork"}) {
        const fs::path dir = fresh_test_dir(kWork, "forger_");
        const Outcome o = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + f.lib) + isolation +
                                               " --profile core --cases 2 --filter EQUIV --timeout 3 --report r.json");
        const bool forked = isolation == " --isolation fork";
        ASSERT_EQ(o.rc, forked ? 0 : 1) << isolation << "\n" << o.all();
        EXPECT_NE(o.out.find(forked ? "isolation: fork" : "isolation: server"), std::string::npos) << o.out;
        const nlohmann::json j = nlohmann::json::parse(read_file(dir / "r.json"));
        const auto& cases = j.at("implementations").at(0).at("cases");
        ASSERT_EQ(cases.size(), 2u) << o.all();
        for (const auto& c : cases) EXPECT_EQ(c.at("verdict"), forked ? "PASS" : f.column) << isolation << o.all();
    }
}

// Forged notes (tests/doubles/note_forger.c: a guard line and the memory limit's "M" on descriptor 3 at every call)
// are words read only beside what they explain: a correct plugin stays CONFORMANT and the words reach no report; one
// that then exits inside the call is a CRASH with its exit status, not the guard's words nor the limit's ERROR.
TEST(ServerIsolationParity, ForgedNotesChangeNoVerdict) {
    const fs::path dir = fresh_test_dir(kWork, "notes_");
    for (const bool exits : {false, true}) {
        const std::string lib = exits ? "libkvcheck_double_notes_then_exit.so" : "libkvcheck_double_notes_then_pass.so";
        const Outcome o = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + lib) +
                                               " --profile core --cases 2 --filter EQUIV --report r.json");
        ASSERT_EQ(o.rc, exits ? 1 : 0) << o.all();
        EXPECT_NE(o.out.find("isolation: server"), std::string::npos) << o.out;
        const std::string report = read_file(dir / "r.json");
        EXPECT_EQ(report.find("forged-buffer"), std::string::npos) << report;
        EXPECT_EQ(report.find("memory limit"), std::string::npos) << report;
        const nlohmann::json j = nlohmann::json::parse(report);
        const auto& cases = j.at("implementations").at(0).at("cases");
        ASSERT_EQ(cases.size(), 2u) << o.all();
        for (const auto& c : cases) {
            EXPECT_EQ(c.at("verdict"), exits ? "CRASH" : "PASS") << c.dump();
            if (exits) {
                EXPECT_NE(c.at("reason").get<std::string>().find("ended the process (exit status 0)"),
                          std::string::npos)
                    << c.dump();
            }
        }
    }
}

// --isolation auto serves what the server can judge: a plugin with either table or both, host or device; a built-in
// (kvcheck's own code) runs in a forked case process.
TEST(ServerIsolationParity, AutoServesPlugins) {
    const fs::path dir = fresh_test_dir(kWork, "server_auto_");
    const auto isolation_of = [&](const std::string& what, const std::string& property = "EQUIV") {
        const Outcome o = run_kvcheck(dir, "validate " + what + " --cases 1 --filter " + property + " --report r.json");
        EXPECT_TRUE(o.rc == 0 || o.rc == 1) << what << "\n" << o.all();
        const nlohmann::json j = nlohmann::json::parse(read_file(dir / "r.json"), nullptr, false);
        return j.is_discarded() ? std::string("(no report)")
                                : j.at("implementations").at(0).at("isolation").get<std::string>();
    };
    EXPECT_EQ(isolation_of("--plugin " + quote(kLib + "/libkvcheck_double_correct.so")), "server");
    EXPECT_EQ(isolation_of("--plugin " + quote(kLib + "/libkvcheck_double_fake_device_honest.so")), "server");
    EXPECT_EQ(isolation_of("--plugin " + quote(kLib + "/libkvcheck_model_double_layer_cache.so"), "MODEL-LOGITS"),
              "server");
    EXPECT_EQ(isolation_of("--plugin " + quote(kLib + "/libkvcheck_model_engine_plugin.so"), "MODEL-LOGITS"),
              "server");
    EXPECT_EQ(isolation_of("--builtin example"), "fork");
}

INSTANTIATE_TEST_SUITE_P(Forgers, ServerIsolation,
                         ::testing::Values(Forger{"libkvcheck_double_relay_forger.so", "TIMEOUT"},
                                           Forger{"libkvcheck_double_line_forger.so", "ERROR"},
                                           Forger{"libkvcheck_double_device_forger.so", "TIMEOUT"}),
                         [](const auto& info) { return std::string(info.param.lib).substr(18, 5); });

// Behind the server every case gets the verdict it gets in the grading process (the guards, NO-Q's mirror and the
// breakdowns carry over): a correct double, a query keeper, a scribbler past `out`, a crash.
TEST(ServerIsolationParity, GivesThePluginRoutesVerdicts) {
    for (const char* lib : {"libkvcheck_double_correct.so", "libkvcheck_double_q_keeper.so",
                            "libkvcheck_double_overrun_out_past.so", "libkvcheck_double_crash.so"}) {
        const fs::path dir = fresh_test_dir(kWork, "server_parity_");
        const std::string common = " --profile core --cases 3 --timeout 20";
        const Outcome a = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + lib) + common +
                                               " --isolation fork --report a.json");
        const Outcome b = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + lib) + common +
                                               " --isolation server --report b.json");
        ASSERT_TRUE(a.rc == 0 || a.rc == 1) << lib << "\n" << a.all();
        EXPECT_EQ(a.rc, b.rc) << lib << "\n" << b.all();
        const auto by_case = verdicts_by_case(dir / "b.json");
        EXPECT_EQ(by_case.size(), 15u) << lib; // 3 cases of each of the 5 core properties
        EXPECT_EQ(verdicts_by_case(dir / "a.json"), by_case) << lib << "\n" << b.all();
        const nlohmann::json j = nlohmann::json::parse(read_file(dir / "b.json"));
        EXPECT_EQ(j.at("implementations").at(0).at("isolation"), "server") << lib;
    }
}

// What the server cannot judge is refused before any case (exit 2), never half judged.
TEST(ServerIsolationParity, RefusesWhatItCannotJudge) {
    const fs::path dir = fresh_test_dir(kWork, "server_refuses_");
    const Outcome builtin = run_kvcheck(dir, "validate --builtin example --isolation server --cases 1");
    EXPECT_EQ(builtin.rc, 2) << builtin.all();
    EXPECT_NE(builtin.err.find("--isolation server serves a plugin"), std::string::npos) << builtin.all();
}

// A failure found behind the server replays behind the server: the rerun and replay lines carry --isolation server,
// and a plugin named by a path relative to the working directory is found there.
TEST(ServerIsolationParity, ReplayReproducesAFailureBehindTheServer) {
    const fs::path dir = fresh_test_dir(kWork, "server_replay_");
    fs::copy_file(kLib + "/libkvcheck_double_overrun_out_past.so", dir / "overrun.so");
    const Outcome v = run_kvcheck(dir, "validate --plugin overrun.so --isolation server --profile core --cases 1"
                                       " --filter EQUIV");
    ASSERT_EQ(v.rc, 1) << v.all();
    EXPECT_NE(v.out.find("wrote 4 bytes past `out` in append_attend"), std::string::npos) << v.out;
    EXPECT_NE(v.out.find("--isolation server"), std::string::npos) << v.out;
    bool replayed = false;
    for (const auto& f : fs::directory_iterator(dir / "kvcheck-counterexamples")) {
        const Outcome r = run_kvcheck(dir, "replay " + quote(f.path().string()) + " --plugin overrun.so --isolation server");
        EXPECT_EQ(r.rc, 1) << r.all();
        EXPECT_NE(r.out.find("verdict: FAIL"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("isolation: server"), std::string::npos) << r.out;
        replayed = true;
    }
    EXPECT_TRUE(replayed);
}

// The model level behind the server (protocol 1.5): the model forgers (tests/doubles/model_forger.c) forge their PASS
// when loaded in the grading process (--isolation fork, exit 0: they really forge), and by default, or with
// --isolation server, their NaN logits are judged where they cannot reach, or their garbage breaks the connection,
// with words that name the request. A library that exports both tables is served whole.
struct ModelForger {
    const char* lib;
    const char* column; // the verdict every MODEL-LOGITS case must get when served
    const char* words;  // in its reason
};

void PrintTo(const ModelForger& f, std::ostream* os) { *os << f.lib; }

class ModelServerIsolation : public ::testing::TestWithParam<ModelForger> {};

TEST_P(ModelServerIsolation, AModelForgerEndsNotConformant) {
    const ModelForger f = GetParam();
    for (const std::string isolation : {"", " --isolation server", " --isolation fork"}) {
        const fs::path dir = fresh_test_dir(kWork, "model_forger_");
        const Outcome o = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + f.lib) + isolation +
                                               " --cases 2 --filter MODEL-LOGITS --timeout 3 --report r.json");
        const bool forked = isolation == " --isolation fork";
        ASSERT_EQ(o.rc, forked ? 0 : 1) << isolation << "\n" << o.all();
        EXPECT_NE(o.out.find(forked ? "isolation: fork" : "isolation: server"), std::string::npos) << o.out;
        const nlohmann::json j = nlohmann::json::parse(read_file(dir / "r.json"));
        const auto& cases = j.at("implementations").at(0).at("cases");
        ASSERT_EQ(cases.size(), 2u) << o.all();
        for (const auto& c : cases) {
            EXPECT_EQ(c.at("verdict"), forked ? "PASS" : f.column) << isolation << o.all();
            if (!forked) {
                EXPECT_NE(c.at("reason").get<std::string>().find(f.words), std::string::npos) << c.dump();
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Forgers, ModelServerIsolation,
    ::testing::Values(ModelForger{"libkvcheck_double_model_relay_forger.so", "TIMEOUT", "reply to model forward"},
                      ModelForger{"libkvcheck_double_model_line_forger.so", "ERROR", "bad reply frame to model"},
                      ModelForger{"libkvcheck_double_both_line_forger.so", "ERROR", "bad reply frame to model"},
                      ModelForger{"libkvcheck_double_both_abi12_forger.so", "ERROR", "bad reply frame to model"}),
    [](const auto& info) { return std::string(info.param.lib).substr(18, 10); });

// Both tables of one library behind one server: the operation level's cases pass (the example cache), the model
// level's forged ones do not, and the report lists both levels.
TEST(ModelServerIsolationParity, BothTablesAreServed) {
    const fs::path dir = fresh_test_dir(kWork, "model_both_");
    const Outcome o = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/libkvcheck_double_both_line_forger.so") +
                                           " --cases 1 --timeout 5 --report r.json");
    ASSERT_EQ(o.rc, 1) << o.all();
    const nlohmann::json j = nlohmann::json::parse(read_file(dir / "r.json"));
    const auto& impl = j.at("implementations").at(0);
    EXPECT_EQ(impl.at("isolation"), "server");
    EXPECT_EQ(impl.at("levels"), nlohmann::json::array({"operation", "model"})) << impl.dump();
    for (const auto& c : impl.at("cases")) {
        const std::string id = c.at("id");
        if (id.rfind("MODEL-", 0) == 0) {
            EXPECT_NE(c.at("verdict"), "PASS") << c.dump();
        } else {
            EXPECT_TRUE(c.at("verdict") == "PASS" || c.at("verdict") == "NOT_SUPPORTED") << c.dump();
        }
    }
}

// Every model-level case gets the same verdict and headroom served (the default) as loaded in the grading process
// (--isolation fork): correct engines, broken arithmetic, a crash, and writes outside the lent logits (before, one
// float past, rows into the protected pages), which serve-plugin's guards catch in its own copies.
class ModelParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelParity, SameVerdictsServedAndForked) {
    const fs::path dir = fresh_test_dir(kWork, "model_parity_");
    const std::string lib = GetParam();
    const std::string common = " --level model --cases 3 --timeout 20";
    const Outcome a = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + lib) + common +
                                           " --isolation fork --report fork.json --counterexamples ce-fork");
    const Outcome b = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + lib) + common +
                                           " --report served.json --counterexamples ce-served");
    ASSERT_TRUE(a.rc == 0 || a.rc == 1) << a.all();
    EXPECT_EQ(a.rc, b.rc) << b.all();
    EXPECT_NE(b.out.find("isolation: server"), std::string::npos) << b.out;
    const auto served = verdicts_by_case(dir / "served.json");
    EXPECT_FALSE(served.empty());
    EXPECT_EQ(verdicts_by_case(dir / "fork.json"), served) << b.all();
}

INSTANTIATE_TEST_SUITE_P(Doubles, ModelParity,
                         ::testing::Values("libkvcheck_model_example_plugin.so", "libkvcheck_model_engine_plugin.so",
                                           "libkvcheck_model_double_layer_cache.so",
                                           "libkvcheck_model_double_rope_reset.so",
                                           "libkvcheck_model_double_wrong_eps.so",
                                           "libkvcheck_model_double_crash_forward.so",
                                           "libkvcheck_model_double_scribble_logits_before.so",
                                           "libkvcheck_model_double_scribble_logits_past_one.so",
                                           "libkvcheck_model_double_scribble_logits_rows_past.so"),
                         [](const auto& info) {
                             std::string n = info.param.substr(3, info.param.size() - 6);
                             for (char& c : n)
                                 if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                             return n;
                         });

// A model-level write outside a lent buffer, served: serve-plugin's guards find it in the copy it lent and the verdict
// names the buffer, as the grading process's own guards would (one float past `logits_out`: a FAIL; rows past it into
// the protected pages: a CRASH whose reason names it).
TEST(ModelServerIsolationParity, AWriteOutsideLogitsIsNamed) {
    const fs::path dir = fresh_test_dir(kWork, "model_lent_");
    const struct {
        const char* lib;
        const char* verdict;
        const char* words;
    } expected[] = {
        {"libkvcheck_model_double_scribble_logits_past_one.so", "FAIL", "past `logits_out` in forward"},
        {"libkvcheck_model_double_scribble_logits_rows_past.so", "CRASH", "`logits_out`"},
    };
    for (const auto& e : expected) {
        const Outcome o = run_kvcheck(dir, "validate --plugin " + quote(kLib + "/" + e.lib) +
                                               " --cases 1 --filter MODEL-LOGITS --timeout 20 --report r.json");
        ASSERT_EQ(o.rc, 1) << e.lib << "\n" << o.all();
        EXPECT_NE(o.out.find("isolation: server"), std::string::npos) << o.out;
        const nlohmann::json j = nlohmann::json::parse(read_file(dir / "r.json"));
        const auto& c = j.at("implementations").at(0).at("cases").at(0);
        EXPECT_EQ(c.at("verdict"), e.verdict) << c.dump();
        EXPECT_NE(c.at("reason").get<std::string>().find(e.words), std::string::npos) << c.dump();
    }
}
