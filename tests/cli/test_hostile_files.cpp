// Files and numbers a hostile user controls (issue 13, items 5-8): kvcheck never reads outside the directory it was
// given, never replaces what is not a regular file, never leaves a half-written or mixed set of files when killed,
// never narrows an integer silently, and never lets a number like 1e400 escape. The real binary runs through the
// shell; KVC_TEST_KVCHECK (environment) runs these tests against another build of it, e.g. an older one, to see
// them fail there. docs/bad-input.md names these tests row by row.
#include "cli_rig.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using namespace kvc::cli_test; // cli_rig.hpp: quote, read_file, Outcome, run_kvcheck
using nlohmann::json;

void spit(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary | std::ios::trunc) << text; }

// A replay document of one small EQUIV case (one 2-token append) that the example passes, with a recorded first
// mismatch written as validate writes one.
json small_replay(const std::string& rope) {
    return {{"kvcheck_replay", 1},
            {"id", "EQUIV/0"},
            {"property", "EQUIV"},
            {"seed", 1},
            {"case",
             {{"config",
               {{"n_layers", 1}, {"n_q_heads", 1}, {"n_kv_heads", 1}, {"head_dim", 4}, {"dtype", "f32"},
                {"rope", rope}, {"block_size_hint", 4}, {"max_seqs", 1}, {"max_tokens", 8}, {"rope_theta", 10000.0},
                {"scale", 0.5}}},
              {"ops", json::array({{{"op", "append"}, {"appends", json::array({{{"seq", 0}, {"n_new", 2}}})}}})},
              {"data_seed", 3}}},
            {"expected_mismatch",
             {{"what", "output"}, {"op", 0}, {"seq", 0}, {"layer", 0}, {"pos", 1}, {"head", 0}, {"dim", 2},
              {"expected", 1.5}, {"actual", 2.0}}}};
}

const char* kResults = R"({"kvcheck_results": 1, "implementation": "none", "pipeline": "f32",
                           "capabilities": ["dtype f32", "dtype f16", "dtype bf16", "rope neox", "rope gptj", "gqa",
                                            "chunked", "fork", "release", "batch"]})";

class HostileFiles : public ::testing::Test {
protected:
    void SetUp() override { dir_ = fresh_test_dir(KVC_HOSTILE_WORK_DIR); }

    // kvcheck in the test's directory, after optional environment assignments ("A=1 ").
    Outcome kvcheck(const std::string& args, const std::string& env = "") { return run_kvcheck(dir_, args, env); }

    // One small export (EQUIV, f32, one case) and an empty results directory with a results manifest: grading it
    // gives ERROR "no results" (exit 1) and writes whatever reports were asked for.
    void vectors_and_results() {
        ASSERT_EQ(kvcheck("export --out v --cases 1 --properties EQUIV --dtypes f32").rc, 0);
        fs::create_directories(dir_ / "r");
        spit(dir_ / "r" / "manifest.json", kResults);
    }

    json manifest() { return json::parse(read_file(dir_ / "v" / "manifest.json")); }
    void set_manifest(const json& m) { spit(dir_ / "v" / "manifest.json", m.dump(1)); }

    // A file outside the vectors directory whose first 8 bytes, read as a header length, give a known number.
    std::string secret() {
        spit(dir_ / "secret.txt", "SECRET-1 the first eight bytes must never be shown");
        uint64_t n = 0;
        const std::string s = "SECRET-1";
        for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(s[static_cast<size_t>(i)]);
        return std::to_string(n);
    }

    bool has_temporaries(const fs::path& d) {
        for (const auto& e : fs::directory_iterator(d)) {
            const std::string n = e.path().filename().string();
            if (n.find(".tmp") != std::string::npos || n.find("kvcheck-tmp") != std::string::npos) return true;
        }
        return false;
    }

    fs::path dir_;
};

// ---- item 5: grade reads only inside the vectors and results directories ----

TEST_F(HostileFiles, GradeRefusesAnAbsoluteInputsPathWithoutShowingTheFile) {
    vectors_and_results();
    const std::string number = secret();
    json m = manifest();
    m["cases"][0]["inputs"] = (dir_ / "secret.txt").string();
    set_manifest(m);
    const Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("absolute path"), std::string::npos) << o.all();
    EXPECT_EQ(o.all().find(number), std::string::npos) << "the file's first bytes were shown: " << o.all();
    EXPECT_EQ(o.all().find("SECRET"), std::string::npos) << o.all();
}

TEST_F(HostileFiles, GradeRefusesDotDotInAnInputsPath) {
    vectors_and_results();
    const std::string number = secret();
    json m = manifest();
    m["cases"][0]["inputs"] = "inputs/../../secret.txt";
    set_manifest(m);
    const Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("\"..\""), std::string::npos) << o.all();
    EXPECT_EQ(o.all().find(number), std::string::npos) << o.all();
}

TEST_F(HostileFiles, GradeRefusesASymbolicLinkLeadingOutOfTheVectors) {
    vectors_and_results();
    const std::string number = secret();
    json m = manifest();
    const std::string inputs = m["cases"][0]["inputs"].get<std::string>();
    fs::remove(dir_ / "v" / inputs);
    fs::create_symlink(dir_ / "secret.txt", dir_ / "v" / inputs);
    const Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("symbolic link"), std::string::npos) << o.all();
    EXPECT_EQ(o.all().find(number), std::string::npos) << o.all();
}

