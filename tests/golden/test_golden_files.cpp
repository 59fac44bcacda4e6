// The committed golden files: every printed number reproduced by the reference at its printed precision, every
// computed field fresh, the layout canonical and reproducible, the format as the schema says.
#include "kvcheck/golden/golden.hpp"
#include "kvcheck/golden/oracle.hpp"
#include "kvcheck/golden/validate.hpp"

#include "golden_test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <iostream>
#include <regex>
#include <set>

namespace {

using namespace kvc::golden;
using golden_test::golden_dir;
using golden_test::read;
using nlohmann::json;

const Oracle& oracle() {
    static const Oracle o;
    return o;
}

struct Loaded {
    std::string name, text;
    json doc;
    GoldenFile file;
};

std::vector<Loaded> load_all() {
    std::vector<Loaded> out;
    for (const auto& p : golden_files(golden_dir())) {
        Loaded l;
        l.name = p.filename().string();
        l.text = read(p);
        l.doc = json::parse(l.text);
        l.file = parse_golden(l.doc, l.name, true);
        out.push_back(std::move(l));
    }
    return out;
}

TEST(GoldenFiles, OneFilePerSourceDocument) {
    std::vector<std::string> docs;
    for (const auto& l : load_all()) docs.push_back(l.file.document);
    EXPECT_EQ(docs, (std::vector<std::string>{"000_7a0753d5dc4e224c.txt", "001_fb7c353e40dff169.txt",
                                               "002_7716e9627963b575.txt", "003_4a16429f040b344d.txt"}));
}

// The heart of it, written independently of verify.cpp: the reference against each printed text.
TEST(GoldenFiles, TheReferenceReproducesEveryPrintedNumberAtItsPrecision) {
    for (const auto& l : load_all()) {
        int checked = 0;
        for (const Entry& e : l.file.entries) {
            if (e.kind != "printed") continue;
            const Value* v = oracle().find(e.quantity);
            ASSERT_NE(v, nullptr) << l.name << " " << e.id;
            ASSERT_EQ(v->data.size(), e.printed.size()) << l.name << " " << e.id;
            const long double tol = e.exact ? 0.0L : 0.5L * std::pow(10.0L, -e.decimals);
            for (size_t i = 0; i < e.printed.size(); ++i, ++checked) {
                const long double actual = v->data[i] / e.unit_divisor;
                const long double printed = parse_printed(e.printed[i]).value;
                EXPECT_LE(std::fabs(actual - printed), tol + 1e-15L * std::max(1.0L, std::fabs(printed)))
                    << l.name << " " << e.id << "[" << i << "]: printed " << e.printed[i] << ", reference "
                    << static_cast<double>(actual);
            }
        }
        std::cout << "[golden] " << l.name << ": " << checked << " printed numbers reproduced\n";
        EXPECT_GT(checked, 0);
    }
}

TEST(GoldenFiles, VerifyReportsNoProblems) {
    const Report r = verify_dir(golden_dir());
    std::cout << format_report(r);
    EXPECT_EQ(r.exit_code(), 0);
    EXPECT_TRUE(r.unchecked.empty());
    ASSERT_EQ(r.files.size(), 4u);
    for (const auto& f : r.files) EXPECT_GT(f.numbers(), 0) << f.file;
}

TEST(GoldenFiles, WholeNumbersPrintedWithoutApproximationAreCheckedExactly) {
    for (const auto& l : load_all())
        for (const Entry& e : l.file.entries) {
            if (e.kind != "printed") continue;
            bool approximate = false;
            for (const auto& p : e.printed) approximate = approximate || p[0] == '~';
            if (e.decimals == 0 && !approximate && !l.doc["entries"][e.index].contains("unit")) {
                EXPECT_TRUE(e.exact) << l.name << " " << e.id;
            }
        }
}

TEST(GoldenFiles, NextTokensArePrintedInputsNotComputed) {
    for (const auto& l : load_all())
        for (const auto& e : l.doc["entries"])
            if (e["quantity"] == "toy4d.turn1.next_token") {
                EXPECT_EQ(e["kind"], "printed");
                EXPECT_EQ(e["role"], "input");
            }
}

TEST(GoldenFiles, AreFreshAndInCanonicalLayout) {
    for (const auto& l : load_all())
        EXPECT_EQ(regen_text(l.name, l.text, oracle()), l.text) << l.name << " is stale: run " << kRegenCommand;
}

// Regen recomputes every computed field from the reference: with all of them removed, and the layout scrambled,
// it gives back the committed bytes.
TEST(GoldenFiles, RegenRecomputesEveryComputedFieldByteForByte) {
    for (const auto& l : load_all()) {
        json stripped = l.doc;
        for (auto& e : stripped["entries"]) e.erase("computed");
        const std::string once = regen_text(l.name, stripped.dump(), oracle());
        EXPECT_EQ(once, l.text) << l.name;
        EXPECT_EQ(regen_text(l.name, once, oracle()), once) << l.name << ": a rerun changed the bytes";
    }
}

TEST(GoldenFiles, RegenOfTheDirectoryChangesNothing) {
    golden_test::ScratchDir dir("regen");
    std::string internal;
    const auto results = regen_dir(dir.path(), internal);
    EXPECT_TRUE(internal.empty()) << internal;
    ASSERT_EQ(results.size(), 4u);
    for (const auto& r : results) {
        EXPECT_TRUE(r.error.empty()) << r.file << ": " << r.error;
        EXPECT_FALSE(r.changed) << r.file;
        EXPECT_EQ(read(dir.path() / r.file), read(golden_dir() / r.file));
    }
}

// The schema is documentation; the C++ validator is the authority. They must say the same.
TEST(GoldenFiles, AgreeWithTheJsonSchema) {
    const json schema = json::parse(read(golden_dir() / "schema" / "golden.schema.json"));
    EXPECT_EQ(schema["properties"]["schema_version"]["const"], kSchemaVersion);
    const json& entry = schema["$defs"]["entry"];
    const std::regex printed_text(schema["$defs"]["printedText"]["pattern"].get<std::string>());
    std::map<std::string, std::vector<std::string>> required_by_kind;
    for (const auto& rule : entry["allOf"])
        required_by_kind[rule["if"]["properties"]["kind"]["const"]] = rule["then"]["required"].get<std::vector<std::string>>();
    for (const auto& l : load_all()) {
        for (const auto& key : schema["required"]) EXPECT_TRUE(l.doc.contains(key.get<std::string>())) << l.name << " " << key;
        for (const auto& [key, value] : l.doc.items()) EXPECT_TRUE(schema["properties"].contains(key)) << l.name << " " << key;
        EXPECT_TRUE(std::regex_match(l.file.document, std::regex(schema["properties"]["document"]["pattern"].get<std::string>())));
        for (const auto& e : l.doc["entries"]) {
            const std::string id = e["id"];
            for (const auto& key : entry["required"]) EXPECT_TRUE(e.contains(key.get<std::string>())) << l.name << " " << id << " " << key;
            for (const auto& [key, value] : e.items()) EXPECT_TRUE(entry["properties"].contains(key)) << l.name << " " << id << " " << key;
            const auto kinds = entry["properties"]["kind"]["enum"].get<std::vector<std::string>>();
            EXPECT_NE(std::find(kinds.begin(), kinds.end(), e["kind"].get<std::string>()), kinds.end()) << id;
            const auto& required = required_by_kind[e["kind"]];
            for (const auto& key : required) EXPECT_TRUE(e.contains(key)) << l.name << " " << id << " " << key;
            for (const std::string key : {"derivation", "assumption", "printed"}) { // each belongs to one kind
                const bool allowed = std::find(required.begin(), required.end(), key) != required.end();
                EXPECT_TRUE(!e.contains(key) || allowed) << l.name << " " << id << " has " << key;
            }
        }
        for (const Entry& e : l.file.entries)
            for (const auto& p : e.printed) EXPECT_TRUE(std::regex_match(p, printed_text)) << l.name << " " << e.id << " " << p;
    }
}

} // namespace
