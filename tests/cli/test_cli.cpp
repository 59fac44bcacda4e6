// kvcheck end to end: the built binary run through the shell, its exit status, its output and the files it writes.
// The implementations under test are the built-in example and the test doubles of tests/doubles (one shared library
// per deliberately broken behaviour). docs/cli.md lists these tests under "Guarantees, and the test that shows each".
#include "cli_rig.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace kvc::cli_test; // cli_rig.hpp: quote, read_file, Outcome, run_kvcheck

std::string double_path(const std::string& name) {
    return std::string(KVC_DOUBLES_DIR) + "/libkvcheck_double_" + name + ".so";
}
std::string plugin(const std::string& name) { return "--plugin " + quote(double_path(name)); }

// A fresh directory per test; kvcheck runs with it as working directory.
class Cli : public ::testing::Test {
protected:
    void SetUp() override { dir_ = fresh_test_dir(KVC_CLI_WORK_DIR); }

    Outcome kvcheck(std::string args) { return run_kvcheck(dir_, std::move(args)); }

    fs::path path(const std::string& name) const { return dir_ / name; }

    nlohmann::json json_file(const std::string& name) const {
        const std::string text = read_file(path(name));
        EXPECT_TRUE(nlohmann::json::accept(text)) << name << " is not valid JSON";
        return nlohmann::json::parse(text, nullptr, false);
    }

    fs::path dir_;
};

// ---------------------------------------------------------------------------------------------------------------
// A small XML well-formedness check (balanced tags, quoted attributes, known entities) that also counts elements.

struct XmlCheck {
    bool ok = true;
    std::string problem;
    std::map<std::string, int> elements;
};