TEST_F(HostileFiles, GradeRefusesAResultsFileThatLinksOutOfTheResults) {
    vectors_and_results();
    const std::string number = secret();
    const std::string stem = manifest()["cases"][0]["file"].get<std::string>();
    fs::create_symlink(dir_ / "secret.txt", dir_ / "r" / (stem + ".safetensors"));
    spit(dir_ / "r" / (stem + ".json"), "{}");
    const Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("symbolic link"), std::string::npos) << o.all();
    EXPECT_EQ(o.all().find(number), std::string::npos) << o.all();
}

// ---- item 7: what is read is a regular file of bounded size ----

// A FIFO would block the reader forever (no writer ever comes); /dev/zero would be read until memory runs out.
TEST_F(HostileFiles, FifosAndDevicesAndHugeFilesAreRefusedWithoutBlocking) {
    vectors_and_results();
    const std::string stem = manifest()["cases"][0]["file"].get<std::string>();
    ASSERT_EQ(::mkfifo((dir_ / "r" / (stem + ".safetensors")).c_str(), 0600), 0);
    spit(dir_ / "r" / (stem + ".json"), "{}");
    const Outcome results = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(results.rc, 2) << results.all();
    EXPECT_NE(results.all().find("not a regular file"), std::string::npos) << results.all();

    fs::rename(dir_ / "v" / "manifest.json", dir_ / "manifest.saved");
    ASSERT_EQ(::mkfifo((dir_ / "v" / "manifest.json").c_str(), 0600), 0);
    const Outcome vectors = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(vectors.rc, 2) << vectors.all();
    EXPECT_NE(vectors.all().find("not a regular file"), std::string::npos) << vectors.all();

    const Outcome zero = kvcheck("export --out w --caps /dev/zero");
    EXPECT_EQ(zero.rc, 2) << zero.all();
    EXPECT_NE(zero.all().find("not a regular file"), std::string::npos) << zero.all();

    { // valid JSON, 65 MiB of it: over the 64 MiB limit of a JSON document
        std::ofstream big(dir_ / "big.json", std::ios::binary);
        big << "{\"capabilities\": []";
        const std::string spaces(1 << 20, ' ');
        for (int i = 0; i < 65; ++i) big << spaces;
        big << "}";
    }
    const Outcome big = kvcheck("export --out w --caps big.json");
    EXPECT_EQ(big.rc, 2) << big.all();
    EXPECT_NE(big.all().find("limit"), std::string::npos) << big.all();
    fs::remove(dir_ / "big.json");
}

// ---- item 5: report targets ----

TEST_F(HostileFiles, AFifoAsReportIsRefusedBeforeGradingAndStaysAFifo) {
    vectors_and_results();
    ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
    const Outcome o = kvcheck("grade --vectors v --results r --report fifo");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("not a regular file"), std::string::npos) << o.all();
    EXPECT_EQ(o.all().find("summary:"), std::string::npos) << "refused only after grading: " << o.all();
    EXPECT_TRUE(fs::is_fifo(fs::symlink_status(dir_ / "fifo")));
}

TEST_F(HostileFiles, ASymbolicLinkAsJunitIsRefusedAndItsTargetUntouched) {
    vectors_and_results();
    spit(dir_ / "precious.txt", "keep me");
    fs::create_symlink(dir_ / "precious.txt", dir_ / "link.xml");
    const Outcome o = kvcheck("grade --vectors v --results r --junit link.xml");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("symbolic link"), std::string::npos) << o.all();
    EXPECT_TRUE(fs::is_symlink(dir_ / "link.xml"));
    EXPECT_EQ(read_file(dir_ / "precious.txt"), "keep me");
}

TEST_F(HostileFiles, ADirectoryAsReportIsRefused) {
    vectors_and_results();
    fs::create_directories(dir_ / "out.json");
    const Outcome o = kvcheck("grade --vectors v --results r --report out.json");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_TRUE(fs::is_directory(dir_ / "out.json"));
}

TEST_F(HostileFiles, ReportAndJunitNamingOneFileAreRefusedByIdentity) {
    vectors_and_results();
    spit(dir_ / "a.json", "old");
    for (const char* other : {"./a.json", "v/../a.json"}) {
        const Outcome o = kvcheck(std::string("grade --vectors v --results r --report a.json --junit ") + other);
        EXPECT_EQ(o.rc, 2) << other << ": " << o.all();
        EXPECT_NE(o.all().find("same file"), std::string::npos) << o.all();
        EXPECT_EQ(read_file(dir_ / "a.json"), "old");
    }
    fs::create_hard_link(dir_ / "a.json", dir_ / "b.xml"); // two names, one file
    const Outcome o = kvcheck("grade --vectors v --results r --report a.json --junit b.xml");
    EXPECT_EQ(o.rc, 2) << o.all();
    fs::remove(dir_ / "a.json");
    fs::remove(dir_ / "b.xml");
    const Outcome absent = kvcheck("grade --vectors v --results r --report n.json --junit ./n.json"); // neither exists
    EXPECT_EQ(absent.rc, 2) << absent.all();
    EXPECT_FALSE(fs::exists(dir_ / "n.json"));
}

TEST_F(HostileFiles, ValidateRefusesAFifoOrSymlinkAsReportBeforeRunning) {
    ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
    spit(dir_ / "precious.txt", "keep me");
    fs::create_symlink(dir_ / "precious.txt", dir_ / "link.json");
    for (const char* args : {"--report fifo", "--junit fifo", "--report link.json"}) {
        const Outcome o = kvcheck(std::string("validate --builtin example --filter '^EQUIV/0$' --timeout 600 ") + args);
        EXPECT_EQ(o.rc, 2) << args << ": " << o.all();
        EXPECT_EQ(o.all().find("verdict table"), std::string::npos) << "refused only after the run: " << o.all();
    }
    EXPECT_TRUE(fs::is_fifo(fs::symlink_status(dir_ / "fifo")));
    EXPECT_EQ(read_file(dir_ / "precious.txt"), "keep me");
}

