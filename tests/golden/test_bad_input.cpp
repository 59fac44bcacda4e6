// Bad golden files: each is reported with the file, a JSON pointer and (where it helps) the regeneration
// command, with a non-zero exit code; nothing throws, nothing crashes, regen never overwrites a file it cannot read.
#include "kvcheck/golden/golden.hpp"
#include "kvcheck/golden/oracle.hpp"

#include "golden_test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>

namespace {

using namespace kvc::golden;
using golden_test::golden_dir;
using golden_test::read;
using golden_test::ScratchDir;
using nlohmann::json;

const std::string kFile = "000_7a0753d5dc4e224c.json";

const Oracle& oracle() {
    static const Oracle o;
    return o;
}

std::string original() { return read(golden_dir() / kFile); }

// The file with one edit applied to its JSON.
std::string edited(const std::function<void(json&)>& edit) {
    json doc = json::parse(original());
    edit(doc);
    return doc.dump(1);
}

// Index of the entry with this id.
size_t entry(const json& doc, const std::string& id) {
    for (size_t i = 0; i < doc["entries"].size(); ++i)
        if (doc["entries"][i]["id"] == id) return i;
    throw std::runtime_error("no entry " + id);
}

Report report_of(const FileReport& f) {
    Report r;
    r.files.push_back(f);
    return r;
}

void expect_malformed(const std::string& text, const std::string& path_or_words) {
    FileReport f;
    ASSERT_NO_THROW(f = verify_text(kFile, text, oracle()));
    EXPECT_NE(f.malformed.find(path_or_words), std::string::npos) << "got: " << f.malformed;
    EXPECT_EQ(f.numbers(), 0);
    const Report r = report_of(f);
    EXPECT_EQ(r.exit_code(), 2);
    const std::string text_out = format_report(r);
    EXPECT_NE(text_out.find(kFile), std::string::npos) << text_out;
    EXPECT_NE(text_out.find(kRegenCommand), std::string::npos) << text_out;
    EXPECT_THROW(regen_text(kFile, text, oracle()), FormatError);
}

TEST(BadInput, NotJson) { expect_malformed("this is not json", "not valid JSON"); }
TEST(BadInput, Empty) { expect_malformed("", "not valid JSON"); }
TEST(BadInput, Truncated) { expect_malformed(original().substr(0, original().size() / 2), "not valid JSON"); }
TEST(BadInput, TopLevelNotAnObject) { expect_malformed("[1, 2]", "top level"); }

TEST(BadInput, WrongSchemaVersion) {
    expect_malformed(edited([](json& d) { d["schema_version"] = 2; }), "/schema_version");
    expect_malformed(edited([](json& d) { d["schema_version"] = "1"; }), "/schema_version");
    expect_malformed(edited([](json& d) { d.erase("schema_version"); }), "missing field \"schema_version\"");
}

TEST(BadInput, MissingFields) {
    expect_malformed(edited([](json& d) { d.erase("entries"); }), "missing field \"entries\"");
    expect_malformed(edited([](json& d) { d["entries"][3].erase("printed"); }), "/entries/3: missing field \"printed\"");
    expect_malformed(edited([](json& d) { d["entries"][3].erase("source"); }), "/entries/3: missing field \"source\"");
    expect_malformed(edited([](json& d) { d["entries"][3].erase("decimals"); }), "missing field \"decimals\"");
    // verify needs the computed values; regen would fill them in
    const std::string no_computed = edited([](json& d) { d["entries"][3].erase("computed"); });
    expect_malformed(no_computed.substr(0, no_computed.size() / 2), "not valid JSON");
    FileReport f = verify_text(kFile, no_computed, oracle());
    EXPECT_NE(f.malformed.find("/entries/3/computed"), std::string::npos) << f.malformed;
    EXPECT_NE(f.malformed.find(kRegenCommand), std::string::npos) << f.malformed;
    EXPECT_EQ(regen_text(kFile, no_computed, oracle()), original());
}

TEST(BadInput, WrongTypesAndValues) {
    expect_malformed(edited([](json& d) { d["entries"][0]["printed"] = 32; }), "/entries/0/printed");
    expect_malformed(edited([](json& d) { d["entries"][0]["kind"] = "guessed"; }), "/entries/0/kind");
    expect_malformed(edited([](json& d) { d["entries"][0]["role"] = "both"; }), "/entries/0/role");
    expect_malformed(edited([](json& d) { d["entries"][0]["tolerance"] = 0.5; }), "/entries/0/tolerance");
    expect_malformed(edited([](json& d) { d["entries"][0]["surprise"] = 1; }), "unknown field \"surprise\"");
    expect_malformed(edited([](json& d) { d["entries"][1]["id"] = d["entries"][0]["id"]; }), "duplicate id");
    expect_malformed(edited([](json& d) { d["document"] = "001_fb7c353e40dff169.txt"; }), "/document");
    expect_malformed(edited([](json& d) { d["entries"] = json::array(); }), "no entries");
    expect_malformed(edited([](json& d) { d["entries"][0]["computed"] = "32"; }), "/entries/0/computed");
}

TEST(BadInput, PrintedTextsMustKeepTheirPrecision) {
    expect_malformed(edited([](json& d) { d["entries"][entry(d, "turn1.weights")]["printed"][0] = "0.470"; }),
                     "has 3 decimals, the entry says 2");
    expect_malformed(edited([](json& d) { d["entries"][entry(d, "turn1.weights")]["printed"][0] = "about half"; }),
                     "/printed/0");
}

TEST(BadInput, UnknownQuantityOrWrongShape) {
    expect_malformed(edited([](json& d) { d["entries"][0]["quantity"] = "toy4d.nothing"; }), "unknown quantity");
    expect_malformed(edited([](json& d) {
                         auto& e = d["entries"][entry(d, "turn1.dots")];
                         e["printed"].push_back("1");
                         e["computed"].push_back(1);
                     }),
                     "the reference's toy4d.turn1.dots is [4]");
}

TEST(BadInput, AMisprintedNumberIsAMismatchNamingFileFieldExpectedAndActual) {
    const std::string text = edited([](json& d) { d["entries"][entry(d, "turn1.weights")]["printed"][2] = "0.39"; });
    const FileReport f = verify_text(kFile, text, oracle());
    ASSERT_TRUE(f.malformed.empty()) << f.malformed;
    ASSERT_EQ(f.mismatches.size(), 1u);
    EXPECT_TRUE(f.stale.empty());
    const json doc = json::parse(text);
    EXPECT_EQ(f.mismatches[0].path, "/entries/" + std::to_string(entry(doc, "turn1.weights")) + "/printed/2");
    EXPECT_EQ(f.mismatches[0].entry, "turn1.weights");
    EXPECT_EQ(report_of(f).exit_code(), 1);
    const std::string out = format_report(report_of(f));
    EXPECT_NE(out.find("MISMATCH " + kFile + " " + f.mismatches[0].path), std::string::npos) << out;
    EXPECT_NE(out.find("0.39 (±0.005"), std::string::npos) << out;
    EXPECT_NE(out.find("0.28748998"), std::string::npos) << out;
    EXPECT_NE(out.find("1 mismatch"), std::string::npos) << out;
}

TEST(BadInput, AnExactNumberOffByOneIsAMismatch) {
    const std::string text = edited([](json& d) { d["entries"][entry(d, "turn1.dots")]["printed"][0] = "1472"; });
    const FileReport f = verify_text(kFile, text, oracle());
    ASSERT_EQ(f.mismatches.size(), 1u);
    EXPECT_NE(f.mismatches[0].expected.find("(exact)"), std::string::npos);
}

TEST(BadInput, AFailedClaimIsAMismatch) {
    const std::string text =
        edited([](json& d) { d["entries"][entry(d, "llama2_13b.batch32_4k.over_weights")]["claim"]["greater_than"] = 5; });
    const FileReport f = verify_text(kFile, text, oracle());
    ASSERT_EQ(f.mismatches.size(), 1u);
    EXPECT_NE(f.mismatches[0].path.find("/claim"), std::string::npos);
}

TEST(BadInput, AStaleComputedValueNamesTheRegenerationCommand) {
    const std::string text = edited([](json& d) { d["entries"][entry(d, "turn1.weights")]["computed"][0] = 0.474; });
    const FileReport f = verify_text(kFile, text, oracle());
    ASSERT_TRUE(f.malformed.empty());
    EXPECT_TRUE(f.mismatches.empty());
    ASSERT_EQ(f.stale.size(), 1u);
    EXPECT_EQ(report_of(f).exit_code(), 2);
    const std::string out = format_report(report_of(f));
    EXPECT_NE(out.find("STALE " + kFile), std::string::npos) << out;
    EXPECT_NE(out.find(kRegenCommand), std::string::npos) << out;
    EXPECT_EQ(regen_text(kFile, text, oracle()), original()); // and regen repairs it
}

// Cut the file anywhere, or damage any byte: verify reports, never throws.
TEST(BadInput, NoPrefixOrSingleByteDamageCrashes) {
    const std::string text = original();
    for (size_t cut = 0; cut < text.size(); cut += 211) {
        FileReport f;
        ASSERT_NO_THROW(f = verify_text(kFile, text.substr(0, cut), oracle())) << cut;
        EXPECT_FALSE(f.malformed.empty()) << cut;
    }
    for (size_t at = 0; at < text.size(); at += 127)
        for (char c : {'"', '{', ']', '9', 'x', '\0'}) {
            std::string damaged = text;
            damaged[at] = c;
            FileReport f;
            ASSERT_NO_THROW(f = verify_text(kFile, damaged, oracle())) << at;
            EXPECT_NO_THROW(report_of(f).exit_code());
        }
}

TEST(BadDirectory, MissingOrEmptyDirectoryIsBadInput) {
    const Report missing = verify_dir(golden_dir() / "does-not-exist");
    EXPECT_EQ(missing.exit_code(), 2);
    EXPECT_NE(format_report(missing).find("not found"), std::string::npos);
    ScratchDir dir("empty");
    for (const auto& f : golden_files(dir.path())) std::filesystem::remove(f);
    const Report empty = verify_dir(dir.path());
    EXPECT_EQ(empty.exit_code(), 2);
    EXPECT_NE(format_report(empty).find("no golden files"), std::string::npos);
}

TEST(BadDirectory, AMissingFileLeavesQuantitiesUnchecked) {
    ScratchDir dir("missing-file");
    std::filesystem::remove(dir.path() / "003_4a16429f040b344d.json");
    const Report r = verify_dir(dir.path());
    EXPECT_EQ(r.exit_code(), 2);
    EXPECT_FALSE(r.unchecked.empty());
    EXPECT_NE(format_report(r).find("example003.8k.bytes"), std::string::npos);
}

TEST(BadDirectory, OneMalformedFileDoesNotHideTheOthers) {
    ScratchDir dir("one-bad");
    const auto bad = dir.path() / "001_fb7c353e40dff169.json";
    const std::string truncated = read(bad).substr(0, 100);
    golden_test::write(bad, truncated);
    const Report r = verify_dir(dir.path());
    EXPECT_EQ(r.exit_code(), 2);
    ASSERT_EQ(r.files.size(), 4u);
    EXPECT_FALSE(r.files[1].malformed.empty());
    EXPECT_GT(r.files[0].numbers(), 0);
    EXPECT_GT(r.files[3].numbers(), 0);
    // regen refuses it and leaves its bytes alone
    std::string internal;
    const auto results = regen_dir(dir.path(), internal);
    ASSERT_EQ(results.size(), 4u);
    EXPECT_FALSE(results[1].error.empty());
    EXPECT_EQ(read(bad), truncated);
}

} // namespace