XmlCheck check_xml(const std::string& x) {
    XmlCheck r;
    std::vector<std::string> stack;
    const auto fail = [&](const std::string& why) {
        if (r.ok) r.problem = why;
        r.ok = false;
    };
    const auto check_text = [&](const std::string& t) {
        for (std::size_t i = 0; i < t.size(); ++i) {
            if (t[i] == '<' || t[i] == '>') fail("raw < or > in text");
            if (t[i] == '&') {
                const std::size_t semi = t.find(';', i);
                const std::string ent = semi == std::string::npos ? "" : t.substr(i, semi - i + 1);
                if (!std::regex_match(ent, std::regex("&(amp|lt|gt|quot|apos|#[0-9]+|#x[0-9A-Fa-f]+);")))
                    fail("bad entity near: " + t.substr(i, 12));
            }
        }
    };
    std::size_t i = 0;
    if (x.rfind("<?xml", 0) == 0) i = x.find("?>") + 2;
    bool root_seen = false;
    while (i < x.size()) {
        const std::size_t lt = x.find('<', i);
        const std::string text = x.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
        if (stack.empty() && text.find_first_not_of(" \n\r\t") != std::string::npos) fail("text outside the root");
        check_text(text);
        if (lt == std::string::npos) break;
        const std::size_t gt = x.find('>', lt);
        if (gt == std::string::npos) {
            fail("unterminated tag");
            break;
        }
        std::string tag = x.substr(lt + 1, gt - lt - 1);
        if (tag.empty()) fail("empty tag");
        else if (tag[0] == '/') {
            const std::string name = tag.substr(1);
            if (stack.empty() || stack.back() != name) fail("mismatched </" + name + ">");
            else stack.pop_back();
        } else {
            const bool self = tag.back() == '/';
            if (self) tag.pop_back();
            const std::string name = tag.substr(0, tag.find_first_of(" \n\t"));
            const std::string attrs = tag.substr(name.size());
            static const std::regex attr_list(R"((\s+[A-Za-z_:][-A-Za-z0-9_:.]*="[^"<]*")*\s*)");
            if (!std::regex_match(attrs, attr_list)) fail("bad attributes in <" + name + ">");
            check_text(std::regex_replace(attrs, std::regex(R"(="([^"]*)\")"), " $1 "));
            if (stack.empty() && root_seen) fail("second root element");
            root_seen = true;
            ++r.elements[name];
            if (!self) stack.push_back(name);
        }
        i = gt + 1;
    }
    if (!stack.empty()) fail("unclosed <" + stack.back() + ">");
    if (!root_seen) fail("no root element");
    return r;
}

int elements(const XmlCheck& x, const std::string& name) {
    const auto it = x.elements.find(name);
    return it == x.elements.end() ? 0 : it->second;
}

// Cases of a report, by id, with their verdicts.
std::map<std::string, std::string> verdicts_by_id(const nlohmann::json& report) {
    std::map<std::string, std::string> m;
    for (const auto& impl : report.at("implementations"))
        for (const auto& c : impl.at("cases")) m[c.at("id").get<std::string>()] = c.at("verdict").get<std::string>();
    return m;
}

int count_of(const nlohmann::json& report, const std::string& verdict) {
    return report.at("counts").at(verdict).get<int>();
}

// ---------------------------------------------------------------------------------------------------------------
// Conformant implementations

// A plugin for which no case of a core property can run has proven nothing: not conformant, and the table says why.
TEST_F(Cli, NothingRunnableIsNotConformant) {
    const Outcome r = kvcheck("validate " + plugin("declares_nothing") + " --profile core --cases 5");
    EXPECT_EQ(r.rc, 1) << r.all();
    EXPECT_NE(r.out.find("NOT CONFORMANT (core property, no case ran)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("overall: NOT CONFORMANT"), std::string::npos) << r.out;
}

// Cases that need what the implementation does not declare test nothing: they get no verdict, start no process, and
// are counted apart (the table's "outside" column, the report's outside_declaration), so a narrow declaration does not
// show as a wall of NOT_SUPPORTED.
TEST_F(Cli, CasesOutsideTheDeclarationAreCountedApartAndStartNoProcess) {
    const Outcome r = kvcheck("validate " + plugin("declares_nothing") + " --cases 5 --report report.json");
    EXPECT_EQ(r.rc, 1) << r.all();
    EXPECT_NE(r.out.find("(0 cases, 55 outside the declaration; seed"), std::string::npos) << r.out;
    EXPECT_TRUE(std::regex_search(r.out, std::regex("\nBATCH( +0){7} +5 +- +not declared\n"))) << r.out;
    const nlohmann::json rep = json_file("report.json");
    EXPECT_EQ(rep.at("outside_declaration"), 55);
    EXPECT_EQ(rep.at("run").at("case_processes"), 0);
    for (const auto& [verdict, n] : rep.at("counts").items()) EXPECT_EQ(n, 0) << verdict;
    const auto& impl = rep.at("implementations").at(0);
    EXPECT_TRUE(impl.at("cases").empty());
    ASSERT_EQ(impl.at("outside_declaration").size(), 55u);
    EXPECT_EQ(impl.at("outside_declaration").at(0).at("reason"), "needs dtype f32");
    for (const auto& p : impl.at("properties")) EXPECT_EQ(p.at("outside_declaration"), 5) << p.dump();

    // one undeclared feature: its property is "not declared" beside a conformant rest
    const Outcome e = kvcheck("validate --builtin example --filter '^(EQUIV|BATCH)/' --cases 3 --report e.json");
    EXPECT_EQ(e.rc, 0) << e.all();
    EXPECT_NE(e.out.find("overall: CONFORMANT (3 cases: 3 PASS, 3 outside the declaration; seed"), std::string::npos)
        << e.out;
    EXPECT_EQ(json_file("e.json").at("run").at("case_processes"), 3);
}

TEST_F(Cli, CorrectPluginIsConformant) {
    const Outcome r = kvcheck("validate " + plugin("correct") + " --cases 20 --report report.json --junit junit.xml");
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_NE(r.out.find("seed 20261129"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("overall: CONFORMANT"), std::string::npos) << r.out;
    // table rows: property, PASS, then FAIL 0 ..., none outside the declaration, the worst headroom ("-" or
    // "0.123 (ID/N)") and result ok
    for (const char* id : {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "NO-Q", "MEMORY", "GQA"})
        EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string("\n") + id + " +[1-9][0-9]* +0 +[0-9]+ +[0-9]+ +0 +0 +0 +0 +"
                                                        "(-|[0-9.]+ \\([^)]+\\)) +ok\n")))
            << id << "\n" << r.out;
    const nlohmann::json rep = json_file("report.json");
    EXPECT_TRUE(rep.at("conformant").get<bool>());
    EXPECT_EQ(rep.at("exit_code"), 0);
    EXPECT_EQ(rep.at("run").at("seed"), 20261129u);
    EXPECT_EQ(count_of(rep, "FAIL") + count_of(rep, "ERROR") + count_of(rep, "CRASH") + count_of(rep, "TIMEOUT"), 0);
    EXPECT_GT(count_of(rep, "PASS"), 0);
    EXPECT_FALSE(fs::exists(path("kvcheck-counterexamples"))) << "nothing failed, so no replay files";
    const XmlCheck x = check_xml(read_file(path("junit.xml")));
    EXPECT_TRUE(x.ok) << x.problem;
    EXPECT_EQ(x.elements.count("failure"), 0u);
    EXPECT_EQ(x.elements.count("error"), 0u);
}

TEST_F(Cli, BuiltinExampleIsConformant) {
    const Outcome r = kvcheck("validate --builtin example --cases 20 --report report.json");
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_NE(r.out.find("overall: CONFORMANT"), std::string::npos) << r.out;
    const nlohmann::json rep = json_file("report.json");
    EXPECT_EQ(rep.at("implementations").at(0).at("origin"), "builtin:example");
    EXPECT_TRUE(rep.at("implementations").at(0).at("capabilities").contains("features"));
}

// ---------------------------------------------------------------------------------------------------------------
// Each broken double is caught by the property it was built to break, and that property is named.

class CliDoubles : public Cli {
protected:
    void caught(const std::string& name, const std::string& property, int cases) {
        const Outcome r = kvcheck("validate " + plugin(name) + " --filter '^" + property + "/' --cases " +
                              std::to_string(cases) + " --report report.json");
        const nlohmann::json rep = json_file("report.json");
        EXPECT_EQ(r.rc, 1) << r.all();
        EXPECT_NE(r.out.find("FAIL " + property + "/"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("first mismatch:"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("replay: kvcheck replay"), std::string::npos) << r.out;
        EXPECT_TRUE(std::regex_search(r.out, std::regex("\n" + property + " .*NOT CONFORMANT\n"))) << r.out;
        EXPECT_NE(r.out.find("overall: NOT CONFORMANT"), std::string::npos) << r.out;
        int failed = 0;
        for (const auto& c : rep.at("implementations").at(0).at("cases")) {
            EXPECT_EQ(c.at("property"), property);
            if (c.at("verdict") != "FAIL") continue;
            ++failed;
            EXPECT_EQ(c.at("failed_property"), property);
            EXPECT_TRUE(c.contains("counterexample"));
            EXPECT_TRUE(c.contains("mismatch"));
            EXPECT_TRUE(fs::exists(path(c.at("replay_file").get<std::string>())));
        }
        EXPECT_GT(failed, 0);
    }
};

TEST_F(CliDoubles, QKeeperFailsNoQ) { caught("q_keeper", "NO-Q", 20); }
TEST_F(CliDoubles, RewriterFailsAppendOnly) { caught("rewriter", "APPEND-ONLY", 20); }
TEST_F(CliDoubles, SkipSelfFailsEquiv) { caught("skip_self", "EQUIV", 20); }
TEST_F(CliDoubles, TileFailsGqa) { caught("tile", "GQA", 20); }
TEST_F(CliDoubles, MisreportFailsMemory) { caught("misreport", "MEMORY", 20); }

TEST_F(Cli, CrashingPluginGivesCrashVerdictsAndTheRunGoesOn) {
    const Outcome r = kvcheck("validate " + plugin("crash") + " --cases 10 --report report.json --junit junit.xml");
    EXPECT_EQ(r.rc, 1) << r.all();
    EXPECT_NE(r.out.find("CRASH "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("SIGSEGV"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("verdict table"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("overall: NOT CONFORMANT"), std::string::npos) << r.out;
    const nlohmann::json rep = json_file("report.json");
    EXPECT_GT(count_of(rep, "CRASH"), 0);
    EXPECT_GT(count_of(rep, "PASS"), 0) << "cases after a crash still run, in fresh processes";
    EXPECT_EQ(count_of(rep, "FAIL"), 0);
    for (const auto& c : rep.at("implementations").at(0).at("cases"))
        if (c.at("verdict") == "CRASH") {
            EXPECT_NE(c.at("reason").get<std::string>().find("SIGSEGV"), std::string::npos);
            EXPECT_TRUE(c.contains("counterexample"));
        }
    const XmlCheck x = check_xml(read_file(path("junit.xml")));
    EXPECT_TRUE(x.ok) << x.problem;
    EXPECT_GT(elements(x, "error"), 0);
    EXPECT_NE(read_file(path("junit.xml")).find("type=\"CRASH\""), std::string::npos);
}

TEST_F(Cli, CrashReplaysAsCrash) {
    const Outcome r = kvcheck("validate " + plugin("crash") + " --filter '^EQUIV/' --cases 10 --report report.json");
    ASSERT_EQ(r.rc, 1) << r.all();
    std::string file;
    const nlohmann::json rep = json_file("report.json");
    for (const auto& c : rep.at("implementations").at(0).at("cases"))
        if (c.at("verdict") == "CRASH" && file.empty()) file = c.at("replay_file").get<std::string>();
    ASSERT_FALSE(file.empty());
    const Outcome again = kvcheck("replay " + quote(file) + " " + plugin("crash"));
    EXPECT_EQ(again.rc, 1) << again.all();
    EXPECT_NE(again.out.find("verdict: CRASH"), std::string::npos) << again.out;
    const Outcome fixed = kvcheck("replay " + quote(file) + " " + plugin("correct"));
    EXPECT_EQ(fixed.rc, 0) << fixed.all();
}

// The only test that depends on time: the per-case timeout itself (2 s; the hang double sleeps forever).
TEST_F(Cli, HangingPluginGivesTimeout) {
    const Outcome r = kvcheck("validate " + plugin("hang") + " --filter '^EQUIV/' --cases 3 --timeout 2 "
                          "--report report.json");
    EXPECT_EQ(r.rc, 1) << r.all();
    EXPECT_NE(r.out.find("TIMEOUT EQUIV/"), std::string::npos) << r.out;
    const nlohmann::json rep = json_file("report.json");
    EXPECT_GT(count_of(rep, "TIMEOUT"), 0);
    EXPECT_EQ(count_of(rep, "CRASH"), 0);
    EXPECT_EQ(rep.at("implementations").at(0).at("cases").size(), 3u);
}

// A cache that reads one slot past its end into NaN-poisoned memory: its NaN outputs are a FAIL of EQUIV with
// coordinates, never an ERROR; the NaN is spelled "NaN" in the report, the JUnit text and the replay file, and the
// replay file fails again.
TEST_F(Cli, NanOutputIsAFailNotAnError) {
    const Outcome r = kvcheck("validate " + plugin("read_past_end") +
                              " --filter '^EQUIV/' --cases 20 --report report.json --junit junit.xml");
    ASSERT_EQ(r.rc, 1) << r.all();
    EXPECT_NE(r.out.find("FAIL EQUIV/"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("reason: NaN in the output (token "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(", got NaN"), std::string::npos) << r.out;
    const std::string text = read_file(path("report.json"));
    EXPECT_NE(text.find("\"actual\": \"NaN\""), std::string::npos) << "the NaN is spelled as documented";
    const nlohmann::json rep = json_file("report.json");
    EXPECT_GT(count_of(rep, "FAIL"), 0);
    EXPECT_EQ(count_of(rep, "ERROR"), 0);
    std::string file;
    int nan_cases = 0;
    for (const auto& c : rep.at("implementations").at(0).at("cases")) {
        if (c.at("verdict") != "FAIL") continue;
        EXPECT_EQ(c.at("failed_property"), "EQUIV");
        const auto& m = c.at("mismatch");
        // a call's earlier new tokens read the next new row (finite, wrong); only the last one reads the NaN slack
        // row, and EQUIV grades a sample of a long call's rows: a case may fail on a finite value
        if (c.at("reason").get<std::string>().rfind("NaN in the output", 0) != 0) continue;
        ++nan_cases;
        EXPECT_EQ(m.at("actual"), "NaN") << m.dump();
        EXPECT_TRUE(m.at("expected").is_number()) << m.dump();
        for (const char* k : {"op", "seq", "layer", "pos", "head", "dim"}) EXPECT_GE(m.at(k).get<int>(), 0) << k;
        if (file.empty()) file = c.at("replay_file").get<std::string>();
    }
    EXPECT_GT(nan_cases, 0) << "no FAIL was a NaN";
    const std::string xml = read_file(path("junit.xml"));
    const XmlCheck x = check_xml(xml);
    EXPECT_TRUE(x.ok) << x.problem;
    EXPECT_EQ(elements(x, "failure"), count_of(rep, "FAIL"));
    EXPECT_NE(xml.find("got NaN"), std::string::npos);

    ASSERT_FALSE(file.empty());
    const nlohmann::json doc = json_file(file);
    EXPECT_EQ(doc.at("expected_mismatch").at("actual"), "NaN") << doc.dump(2);
    const Outcome again = kvcheck("replay " + quote(file) + " " + plugin("read_past_end"));
    EXPECT_EQ(again.rc, 1) << again.all();
    EXPECT_NE(again.out.find("verdict: FAIL"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("recorded first mismatch: output"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("reason: NaN in the output"), std::string::npos) << again.out;
    const Outcome fixed = kvcheck("replay " + quote(file) + " " + plugin("correct"));
    EXPECT_EQ(fixed.rc, 0) << fixed.all();
}

// A broken implementation's verdict is fast: by default only the first 3 failures of each property are shrunk; the
// others are reported as generated, with a note. --shrink-first changes the count (0: none, all: every one).
TEST_F(Cli, OnlyTheFirstFailuresOfEachPropertyAreShrunk) {
    const std::string base = "validate " + plugin("skip_self") + " --filter '^(EQUIV|GQA)/' --cases 30";
    const auto unshrunk = [](const nlohmann::json& c) {
        for (const auto& n : c.at("notes"))
            if (n.get<std::string>().rfind("not shrunk", 0) == 0) return true;
        return false;
    };
    // per property: {FAIL cases, FAIL cases reported unshrunk}
    const auto tally = [&](const nlohmann::json& rep) {
        std::map<std::string, std::pair<int, int>> t;
        for (const auto& c : rep.at("implementations").at(0).at("cases")) {
            if (c.at("verdict") != "FAIL") continue;
            auto& [fails, plain] = t[c.at("property").get<std::string>()];
            ++fails;
            if (unshrunk(c)) {
                ++plain;
                EXPECT_EQ(c.at("shrink_steps"), 0) << c.at("id");
                EXPECT_TRUE(c.contains("counterexample")) << c.at("id");
                EXPECT_TRUE(c.contains("mismatch")) << c.at("id");
                EXPECT_TRUE(fs::exists(path(c.at("replay_file").get<std::string>()))) << c.at("id");
            } else {
                EXPECT_EQ(plain, 0) << c.at("id") << ": shrunk after an unshrunk one; the first ones are shrunk";
            }
        }
        return t;
    };

    const Outcome r = kvcheck(base + " --report default.json");
    ASSERT_EQ(r.rc, 1) << r.all();
    const nlohmann::json def = json_file("default.json");
    EXPECT_EQ(def.at("run").at("shrink_first"), 3);
    const auto by_default = tally(def);
    ASSERT_EQ(by_default.size(), 2u) << "both properties fail";
    int shrunk_somewhere = 0;
    for (const auto& [property, t] : by_default) {
        ASSERT_GT(t.first, 3) << property << ": the test needs more than 3 failures of each property";
        EXPECT_EQ(t.first - t.second, 3) << property << ": exactly the first 3 failures are shrunk";
    }
    for (const auto& c : def.at("implementations").at(0).at("cases"))
        if (c.at("verdict") == "FAIL" && c.at("shrink_steps").get<int>() > 0) ++shrunk_somewhere;
    EXPECT_GT(shrunk_somewhere, 0) << "shrinking still happens for the first failures";
    EXPECT_TRUE(std::regex_search(r.out, std::regex("\n[0-9]+ failures were reported unshrunk")))
        << "the run says that some were not shrunk\n" << r.out;

    const Outcome none = kvcheck(base + " --shrink-first 0 --report none.json");
    ASSERT_EQ(none.rc, 1) << none.all();
    EXPECT_NE(none.out.find("counterexample (not shrunk;"), std::string::npos) << none.out;
    for (const auto& [property, t] : tally(json_file("none.json"))) EXPECT_EQ(t.first, t.second) << property;
    ASSERT_EQ(kvcheck(base + " --shrink-first all --report all.json").rc, 1);
    const nlohmann::json all = json_file("all.json");
    EXPECT_EQ(all.at("run").at("shrink_first"), "all");
    for (const auto& [property, t] : tally(all)) EXPECT_EQ(t.second, 0) << property;
    // the verdicts do not depend on shrinking, case for case
    EXPECT_EQ(verdicts_by_id(def), verdicts_by_id(all));
    EXPECT_EQ(verdicts_by_id(def), verdicts_by_id(json_file("none.json")));
}

// Every count column of the verdict table is as wide as the longest verdict name (QUALITY_WARNING, 15 characters),
// so columns line up whatever the counts, from one run to the next.
TEST_F(Cli, VerdictTableCountColumnsHaveOneFixedWidth) {
    const Outcome r = kvcheck("validate " + plugin("skip_self") + " --filter '^(EQUIV|GQA)/' --cases 12");
    ASSERT_EQ(r.rc, 1) << r.all();
    std::istringstream lines(r.out.substr(r.out.find("\nverdict table")));
    std::vector<std::string> table;
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("property ", 0) == 0 || line.rfind("EQUIV ", 0) == 0 || line.rfind("GQA ", 0) == 0)
            table.push_back(line);
    ASSERT_EQ(table.size(), 3u) << r.out;
    // where each verdict name ends in the header: right-aligned counts end there too
    std::vector<std::size_t> ends;
    for (const char* v : {"PASS", "FAIL", "NOT_SUPPORTED", "QUALITY_WARNING", "ERROR", "CRASH", "TIMEOUT", "outside"}) {
        const std::size_t at = table[0].find(std::string(" ") + v + " ");
        ASSERT_NE(at, std::string::npos) << v << "\n" << table[0];
        ends.push_back(at + 1 + std::string(v).size());
    }
    for (std::size_t i = 1; i < ends.size(); ++i) EXPECT_EQ(ends[i] - ends[i - 1], 17u) << "15 wide, 2 apart\n" << r.out;
    for (std::size_t row = 1; row < table.size(); ++row)
        for (std::size_t end : ends) {
            ASSERT_LT(end, table[row].size()) << table[row];
            EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(table[row][end - 1])) && table[row][end] == ' ')
                << "a count ends under its header's last letter\n" << r.out;
        }
}

// The worst headroom of each property, with the case holding it: a column of the verdict table and the
// properties' worst_headroom in the JSON report, both agreeing with the cases' own headroom.
TEST_F(Cli, WorstHeadroomOfEachPropertyIsInTheTableAndTheReport) {
    const Outcome r = kvcheck("validate --builtin example --filter '^(EQUIV|APPEND-ONLY)/' --cases 6 "
                              "--report report.json");
    ASSERT_EQ(r.rc, 0) << r.all();
    const nlohmann::json rep = json_file("report.json");
    const auto& impl = rep.at("implementations").at(0);
    const std::string table = r.out.substr(r.out.find("\nverdict table"));
    EXPECT_NE(table.find("worst headroom"), std::string::npos) << table;
    int graded = 0;
    for (const auto& p : impl.at("properties")) {
        const std::string id = p.at("id");
        ASSERT_TRUE(p.contains("worst_headroom")) << p.dump();
        double worst = -1;
        std::string holder;
        for (const auto& c : impl.at("cases")) {
            const std::string v = c.at("verdict");
            if (c.at("property") != id || (v != "PASS" && v != "QUALITY_WARNING")) continue;
            const double h = c.at("headroom").get<double>();
            if (h > 0 && h > worst) {
                worst = h;
                holder = c.at("id");
            }
        }
        const std::size_t row = table.find("\n" + id + " ");
        ASSERT_NE(row, std::string::npos) << table;
        const std::string line = table.substr(row + 1, table.find('\n', row + 1) - row - 1);
        if (worst < 0) {
            EXPECT_TRUE(p.at("worst_headroom").is_null()) << p.dump();
            EXPECT_NE(line.find("  -  "), std::string::npos) << line;
            continue;
        }
        ++graded;
        EXPECT_DOUBLE_EQ(p.at("worst_headroom").at("value").get<double>(), worst) << p.dump();
        EXPECT_EQ(p.at("worst_headroom").at("case"), holder) << p.dump();
        EXPECT_NE(line.find("(" + holder + ")"), std::string::npos) << line;
    }
    EXPECT_GE(graded, 1) << "EQUIV grades outputs: some case uses part of its bound\n" << r.out;
}

// ---------------------------------------------------------------------------------------------------------------
// Plugins that cannot be loaded: a clear message, exit 2, and no report file (not even a partial one).

class CliUnloadable : public Cli {
protected:
    void refused(const std::string& plugin_path, const std::string& message) {
        const Outcome r = kvcheck("validate --plugin " + quote(plugin_path) + " --report report.json --junit junit.xml");
        EXPECT_EQ(r.rc, 2) << r.all();
        EXPECT_NE(r.err.find(message), std::string::npos) << r.all();
        EXPECT_FALSE(fs::exists(path("report.json")));
        EXPECT_FALSE(fs::exists(path(".report.json.kvcheck-tmp")));
        EXPECT_FALSE(fs::exists(path("junit.xml")));
    }
};

TEST_F(CliUnloadable, TextFileIsNotASharedLibrary) {
    std::ofstream(path("notes.so")) << "this is a text file, not a shared library\n";
    refused(path("notes.so").string(), "not a loadable shared library");
}
TEST_F(CliUnloadable, LibraryWithoutEntrySymbol) { refused(double_path("no_entry"), "no exported symbol kvcheck_plugin_entry"); }
TEST_F(CliUnloadable, NewerAbiMajorVersion) { refused(double_path("newer_abi"), "ABI major version 2"); }
TEST_F(CliUnloadable, MissingFile) { refused(path("does-not-exist.so").string(), "cannot open"); }

// ---------------------------------------------------------------------------------------------------------------
// Reports

TEST_F(Cli, JsonAndJunitReportsAreValidAndAgree) {
    const Outcome r = kvcheck("validate " + plugin("skip_self") +
                          " --profile full --cases 6 --report report.json --junit junit.xml");
    ASSERT_EQ(r.rc, 1) << r.all();
    EXPECT_NE(r.out.find("wrote report.json"), std::string::npos);
    const nlohmann::json rep = json_file("report.json");
    EXPECT_EQ(rep.at("kvcheck_report"), 1);
    for (const char* k : {"tool", "suite_version", "abi", "run", "implementations", "counts", "conformant"})
        EXPECT_TRUE(rep.contains(k)) << k;
    const auto& impl = rep.at("implementations").at(0);
    for (const char* k : {"name", "origin", "abi", "capabilities", "cases", "properties"})
        EXPECT_TRUE(impl.contains(k)) << k;
    EXPECT_EQ(impl.at("capabilities").at("precision"), "f32");
    EXPECT_EQ(impl.at("capabilities").at("memory_space"), "host");
    for (const auto& c : impl.at("cases"))
        for (const char* k : {"id", "property", "verdict", "reason", "headroom", "notes"}) EXPECT_TRUE(c.contains(k)) << k;

    const std::string xml = read_file(path("junit.xml"));
    const XmlCheck x = check_xml(xml);
    ASSERT_TRUE(x.ok) << x.problem << "\n" << xml;
    EXPECT_EQ(x.elements.at("testsuites"), 1);
    EXPECT_EQ(x.elements.at("testcase"), static_cast<int>(impl.at("cases").size()));
    EXPECT_EQ(elements(x, "failure"), count_of(rep, "FAIL"));
    EXPECT_EQ(elements(x, "skipped"), count_of(rep, "NOT_SUPPORTED"));
    EXPECT_GT(elements(x, "failure"), 0);
    // the double does not declare batch: BATCH's cases lie outside the declaration, no test case and no verdict
    EXPECT_GT(rep.at("outside_declaration").get<int>(), 0);
    EXPECT_EQ(impl.at("outside_declaration").size(), rep.at("outside_declaration").get<std::size_t>());
    for (const auto& c : impl.at("outside_declaration")) EXPECT_EQ(c.at("property"), "BATCH") << c.dump();
    EXPECT_EQ(xml.find("BATCH/"), std::string::npos) << xml;
    int properties_with_cases = 0; // a testsuite per property that has a case with a verdict
    for (const auto& p : impl.at("properties"))
        for (const auto& [verdict, n] : p.at("counts").items())
            if (n.get<int>() > 0) {
                ++properties_with_cases;
                break;
            }
    EXPECT_EQ(x.elements.at("testsuite"), properties_with_cases);
    EXPECT_NE(xml.find("<testsuite name=\"EQUIV\""), std::string::npos);
}

TEST_F(Cli, SameSeedGivesTheSameReport) {
    ASSERT_EQ(kvcheck("validate " + plugin("correct") + " --cases 5 --report a.json").rc, 0);
    ASSERT_EQ(kvcheck("validate " + plugin("correct") + " --cases 5 --report b.json").rc, 0);
    ASSERT_EQ(kvcheck("validate " + plugin("correct") + " --cases 5 --seed 7 --report c.json").rc, 0);
    EXPECT_EQ(read_file(path("a.json")), read_file(path("b.json")));
    EXPECT_NE(read_file(path("a.json")), read_file(path("c.json")));
    EXPECT_EQ(json_file("c.json").at("run").at("seed"), 7);
}

TEST_F(Cli, ShardsCoverTheCaseListExactlyOnce) {
    const std::string base = "validate " + plugin("correct") + " --profile core --cases 7";
    ASSERT_EQ(kvcheck(base + " --report all.json").rc, 0);
    ASSERT_EQ(kvcheck(base + " --shard 0/2 --report s0.json").rc, 0);
    ASSERT_EQ(kvcheck(base + " --shard 1/2 --report s1.json").rc, 0);
    const auto all = verdicts_by_id(json_file("all.json"));
    const auto s0 = verdicts_by_id(json_file("s0.json"));
    const auto s1 = verdicts_by_id(json_file("s1.json"));
    EXPECT_FALSE(s0.empty());
    EXPECT_FALSE(s1.empty());
    std::map<std::string, std::string> both = s0;
    for (const auto& [id, v] : s1) EXPECT_TRUE(both.emplace(id, v).second) << id << " is in both shards";
    EXPECT_EQ(both, all) << "the shards together are the unsharded run, case for case";
    EXPECT_EQ(json_file("s1.json").at("run").at("shard").at("index"), 1);
    for (const char* bad : {"2/2", "1/0", "x", "1/2/3", "-1/2"}) {
        const Outcome r = kvcheck(base + " --shard '" + std::string(bad) + "'");
        EXPECT_EQ(r.rc, 2) << bad << "\n" << r.all();
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Replay

TEST_F(Cli, ReplayOfACounterexampleReproducesTheFailure) {
    const Outcome r = kvcheck("validate " + plugin("skip_self") + " --filter '^EQUIV/' --cases 10 --report report.json");
    ASSERT_EQ(r.rc, 1) << r.all();
    std::string file, reason;
    const nlohmann::json rep = json_file("report.json");
    for (const auto& c : rep.at("implementations").at(0).at("cases"))
        if (c.at("verdict") == "FAIL" && file.empty()) {
            file = c.at("replay_file").get<std::string>();
            reason = c.at("reason").get<std::string>();
        }
    ASSERT_FALSE(file.empty());
    EXPECT_EQ(fs::path(file).parent_path().filename(), "kvcheck-counterexamples");
    const nlohmann::json doc = json_file(file);
    EXPECT_EQ(doc.at("kvcheck_replay"), 1);
    EXPECT_EQ(doc.at("property"), "EQUIV");

    const Outcome again = kvcheck("replay " + quote(file) + " " + plugin("skip_self"));
    EXPECT_EQ(again.rc, 1) << again.all();
    EXPECT_NE(again.out.find("verdict: FAIL"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("reason: " + reason), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("first mismatch:"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find("config:"), std::string::npos) << "the case in readable terms\n" << again.out;

    const Outcome fixed = kvcheck("replay " + quote(file) + " " + plugin("correct"));
    EXPECT_EQ(fixed.rc, 0) << fixed.all();
    EXPECT_NE(fixed.out.find("verdict: PASS"), std::string::npos) << fixed.out;
}

TEST_F(Cli, MalformedReplayFileIsBadInput) {
    std::ofstream(path("garbage.json")) << "{ this is not json";
    std::ofstream(path("other.json")) << R"({"hello": 1})";
    std::ofstream(path("unknown.json")) << R"({"kvcheck_replay": 1, "property": "NOPE", "case": {}})";
    std::ofstream(path("badcase.json"))
        << R"({"kvcheck_replay": 1, "property": "EQUIV", "case": {"config": {"n_layers": 1}, "ops": []}})";
    // numbers no cache could take, and scripts no cache could run: refused before any child starts
    const std::string cfg = R"("config": {"n_layers": 1, "n_q_heads": 1, "n_kv_heads": 1, "head_dim": 4, "dtype": "f32",
                                 "rope": "none", "block_size_hint": 0, "max_seqs": MAXSEQS, "max_tokens": 16,
                                 "rope_theta": 10000}, "data_seed": 1)";
    const auto replay_doc = [&](const std::string& max_seqs, const std::string& ops) {
        std::string c = cfg;
        c.replace(c.find("MAXSEQS"), 7, max_seqs);
        return R"({"kvcheck_replay": 1, "property": "EQUIV", "case": {)" + c + R"(, "ops": )" + ops + "}}";
    };
    std::ofstream(path("huge.json")) << replay_doc("4000000000", "[]");
    std::ofstream(path("negative.json")) << replay_doc("-1", "[]");
    std::ofstream(path("release_empty.json")) << replay_doc("2", R"([{"op": "release", "seq": 0}])");
    std::ofstream(path("too_long.json"))
        << replay_doc("2", R"([{"op": "append", "appends": [{"seq": 0, "n_new": 10}]},
                                {"op": "append", "appends": [{"seq": 0, "n_new": 10}]}])");
    for (const char* f : {"garbage.json", "other.json", "unknown.json", "badcase.json", "missing.json", "huge.json",
                          "negative.json", "release_empty.json", "too_long.json"}) {
        const Outcome r = kvcheck(std::string("replay ") + f + " " + plugin("correct"));
        EXPECT_EQ(r.rc, 2) << f << "\n" << r.all();
        EXPECT_NE(r.err.find(f), std::string::npos) << "the message names the file\n" << r.all();
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Usage errors

TEST_F(Cli, UsageErrorsExitTwo) {
    const std::string p = plugin("correct");
    for (const std::string& args :
         {std::string("validate"), "validate " + p + " --builtin example", std::string("validate --builtin no-such-engine"),
          "validate " + p + " --filter NO-SUCH-PROPERTY", "validate " + p + " --filter '('",
          "validate " + p + " --cases 0", "validate " + p + " --profile nightly", "validate " + p + " --timeout 0",
          "validate " + p + " --report no-such-dir/report.json", "validate " + p + " --shrink-first=-1",
          "validate " + p + " --shrink-first some", std::string("replay"), std::string("list --bogus")}) {
        const Outcome r = kvcheck(args);
        EXPECT_EQ(r.rc, 2) << args << "\n" << r.all();
    }
    EXPECT_FALSE(fs::exists(path("kvcheck-counterexamples")));
}

TEST_F(Cli, HelpEverywhere) {
    for (const char* args : {"--help", "validate --help", "replay --help", "list --help", "memory --help"}) {
        const Outcome r = kvcheck(args);
        EXPECT_EQ(r.rc, 0) << args << "\n" << r.all();
        EXPECT_NE(r.out.find("--"), std::string::npos) << args;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// list

TEST_F(Cli, ListShowsPropertiesBuiltinsAndVocabulary) {
    const Outcome r = kvcheck("list");
    EXPECT_EQ(r.rc, 0) << r.all();
    for (const char* word : {"EQUIV", "NO-Q", "APPEND-ONLY", "MEMORY", "GQA", "core", "full", "example", "bf16",
                             "gptj", "chunked", "q_and_v_accum_in_cache_dtype", "device", "fp8_e4m3", "fp8_e5m2",
                             "int8_token", "q8_0", "fp8_scale_tensor", "fp8_scale_kv_head", "int8_scale_f16",
                             "kv_head"})
        EXPECT_NE(r.out.find(word), std::string::npos) << word;
    const Outcome j = kvcheck("list --json");
    ASSERT_EQ(j.rc, 0);
    ASSERT_TRUE(nlohmann::json::accept(j.out)) << j.out;
    const auto doc = nlohmann::json::parse(j.out);
    EXPECT_GE(doc.at("properties").size(), 5u);
    EXPECT_GE(doc.at("builtins").size(), 1u);
    EXPECT_EQ(doc.at("vocabulary").at("dtypes").size(), 7u); // f32, f16, bf16 and the quantized four (ABI 1.2)
    EXPECT_EQ(doc.at("vocabulary").at("quant").size(), 3u);
    EXPECT_EQ(doc.at("vocabulary").at("scale_modes").size(), 3u);
}

// The offline route does not carry quantized caches yet: export refuses them by name instead of writing f32 rows.
// The offline route carries quantized caches: a quantized dtype named alone is exported with cases of that dtype;
// a dtype kvcheck does not know is refused.
TEST_F(Cli, ExportCarriesQuantizedDtypes) {
    for (const char* dt : {"fp8_e4m3", "fp8_e5m2", "int8_token", "q8_0"}) {
        const std::string out = std::string("vq_") + dt;
        const Outcome r = kvcheck("export --out " + out + " --cases 1 --properties EQUIV --dtypes " + dt);
        ASSERT_EQ(r.rc, 0) << dt << "\n" << r.all();
        std::ifstream in(path(out) / "manifest.json");
        ASSERT_TRUE(in) << dt;
        const auto manifest = nlohmann::json::parse(in);
        EXPECT_EQ(manifest.at("cases").at(0).at("config").at("dtype").get<std::string>(), dt);
    }
    const Outcome bad = kvcheck("export --out vbad --cases 1 --properties EQUIV --dtypes fp9");
    EXPECT_EQ(bad.rc, 2) << bad.all();
    EXPECT_NE(bad.all().find("unknown dtype"), std::string::npos) << bad.all();
}

// A built-in that cannot run here (the CUDA engine on a machine without a GPU) is never judged: named alone it is
// exit 5 with the reason; within `--builtin all` it is listed as skipped, with the reason, and the others run.
TEST_F(Cli, BuiltinThatCannotRunHereIsSkippedWithItsReason) {
    const Outcome l = kvcheck("list --json");
    ASSERT_EQ(l.rc, 0) << l.all();
    std::string name, reason;
    const auto listed = nlohmann::json::parse(l.out);
    for (const auto& b : listed.at("builtins"))
        if (!b.at("runs_here").get<bool>()) {
            name = b.at("name").get<std::string>();
            reason = b.at("unavailable_reason").get<std::string>();
        }
    if (name.empty()) GTEST_SKIP() << "every built-in of this build can run on this machine";
    ASSERT_FALSE(reason.empty());
    const Outcome alone = kvcheck("validate --builtin " + name + " --cases 1");
    EXPECT_EQ(alone.rc, 5) << alone.all();
    EXPECT_NE(alone.err.find(reason), std::string::npos) << alone.all();
    EXPECT_FALSE(fs::exists(path("report.json")));
    const Outcome all = kvcheck("validate --builtin all --filter '^EQUIV/' --cases 1 --report report.json");
    EXPECT_EQ(all.rc, 0) << all.all();
    EXPECT_NE(all.out.find("skipped built-in " + name + ": " + reason), std::string::npos) << all.out;
    const auto doc = json_file("report.json");
    ASSERT_EQ(doc.at("skipped_implementations").size(), 1u);
    EXPECT_EQ(doc.at("skipped_implementations")[0].at("name"), name);
    EXPECT_EQ(doc.at("skipped_implementations")[0].at("reason"), reason);
    EXPECT_GE(doc.at("implementations").size(), 1u);
    for (const auto& impl : doc.at("implementations")) EXPECT_NE(impl.at("origin"), "builtin:" + name);
    EXPECT_EQ(all.out.find(name + ": CONFORMANT"), std::string::npos) << "a skipped built-in has no verdict";
}

// ---------------------------------------------------------------------------------------------------------------
// memory: every number the documents print

TEST_F(Cli, MemoryDocument003IsFourGiB) {
    for (const std::string& args : {std::string("memory --model doc-003-example"),
                                    std::string("memory --batch 1 --layers 32 --tokens 8192 --kv-heads 32 "
                                                "--head-dim 128 --dtype f16")}) {
        const Outcome r = kvcheck(args);
        EXPECT_EQ(r.rc, 0) << r.all();
        EXPECT_NE(r.out.find("bytes:              4294967296\n"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("= 4096 MiB = 4 GiB"), std::string::npos) << r.out;
    }
    const Outcome j = kvcheck("memory --model doc-003-example --json");
    ASSERT_EQ(j.rc, 0);
    const auto doc = nlohmann::json::parse(j.out);
    EXPECT_EQ(doc.at("bytes").get<uint64_t>(), 4294967296ull);
    EXPECT_EQ(doc.at("gib").get<double>(), 4.0);
}

TEST_F(Cli, MemoryLlama2PerTokenAndBatch32BeatsWeights) {
    const Outcome one = kvcheck("memory --model llama-2-13b");
    EXPECT_EQ(one.rc, 0) << one.all();
    EXPECT_NE(one.out.find("bytes per token:    819200 = 800 KiB = 0.819 MB"), std::string::npos) << one.out;
    const Outcome big = kvcheck("memory --model llama-2-13b --batch 32 --tokens 4096");
    EXPECT_EQ(big.rc, 0) << big.all();
    EXPECT_NE(big.out.find("bytes:              107374182400\n"), std::string::npos) << big.out;
    EXPECT_NE(big.out.find("= 102400 MiB = 100 GiB"), std::string::npos) << big.out;
    EXPECT_NE(big.out.find("26 GB"), std::string::npos) << big.out;
    const auto doc = nlohmann::json::parse(kvcheck("memory --model llama-2-13b --batch 32 --json").out);
    EXPECT_EQ(doc.at("bytes").get<uint64_t>(), 107374182400ull);
    EXPECT_GT(doc.at("cache_to_weights").get<double>(), 1.0) << "larger than the weights themselves";
}

TEST_F(Cli, MemoryLlama3At8kIsRoughly2Point5) {
    const Outcome r = kvcheck("memory --model llama-3-70b --tokens 8192");
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_NE(r.out.find("bytes:              2684354560\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("= 2560 MiB = 2.5 GiB"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("= 2684.355 MB = 2.684 GB"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("140 GB"), std::string::npos) << r.out;
}

TEST_F(Cli, MemoryToyModelSixteenNumbersPerToken) {
    const Outcome r = kvcheck("memory --model toy-000 --tokens 1");
    EXPECT_EQ(r.rc, 0) << r.all();
    EXPECT_NE(r.out.find("elements per token: 16 "), std::string::npos) << r.out;
}

TEST_F(Cli, MemoryWholeBlocks) {
    const auto doc =
        nlohmann::json::parse(kvcheck("memory --layers 1 --kv-heads 1 --head-dim 4 --tokens 17 --dtype f32 "
                                      "--block-size 16 --json")
                                  .out);
    EXPECT_EQ(doc.at("bytes").get<uint64_t>(), 2u * 17 * 4 * 4);
    EXPECT_EQ(doc.at("blocks_per_sequence_layer").get<uint64_t>(), 2u);
    EXPECT_EQ(doc.at("allocated_bytes").get<uint64_t>(), 2u * 32 * 4 * 4);
}

// The quantized dtypes: one byte per number, plus the scales a dtype keeps with each head's row. The expected byte
// counts are written out by hand: 2 * 1 * 32 * 8192 * 32 rows of 128 numbers.
TEST_F(Cli, MemoryQuantizedDtypes) {
    const std::pair<const char*, uint64_t> cases[] = {
        {"fp8_e4m3", 2147483648ull},      // 128 bytes per row: exactly half of fp16's 4 GiB
        {"fp8_e5m2", 2147483648ull},
        {"int8_token", 2214592512ull},    // 128 + 4 (f32 scale)
        {"int8_token_f16", 2181038080ull}, // 128 + 2 (f16 scale)
        {"q8_0", 2281701376ull},          // 128 + 4 blocks * 2 (f16 scales)
    };
    for (const auto& [dtype, bytes] : cases) {
        const Outcome r = kvcheck(std::string("memory --model doc-003-example --json --dtype ") + dtype);
        ASSERT_EQ(r.rc, 0) << dtype << "\n" << r.all();
        const auto doc = nlohmann::json::parse(r.out);
        EXPECT_EQ(doc.at("bytes").get<uint64_t>(), bytes) << dtype;
        EXPECT_EQ(doc.at("dtype").get<std::string>(), dtype);
    }
    const Outcome text = kvcheck("memory --model doc-003-example --dtype fp8_e4m3");
    EXPECT_EQ(text.rc, 0) << text.all();
    EXPECT_NE(text.out.find("= 2048 MiB = 2 GiB"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("not per token"), std::string::npos) << text.out;
    const Outcome q = kvcheck("memory --model doc-003-example --dtype q8_0");
    EXPECT_NE(q.out.find("scale bytes per row       8 (one f16 scale per 32 numbers)"), std::string::npos) << q.out;
}

TEST_F(Cli, MemoryBadInputExitsTwo) {
    for (const char* args :
         {"memory --layers 32 --kv-heads 32 --head-dim 128 --tokens 0",
          "memory --layers 32 --kv-heads 32 --head-dim 128 --tokens=-8",
          "memory --layers 32 --kv-heads 32 --head-dim 128 --tokens 8 --batch 0",
          "memory --layers 32 --kv-heads 32 --head-dim 128", "memory --model gpt-5",
          "memory --model llama-2-13b --dtype f8", "memory --model llama-2-13b --block-size 0",
          "memory --model toy-000 --dtype q8_0", // head_dim 4 is no whole q8_0 block
          "memory --layers 4000000000 --kv-heads 4000000000 --head-dim 4000000000 --tokens 4000000000",
          "memory --layers x --kv-heads 1 --head-dim 1 --tokens 1"}) {
        const Outcome r = kvcheck(args);
        EXPECT_EQ(r.rc, 2) << args << "\n" << r.all();
        EXPECT_FALSE(r.err.empty()) << args;
    }
}

} // namespace