// A protected (0444) report or JUnit file is refused before the run (exit 2, naming it) and kept, as golden regen
// refuses one: by validate and grade alike, even for root.
TEST_F(HostileFiles, AReadOnlyReportOrJunitIsRefusedBeforeRunning) {
    for (const char* name : {"ro.json", "ro.xml"}) {
        spit(dir_ / name, "protected");
        fs::permissions(dir_ / name, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
    }
    vectors_and_results();
    for (const std::string& command : {std::string("validate --builtin example --filter '^EQUIV/0$' --cases 1"),
                                       std::string("grade --vectors v --results r")})
        for (const std::string& file : {std::string("--report ro.json"), std::string("--junit ro.xml")}) {
            const Outcome o = kvcheck(command + " " + file);
            EXPECT_EQ(o.rc, 2) << command << " " << file << ": " << o.all();
            EXPECT_NE(o.err.find(file.substr(file.find(' ') + 1) + ": is read-only"), std::string::npos) << o.all();
            EXPECT_EQ(o.out.find("verdict table"), std::string::npos) << "refused only after the run: " << o.all();
            EXPECT_EQ(o.out.find("summary:"), std::string::npos) << "refused only after grading: " << o.all();
        }
    EXPECT_EQ(read_file(dir_ / "ro.json"), "protected");
    EXPECT_EQ(read_file(dir_ / "ro.xml"), "protected");
}

// A report path is echoed as everything else from outside is: its control characters escaped ("wrote PATH").
TEST_F(HostileFiles, AReportPathWithControlCharactersIsPrintedEscaped) {
    const std::string name = "r\x1b]0;pwned\x07.json";
    const Outcome o = kvcheck("validate --builtin example --filter '^EQUIV/0$' --cases 1 --report " + quote(name));
    EXPECT_EQ(o.rc, 0) << o.all();
    EXPECT_TRUE(fs::exists(dir_ / name));
    EXPECT_NE(o.out.find("wrote r\\x1b]0;pwned\\x07.json\n"), std::string::npos) << o.out;
    EXPECT_EQ(o.out.find('\x1b'), std::string::npos) << o.out;
    EXPECT_EQ(o.out.find('\x07'), std::string::npos) << o.out;
}

// A directory where the temporary of the atomic write goes (.NAME.kvcheck-tmp) is refused before the run (exit 2,
// naming it), not found after it (exit 3), and left alone.
TEST_F(HostileFiles, ADirectoryWhereTheTemporaryGoesIsRefusedBeforeRunning) {
    fs::create_directories(dir_ / ".report.json.kvcheck-tmp");
    fs::create_directories(dir_ / ".junit.xml.kvcheck-tmp");
    for (const char* args : {"--report report.json", "--junit junit.xml"}) {
        const Outcome o = kvcheck(std::string("validate --builtin example --filter '^EQUIV/0$' --cases 1 ") + args);
        EXPECT_EQ(o.rc, 2) << args << ": " << o.all();
        EXPECT_NE(o.err.find(".kvcheck-tmp is a directory"), std::string::npos) << o.all();
        EXPECT_EQ(o.out.find("verdict table"), std::string::npos) << "refused only after the run: " << o.all();
    }
    EXPECT_TRUE(fs::is_directory(dir_ / ".report.json.kvcheck-tmp"));
    EXPECT_FALSE(fs::exists(dir_ / "report.json"));
}

// Killed (SIGKILL) at every step of writing the pair: each file is the old one or the complete new one, a new XML
// never sits beside an old JSON nor a new JSON beside an old XML, and the next run leaves no temporary.
TEST_F(HostileFiles, KilledAtAnyStepOfWritingTheReportPairLeavesNoMixtureAndNoTemporary) {
    vectors_and_results();
    const std::string args = "grade --vectors v --results r --report g.json --junit g.xml";
    for (int step = 0; step < 6; ++step) {
        spit(dir_ / "g.json", "OLD JSON");
        spit(dir_ / "g.xml", "OLD XML");
        const Outcome o = kvcheck(args, "KVCHECK_TEST_REPORT_KILL_AT=" + std::to_string(step) + " ");
        EXPECT_EQ(o.rc, 128 + 9) << "step " << step << ": the kill hook did not fire: " << o.all();
        const bool has_json = fs::exists(dir_ / "g.json"), has_xml = fs::exists(dir_ / "g.xml");
        const std::string j = has_json ? read_file(dir_ / "g.json") : "", x = has_xml ? read_file(dir_ / "g.xml") : "";
        const bool new_json = has_json && j != "OLD JSON", new_xml = has_xml && x != "OLD XML";
        if (new_json) {
            EXPECT_TRUE(json::accept(j)) << "step " << step << ": a torn JSON report";
            EXPECT_TRUE(new_xml) << "step " << step << ": a new JSON report beside an old or missing XML";
        }
        if (new_xml) {
            EXPECT_NE(x.find("</testsuites>"), std::string::npos) << "step " << step << ": a torn XML";
        }
        if (has_json && !new_json) {
            EXPECT_FALSE(new_xml) << "step " << step << ": an old JSON beside a new XML";
        }
        const Outcome again = kvcheck(args);
        EXPECT_EQ(again.rc, 1) << again.all();
        EXPECT_TRUE(json::accept(read_file(dir_ / "g.json")));
        EXPECT_NE(read_file(dir_ / "g.xml").find("</testsuites>"), std::string::npos);
        EXPECT_FALSE(has_temporaries(dir_)) << "step " << step << ": a temporary survived the next run";
    }
}

TEST_F(HostileFiles, ANormalRunLeavesNoTemporary) {
    vectors_and_results();
    EXPECT_EQ(kvcheck("grade --vectors v --results r --report g.json --junit g.xml").rc, 1);
    EXPECT_TRUE(fs::exists(dir_ / "g.json") && fs::exists(dir_ / "g.xml"));
    EXPECT_FALSE(has_temporaries(dir_));
}

// ---- item 5: export ----

TEST_F(HostileFiles, AKilledReExportLeavesNoManifestOverNewFiles) {
    ASSERT_EQ(kvcheck("export --out v --cases 2 --properties EQUIV --dtypes f32 --seed 1").rc, 0);
    const Outcome killed = kvcheck("export --out v --cases 2 --properties EQUIV --dtypes f32 --seed 2",
                                   "KVCHECK_TEST_EXPORT_KILL_BEFORE_MANIFEST=1 ");
    EXPECT_EQ(killed.rc, 128 + 9) << killed.all();
    EXPECT_FALSE(fs::exists(dir_ / "v" / "manifest.json")) << "the old manifest now indexes new files";
    fs::create_directories(dir_ / "r");
    spit(dir_ / "r" / "manifest.json", kResults);
    const Outcome g = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(g.rc, 2) << g.all();
    EXPECT_NE(g.all().find("manifest.json"), std::string::npos) << g.all();
    EXPECT_FALSE(has_temporaries(dir_ / "v"));
}

TEST_F(HostileFiles, ExportCasesTooLargeIsRefusedAndTheManifestKept) {
    ASSERT_EQ(kvcheck("export --out v --cases 1 --properties EQUIV --dtypes f32").rc, 0);
    const std::string before = read_file(dir_ / "v" / "manifest.json");
    const Outcome o = kvcheck("export --out v --cases 2147483647 --properties EQUIV --dtypes f32");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("--cases"), std::string::npos) << o.all();
    EXPECT_EQ(read_file(dir_ / "v" / "manifest.json"), before);
}

