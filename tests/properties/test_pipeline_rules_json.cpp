// ABI 1.3 pipeline rules on the vectors route: a caps file's or results manifest's "pipeline_rules" read as a
// plugin's table is, refused where a plugin's would be, echoed, and compared between export and results.
#include "kvcheck/vectors/caps.hpp"

#include "kvcheck/properties/tolerance.hpp"

#include <gtest/gtest.h>

namespace {

using nlohmann::json;

json declaration(const json& rules) {
    return {{"capabilities", {"dtype f32", "dtype f16", "dtype bf16", "chunked"}},
            {"pipeline", "f32"},
            {"pipeline_rules", rules}};
}

const json kGgmlRules = json::parse(R"([{"dtypes": ["f16"], "min_new": 64, "pipeline": "f32"},
                                        {"dtypes": ["f16"], "pipeline": "q-and-v-accum-in-cache-dtype"},
                                        {"dtypes": ["bf16"], "pipeline": {"q": "cache"}}])");

TEST(VectorsRules, RulesAreReadAsAPluginDeclaresThem) {
    const kvc::vec::Declared d = kvc::vec::declared_from_json(declaration(kGgmlRules), true);
    ASSERT_EQ(d.caps.n_pipeline_rules, 3u);
    EXPECT_EQ(d.caps.pipeline_rules[0].cache_dtypes, 1u << KVC_DTYPE_F16);
    EXPECT_EQ(d.caps.pipeline_rules[0].min_new, 64u);
    EXPECT_EQ(d.caps.pipeline_rules[1].pipeline.accum, uint32_t{KVC_ROUND_CACHE});
    EXPECT_EQ(d.caps.pipeline_rules[2].pipeline.q, uint32_t{KVC_ROUND_CACHE});
    EXPECT_EQ(d.caps.pipeline_rules[2].pipeline.accum, uint32_t{KVC_ROUND_F32});
    EXPECT_EQ(kvc::prop::pipeline_for(d.caps, KVC_DTYPE_F16, 65).rule, 0);
    EXPECT_EQ(kvc::prop::pipeline_for(d.caps, KVC_DTYPE_F16, 63).rule, 1);
    // echoed in the manifest's "declared" as given
    const json echo = kvc::vec::declared_to_json(d)["pipeline_rules"];
    ASSERT_EQ(echo.size(), 3u);
    EXPECT_EQ(echo[0]["dtypes"], json({"f16"}));
    EXPECT_EQ(echo[0]["min_new"], 64);
    EXPECT_EQ(echo[2]["pipeline"]["q"], "cache");
}

void refused(const json& j, const std::string& words) {
    try {
        kvc::vec::declared_from_json(j, true);
        ADD_FAILURE() << j.dump() << " was accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
}

TEST(VectorsRules, BadRulesAreRefused) {
    refused(declaration(json::object()), "field \"pipeline_rules\" is not an array");
    refused(declaration(json::parse(R"([{"dtypes": ["f16"], "pipeline": "f32", "min": 3}])")),
            "\"pipeline_rules\"[0]: unknown field \"min\"");
    refused(declaration(json::parse(R"([{"dtypes": ["f8"], "pipeline": "f32"}])")), "unknown dtype \"f8\"");
    refused(declaration(json::parse(R"([{"dtypes": ["q8_0"], "pipeline": "f32"}])")),
            "pipeline rule 1 covers q8_0, a cache dtype the plugin does not declare");
    refused(declaration(json::parse(R"([{"dtypes": ["f16"]}])")), "missing field \"pipeline\"");
    json nine = json::array();
    for (int i = 0; i < 9; ++i) nine.push_back({{"pipeline", "f32"}});
    refused(declaration(nine), "9 rules, at most 8");
    // the misspelt key stays unknown
    json misspelt = declaration(kGgmlRules);
    misspelt["pipelines"] = misspelt["pipeline_rules"];
    misspelt.erase("pipeline_rules");
    refused(misspelt, "unknown field \"pipelines\"");
}

TEST(VectorsRules, ExportAndResultsWithOtherRulesDeclareAnotherPipeline) {
    const kvc::vec::Declared a = kvc::vec::declared_from_json(declaration(kGgmlRules), true);
    json other_rules = kGgmlRules;
    other_rules[0]["min_new"] = 32u; // as a parsed file holds it (unsigned)
    const kvc::vec::Declared b = kvc::vec::declared_from_json(declaration(other_rules), true);
    json none = declaration(kGgmlRules);
    none.erase("pipeline_rules");
    const kvc::vec::Declared c = kvc::vec::declared_from_json(none, true);
    EXPECT_TRUE(kvc::vec::same_pipeline(a, a));
    EXPECT_FALSE(kvc::vec::same_pipeline(a, b));
    EXPECT_FALSE(kvc::vec::same_pipeline(a, c));
}

} // namespace