// ---- item 6: numbers ----

// max_head_dim 1 leaves no even head_dim: a RoPE case is drawn with head_dim 2 and refused as outside the limit
// (NOT_SUPPORTED), never drawn with an odd head_dim (which `replay` would refuse and the plugin be blamed for).
TEST_F(HostileFiles, MaxHeadDimOneNeverDrawsRopeWithAnOddHeadDim) {
    spit(dir_ / "caps.json", R"({"capabilities": ["dtype f32", "rope neox", "rope gptj", "gqa", "chunked"],
                                  "limits": {"max_head_dim": 1}})");
    const Outcome o = kvcheck("export --out v --cases 20 --properties EQUIV,CACHE-CONTENT --caps caps.json");
    ASSERT_EQ(o.rc, 0) << o.all();
    const json m = manifest();
    int rope_refused = 0;
    for (const json& c : m["cases"]) {
        EXPECT_LE(c["config"]["head_dim"].get<int>(), 1) << c["id"];
        if (c["config"]["rope"] != "none") {
            EXPECT_EQ(c["config"]["head_dim"].get<int>() % 2, 0) << c["id"];
        }
    }
    for (const json& n : m["not_supported"])
        for (const json& w : n["needs"]) rope_refused += w.get<std::string>().rfind("head_dim 2 > 1", 0) == 0;
    EXPECT_GT(rope_refused, 0) << "no RoPE case was drawn at all: the test proves nothing";
}

TEST_F(HostileFiles, ANumberLike1e400InAManifestIsBadInputNamingTheFile) {
    vectors_and_results();
    std::string text = read_file(dir_ / "v" / "manifest.json");
    const std::string seed = "\"seed\": " + std::to_string(manifest()["seed"].get<uint64_t>());
    ASSERT_NE(text.find(seed), std::string::npos);
    text.replace(text.find(seed), seed.size(), "\"seed\": 1e400");
    spit(dir_ / "v" / "manifest.json", text);
    const Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("v/manifest.json"), std::string::npos) << o.all();
    ASSERT_EQ(kvcheck("export --out v --cases 1 --properties EQUIV --dtypes f32").rc, 0); // a good manifest again
    spit(dir_ / "r" / "manifest.json", R"({"kvcheck_results": 1e400, "implementation": "x", "pipeline": "f32"})");
    const Outcome r = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(r.rc, 2) << r.all();
    EXPECT_NE(r.all().find("r/manifest.json"), std::string::npos) << r.all();
}

TEST_F(HostileFiles, AnIndexOf2To32IsNotNarrowed) {
    vectors_and_results();
    json m = manifest();
    m["cases"][0]["index"] = 4294967296ull;
    set_manifest(m);
    const Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("\"index\""), std::string::npos) << o.all();
}

TEST_F(HostileFiles, ADuplicatedKeyInAManifestIsRefused) {
    vectors_and_results();
    std::string text = read_file(dir_ / "v" / "manifest.json");
    text.insert(text.find('{') + 1, "\"seed\": 7, ");
    spit(dir_ / "v" / "manifest.json", text);
    const Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("appears twice"), std::string::npos) << o.all();
}

// A replay file's sizes of 2^32 and more, a rope_theta that overflows float32, a mismatch coordinate too large for
// int: each is bad input naming the field (exit 2), never a wrapped size run against the implementation.
TEST_F(HostileFiles, ReplayFieldsThatWouldWrapOrOverflowAreBadInput) {
    const json base = small_replay("neox");
    spit(dir_ / "ok.json", base.dump());
    const Outcome ok = kvcheck("replay ok.json --builtin example --timeout 600");
    ASSERT_EQ(ok.rc, 0) << "the unmodified replay file must pass: " << ok.all();
    struct Edit {
        const char* field;
        json::json_pointer where;
        json value;
    };
    const Edit edits[] = {
        {"n_layers", json::json_pointer("/case/config/n_layers"), 4294967297ull},
        {"n_new", json::json_pointer("/case/ops/0/appends/0/n_new"), 4294967296ull},
        {"max_tokens", json::json_pointer("/case/config/max_tokens"), 4294967304ull},
        {"rope_theta", json::json_pointer("/case/config/rope_theta"), 1e300},
        {"scale", json::json_pointer("/case/config/scale"), 1e300},
        {"pos", json::json_pointer("/expected_mismatch/pos"), 2.2e57},
        {"seq", json::json_pointer("/expected_mismatch/seq"), 4294967296ull},
    };
    for (const Edit& e : edits) {
        json doc = base;
        doc[e.where] = e.value;
        spit(dir_ / "bad.json", doc.dump());
        const Outcome o = kvcheck("replay bad.json --builtin example --timeout 600");
        EXPECT_EQ(o.rc, 2) << e.field << ": " << o.all();
        EXPECT_NE(o.all().find(e.field), std::string::npos) << e.field << ": " << o.all();
    }
}

// replay reads through the same bounded, strict reader as every other file (input_file.hpp).
TEST_F(HostileFiles, ReplayRefusesHugeNumbersDevicesFifosAndDuplicateKeys) {
    spit(dir_ / "big.json", R"({"kvcheck_replay": 1, "property": "EQUIV", "seed": 1e400})");
    spit(dir_ / "dup.json", R"({"kvcheck_replay": 1, "kvcheck_replay": 1, "property": "EQUIV"})");
    ASSERT_EQ(::mkfifo((dir_ / "fifo.json").c_str(), 0600), 0);
    for (const char* file : {"big.json", "dup.json", "fifo.json", "/dev/zero"}) {
        const Outcome o = kvcheck(std::string("replay ") + file + " --builtin example --timeout 600");
        EXPECT_EQ(o.rc, 2) << file << ": " << o.all();
        EXPECT_NE(o.all().find(file), std::string::npos) << "the message names the file: " << o.all();
    }
}

// The strict reader's limits (kvcheck/strict_json.hpp) fail fast with exit 2 naming the file and the rule: nesting
// deeper than 128 levels, more than about 4 million values. The 2.4 MB array of {} took minutes and gigabytes with
// the callback parser the readers used before (the time is linear now: fuzz.json.throughput).
TEST_F(HostileFiles, ReplayRefusesDeepNestingAndTooManyValues) {
    spit(dir_ / "deep.json", R"({"kvcheck_replay": 1, "property": "EQUIV", "x": )" + std::string(200, '[') +
                                 std::string(200, ']') + "}");
    std::string many = R"({"kvcheck_replay": 1, "property": "EQUIV", "x": [)";
    for (int i = 0; i < (4 << 20) + 8; ++i) many += i ? ",0" : "0";
    spit(dir_ / "many.json", many + "]}");
    std::string objects = R"({"kvcheck_replay": 1, "property": "EQUIV", "x": [)";
    for (int i = 0; i < 800000; ++i) objects += i ? ",{}" : "{}";
    spit(dir_ / "objects.json", objects + "]}");
    const std::pair<const char*, const char*> cases[] = {
        {"deep.json", "nested deeper than 128 levels"},
        {"many.json", "more than 4194304 values"},
        {"objects.json", "objects.json"}, // parses (linear), then refused as a replay document without a case
    };
    for (const auto& [file, why] : cases) {
        const Outcome o = kvcheck(std::string("replay ") + file + " --builtin example --timeout 600");
        EXPECT_EQ(o.rc, 2) << file << ": " << o.all();
        EXPECT_NE(o.all().find(file), std::string::npos) << "the message names the file: " << o.all();
        EXPECT_NE(o.all().find(why), std::string::npos) << file << ": " << o.all();
    }
}

TEST_F(HostileFiles, ValidateReportAndJunitNamingOneFileAreRefusedByIdentity) {
    const Outcome o = kvcheck("validate --builtin example --filter '^EQUIV/0$' --report a.json --junit ./a.json");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("same file"), std::string::npos) << o.all();
    EXPECT_FALSE(fs::exists(dir_ / "a.json"));
}

TEST_F(HostileFiles, AnUnwritableCounterexamplesDirectoryIsRefusedBeforeRunning) {
    spit(dir_ / "plain-file", "not a directory");
    const Outcome o = kvcheck("validate --builtin example --filter '^EQUIV/0$' --counterexamples plain-file/sub");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("counterexamples"), std::string::npos) << o.all();
    EXPECT_EQ(o.all().find("verdict table"), std::string::npos) << "refused only after the run: " << o.all();
}

// ---- an adversarial review of the CLI (2026-12-05) ----

// A granularity no head_dim the suite draws can meet: every case is listed as not supported, none is generated at
// that size (1,000,000 once took 23 GB of K/V data before the OOM killer ended the export).
TEST_F(HostileFiles, ExportDrawsNoHeadDimFromAGranularityTooLargeToHold) {
    spit(dir_ / "caps.json", R"({"capabilities": ["dtype f32", "rope neox"], "limits": {"head_dim_multiple": 1000000,
                                  "head_dim_multiple_rope": 4294967295}})");
    const Outcome o = kvcheck("export --out v --cases 3 --caps caps.json");
    ASSERT_EQ(o.rc, 0) << o.all();
    const json m = manifest();
    EXPECT_TRUE(m.at("cases").empty()) << m.dump(1);
    EXPECT_FALSE(m.at("not_supported").empty());
    for (const json& r : m.at("not_supported"))
        EXPECT_NE(r.at("needs").dump().find("not a multiple of"), std::string::npos) << r.dump();
}

// Opening a FIFO for reading blocks until someone writes to it: the plugin path is checked without opening it.
TEST_F(HostileFiles, AFifoAsPluginIsRefusedWithoutBlocking) {
    ASSERT_EQ(::mkfifo((dir_ / "f.so").c_str(), 0600), 0);
    for (const std::string& args : {std::string("validate --plugin f.so"), std::string("list --plugin f.so"),
                                    std::string("replay some.json --plugin f.so")}) {
        if (args.rfind("replay", 0) == 0) spit(dir_ / "some.json", R"({"kvcheck_replay": 1, "property": "EQUIV",
            "case": {"config": {"n_layers": 1, "n_q_heads": 1, "n_kv_heads": 1, "head_dim": 4, "dtype": "f32",
            "rope": "none", "block_size_hint": 0, "max_seqs": 2, "max_tokens": 16, "rope_theta": 10000},
            "data_seed": 1, "ops": [{"op": "append", "appends": [{"seq": 0, "n_new": 2}]}]}})");
        const Outcome o = kvcheck(args);
        EXPECT_EQ(o.rc, 2) << args << ": " << o.all();
        EXPECT_NE(o.err.find("not a regular file"), std::string::npos) << args << ": " << o.all();
    }
}

// libstdc++ compiles a regular expression recursively: 20,000 nested groups ended kvcheck with SIGSEGV.
TEST_F(HostileFiles, ADeeplyNestedFilterIsBadInputNotACrash) {
    const auto nested = [](int depth) { return std::string(depth, '(') + "EQUIV" + std::string(depth, ')'); };
    for (const int depth : {20000, 33}) {
        const Outcome o = kvcheck("validate --builtin example --cases 1 --filter " + quote(nested(depth)));
        EXPECT_EQ(o.rc, 2) << depth << ": " << o.all();
        EXPECT_NE(o.err.find("--filter"), std::string::npos) << o.all();
    }
    const Outcome ok = kvcheck("validate --builtin example --cases 1 --filter " + quote(nested(32)));
    EXPECT_EQ(ok.rc, 0) << ok.all();
}

// CLI11 read integers with strtoll's automatic base: --cases 010 ran 8 cases, and export --seed 010 drew seed 8
// where validate --seed 010 drew seed 10.
TEST_F(HostileFiles, NumbersOnTheCommandLineAreDecimal) {
    const Outcome ten = kvcheck("validate --builtin example --cases 010 --filter '^EQUIV/'");
    EXPECT_EQ(ten.rc, 0) << ten.all();
    EXPECT_NE(ten.out.find("(10 cases"), std::string::npos) << ten.all();
    for (const char* args : {"validate --builtin example --cases 0x3 --filter EQUIV",
                             "validate --builtin example --cases 02000000 --filter EQUIV",
                             "export --out w --cases 0b11", "export --out w --seed -1",
                             "export --out w --seed 18446744073709551616", "memory --model llama-2-13b --batch 0x20"}) {
        const Outcome o = kvcheck(args);
        EXPECT_EQ(o.rc, 2) << args << ": " << o.all();
    }
    EXPECT_FALSE(fs::exists(dir_ / "w"));
    ASSERT_EQ(kvcheck("export --out v --cases 02 --seed 010 --properties EQUIV --dtypes f32").rc, 0);
    EXPECT_EQ(manifest().at("seed"), 10);
    EXPECT_EQ(manifest().at("cases_per_property"), 2);
    EXPECT_EQ(kvcheck("memory --model llama-2-13b --batch 032 --tokens 010").out,
              kvcheck("memory --model llama-2-13b --batch 32 --tokens 10").out);
}

// An empty path meant "no report" for --report, "." then a failure after the run for --counterexamples, and "no
// caps" for --caps, each without a word.
TEST_F(HostileFiles, EmptyPathsAreRefused) {
    vectors_and_results();
    for (const char* args : {"validate --builtin example --cases 1 --report ''",
                             "validate --builtin example --cases 1 --junit ''",
                             "validate --builtin example --cases 1 --counterexamples ''",
                             "validate --plugin '' --builtin example", "export --out x --caps ''", "export --out ''",
                             "grade --vectors v --results r --report ''", "grade --vectors v --results ''",
                             "golden verify --dir ''", "list --plugin ''"}) {
        const Outcome o = kvcheck(args);
        EXPECT_EQ(o.rc, 2) << args << ": " << o.all();
        EXPECT_NE(o.err.find("empty path"), std::string::npos) << args << ": " << o.all();
    }
    EXPECT_FALSE(fs::exists(dir_ / "x"));
}

TEST_F(HostileFiles, CounterexamplesNamingTheReportAreRefusedBeforeRunning) {
    for (const char* args : {"--report x.json --counterexamples x.json", "--junit ./x.xml --counterexamples x.xml"}) {
        const Outcome o = kvcheck(std::string("validate --builtin example --filter '^EQUIV/0$' ") + args);
        EXPECT_EQ(o.rc, 2) << args << ": " << o.all();
        EXPECT_NE(o.err.find("same path"), std::string::npos) << o.all();
        EXPECT_EQ(o.all().find("verdict table"), std::string::npos) << "refused only after the run: " << o.all();
    }
    EXPECT_FALSE(fs::exists(dir_ / "x.json"));
    EXPECT_FALSE(fs::exists(dir_ / "x.xml"));
}

// Both manifests are read under the rule every results file follows: a symbolic link must stay inside its directory
// (a manifest elsewhere was graded, and a file's bytes shown in the parse error).
TEST_F(HostileFiles, GradeRefusesAManifestThatLinksOutOfItsDirectory) {
    vectors_and_results();
    spit(dir_ / "secret.txt", R"({"password": "hunter2" x)");
    fs::copy_file(dir_ / "r" / "manifest.json", dir_ / "results-manifest.json");
    fs::remove(dir_ / "r" / "manifest.json");
    fs::create_symlink(dir_ / "secret.txt", dir_ / "r" / "manifest.json");
    Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.err.find("leads out of"), std::string::npos) << o.all();
    EXPECT_EQ(o.all().find("hunter2"), std::string::npos) << o.all();
    fs::remove(dir_ / "r" / "manifest.json");
    fs::create_symlink(dir_ / "results-manifest.json", dir_ / "r" / "manifest.json"); // valid, but elsewhere
    o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    fs::rename(dir_ / "v" / "manifest.json", dir_ / "vectors-manifest.json");
    fs::create_symlink(dir_ / "vectors-manifest.json", dir_ / "v" / "manifest.json");
    fs::remove(dir_ / "r" / "manifest.json");
    spit(dir_ / "r" / "manifest.json", kResults);
    o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.err.find("v/manifest.json"), std::string::npos) << o.all();
}

TEST_F(HostileFiles, GradeRefusesAManifestListingNoCase) {
    vectors_and_results();
    json m = manifest();
    m["cases"] = json::array();
    m["not_supported"] = json::array();
    set_manifest(m);
    const Outcome o = kvcheck("grade --vectors v --results r");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.err.find("lists no case"), std::string::npos) << o.all();
}

// validate exits 3 when its report cannot be written (docs/cli.md); grade said 2.
TEST_F(HostileFiles, GradeExitsThreeWhenTheReportCannotBeWritten) {
    vectors_and_results();
    // a new file in /proc passes what is checked before grading (a read-only one, /proc/version, is refused there);
    // only its temporary fails to be created
    const Outcome o = kvcheck("grade --vectors v --results r --report /proc/kvcheck-report.json");
    EXPECT_EQ(o.rc, 3) << o.all();
    EXPECT_NE(o.err.find("cannot write the report"), std::string::npos) << o.all();
}

TEST_F(HostileFiles, ReplayRefusesALooseSeedAVerdictNameOrAnEmptyScript) {
    const std::string script = R"("case": {"config": {"n_layers": 1, "n_q_heads": 1, "n_kv_heads": 1, "head_dim": 4,
        "dtype": "f32", "rope": "none", "block_size_hint": 0, "max_seqs": 2, "max_tokens": 16, "rope_theta": 10000},
        "data_seed": 1, "ops": OPS})";
    const auto doc = [&](const std::string& fields, const std::string& ops) {
        std::string c = script;
        c.replace(c.find("OPS"), 3, ops);
        return R"({"kvcheck_replay": 1, "property": "EQUIV", )" + fields + c + "}";
    };
    const std::string append = R"([{"op": "append", "appends": [{"seq": 0, "n_new": 2}]}])";
    spit(dir_ / "negative.json", doc(R"("seed": -1, )", append));
    spit(dir_ / "fraction.json", doc(R"("seed": 1.5, )", append));
    spit(dir_ / "verdict.json", doc(R"("verdict": "BOGUS", )", append));
    spit(dir_ / "empty.json", doc("", "[]"));
    for (const char* file : {"negative.json", "fraction.json", "verdict.json", "empty.json"}) {
        const Outcome o = kvcheck(std::string("replay ") + file + " --builtin example");
        EXPECT_EQ(o.rc, 2) << file << ": " << o.all();
        EXPECT_NE(o.err.find(file), std::string::npos) << o.all();
    }
    spit(dir_ / "nul.json", doc("\"id\": \"EQUIV/\\u0000\\u001b[2J\", ", append)); // JSON escapes, not C++ ones
    const Outcome o = kvcheck("replay nul.json --builtin example");
    EXPECT_EQ(o.rc, 0) << o.all();
    EXPECT_EQ(o.out.find('\0'), std::string::npos) << "a NUL reached the terminal";
    EXPECT_EQ(o.out.find('\x1b'), std::string::npos) << "an escape sequence reached the terminal";
}

// ---- text from a file never reaches the terminal as a control sequence (2026-12-05, a probe that put "\x1b[31m"
// into every string and key of every file kvcheck reads) ----

// No byte of a file's text reaches the terminal raw: ESC (0x1b) starts the sequences that recolour, clear or retitle.
void expect_no_escape(const Outcome& o, const std::string& what) {
    EXPECT_EQ(o.all().find('\x1b'), std::string::npos) << what << ": an escape sequence reached the terminal";
}

// The replay file's recorded reason was printed as written (its id already was not), and its first mismatch's
// `what` too; the mismatch is now read as strictly as it is written.
TEST_F(HostileFiles, ReplayPrintsItsRecordedTextsEscapedAndReadsTheMismatchStrictly) {
    json doc = small_replay("none");
    doc["expected_failure"] = "the reason \x1b[31mred\x1b[0m";
    doc["expected_mismatch"]["text"] = "output at op 0";
    spit(dir_ / "reason.json", doc.dump());
    const Outcome shown = kvcheck("replay reason.json --builtin example");
    EXPECT_EQ(shown.rc, 0) << shown.all();
    expect_no_escape(shown, "expected_failure");
    EXPECT_NE(shown.out.find("the reason \\x1b[31mred"), std::string::npos) << shown.all();
    EXPECT_NE(shown.out.find("recorded first mismatch: output at op 0, seq 0, layer 0, position 1, head 0, dim 2"),
              std::string::npos)
        << shown.all();
    struct Edit {
        const char* name;
        std::function<void(json&)> apply;
        const char* says;
    };
    const Edit edits[] = {
        {"an escape in what", [](json& m) { m["what"] = "out\x1b]0;title\x07"; }, "\"what\""},
        {"what not a string", [](json& m) { m["what"] = 7; }, "\"what\""},
        {"what empty", [](json& m) { m["what"] = ""; }, "\"what\""},
        {"what missing", [](json& m) { m.erase("what"); }, "\"what\""},
        {"a coordinate missing", [](json& m) { m.erase("pos"); }, "\"pos\""},
        {"expected missing", [](json& m) { m.erase("expected"); }, "\"expected\""},
        {"text not a string", [](json& m) { m["text"] = 1; }, "\"text\""},
    };
    for (const Edit& e : edits) {
        json bad = doc;
        e.apply(bad["expected_mismatch"]);
        spit(dir_ / "bad.json", bad.dump());
        const Outcome o = kvcheck("replay bad.json --builtin example");
        EXPECT_EQ(o.rc, 2) << e.name << ": " << o.all();
        EXPECT_NE(o.err.find(e.says), std::string::npos) << e.name << ": " << o.all();
        expect_no_escape(o, e.name);
    }
}

// grade's manifests: ids, file stems, names and words are identifiers, and export writes no control character in
// them; one there is refused naming the field. Text quoted in any message (an unknown preset, an unknown op) is
// escaped. Before, the implementation's name and version went raw into the table's heading, an id into its rows.
TEST_F(HostileFiles, GradeRefusesControlCharactersInManifestFieldsAndEscapesWhatItQuotes) {
    vectors_and_results();
    const json results = json::parse(kResults);
    struct Edit {
        const char* name;
        bool results_side;
        std::function<void(json&)> apply;
        std::string says;
    };
    const auto control = [](const char* field) {
        return std::string("field \"") + field + "\" holds a control character (byte 27)";
    };
    const Edit edits[] = {
        {"implementation", true, [](json& r) { r["implementation"] = "impl\x1b[31m"; }, control("implementation")},
        {"version", true, [](json& r) { r["version"] = "1.0\x1b]0;x\x07"; }, control("version")},
        {"pipeline", true, [](json& r) { r["pipeline"] = "f32\x1b[31m"; }, "unknown preset \"f32\\x1b[31m\""},
        {"case id", false, [](json& m) { m["cases"][0]["id"] = "EQUIV/0\x1b[2J"; }, control("id")},
        {"case file", false, [](json& m) { m["cases"][0]["file"] = "EQUIV_0\x1b[2J"; }, control("file")},
        {"an op", false, [](json& m) { m["cases"][0]["case"]["ops"][0]["op"] = "append\x1b[2J"; }, "unknown op"},
    };
    const json vectors = manifest();
    for (const Edit& e : edits) {
        json r = results, v = vectors;
        e.apply(e.results_side ? r : v);
        spit(dir_ / "r" / "manifest.json", r.dump());
        set_manifest(v);
        const Outcome o = kvcheck("grade --vectors v --results r");
        EXPECT_EQ(o.rc, 2) << e.name << ": " << o.all();
        EXPECT_NE(o.err.find(e.says), std::string::npos) << e.name << ": " << o.all();
        expect_no_escape(o, e.name);
    }
}

// golden verify reports a malformed file by quoting its JSON pointer and unknown field; both were printed raw.
TEST_F(HostileFiles, GoldenVerifyEscapesTheFieldsItQuotes) {
    fs::create_directories(dir_ / "g");
    fs::path first;
    for (const auto& entry : fs::directory_iterator(KVC_GOLDEN_DIR))
        if (entry.path().extension() == ".json") {
            fs::copy_file(entry.path(), dir_ / "g" / entry.path().filename());
            if (first.empty() || entry.path().filename() < first) first = entry.path().filename();
        }
    ASSERT_FALSE(first.empty()) << "no golden file in " << KVC_GOLDEN_DIR;
    json doc = json::parse(read_file(dir_ / "g" / first));
    doc["title\x1b[31m"] = doc["title"];
    doc.erase("title");
    spit(dir_ / "g" / first, doc.dump(1));
    const Outcome o = kvcheck("golden verify --dir g");
    EXPECT_EQ(o.rc, 2) << o.all();
    EXPECT_NE(o.all().find("unknown field \"title\\x1b[31m\""), std::string::npos) << o.all();
    expect_no_escape(o, "golden verify");
}

// Two messages that named the wrong thing: `kvcheck bogus` said "A subcommand is required" (CLI11's), and `golden
// regen --dir FILE` said "cannot stat .regen-journal: Not a directory".
TEST_F(HostileFiles, AnUnknownSubcommandAndAPlainFileAsTheGoldenDirectoryAreNamed) {
    const Outcome word = kvcheck("bogus");
    EXPECT_EQ(word.rc, 2) << word.all();
    EXPECT_NE(word.err.find("unknown subcommand \"bogus\""), std::string::npos) << word.all();
    EXPECT_NE(word.err.find("validate"), std::string::npos) << "the subcommands are listed: " << word.all();
    spit(dir_ / "plain", "a file");
    for (const char* sub : {"verify", "regen"}) {
        const Outcome o = kvcheck(std::string("golden ") + sub + " --dir plain");
        EXPECT_EQ(o.rc, 2) << sub << ": " << o.all();
        EXPECT_NE(o.all().find("the golden directory plain is not a directory"), std::string::npos) << sub << ": "
                                                                                                      << o.all();
    }
}

} // namespace
