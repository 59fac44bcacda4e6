// kvcheck list: what this build can check and with what words. The properties of both levels (id, core or full,
// summary), the built-in implementations, the capability vocabulary a plugin declares itself in, and, with --plugin,
// which levels a plugin exports (probed in a child process, as validate does).
#include "commands.hpp"

#include "kvcheck/harness/report.hpp"
#include "kvcheck/harness/vocabulary.hpp"

#include "kvcheck/harness/selection.hpp"
#include "kvcheck/harness/subjects.hpp"
#include "kvcheck/model/model_properties.hpp"

#include "kvcheck/builtins.hpp"
#include "kvcheck/properties/properties.hpp"
#include "kvcheck/properties/runner.hpp"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace kvc::cli {
namespace {

nlohmann::json words_json(const std::vector<Word>& words, bool bits) {
    nlohmann::json a = nlohmann::json::array();
    for (const Word& w : words)
        a.push_back({{"name", w.name}, {bits ? "bit" : "value", w.value}, {"meaning", w.meaning}});
    return a;
}

nlohmann::json list_json() {
    nlohmann::json props = nlohmann::json::array();
    for (const prop::Property& p : prop::properties()) {
        std::string feature;
        for (const Word& w : feature_words())
            if (w.value == p.feature) feature = w.name;
        props.push_back({{"id", p.id},
                         {"profile", p.core ? "core" : "full"},
                         {"feature", feature.empty() ? nlohmann::json(nullptr) : nlohmann::json(feature)},
                         {"summary", p.summary}});
    }
    nlohmann::json model_props = nlohmann::json::array();
    for (const std::string& id : model::model_property_ids())
        model_props.push_back({{"id", id},
                               {"level", "model"},
                               {"profile", harness::model_property_core(id) ? "core" : "full"},
                               {"summary", model::model_property_summary(id)}});
    nlohmann::json impls = nlohmann::json::array();
    for (const Builtin& b : builtins()) {
        const std::string why = unavailable_reason(b);
        impls.push_back({{"name", b.name},
                         {"description", b.description},
                         {"runs_here", why.empty()},
                         {"unavailable_reason", why.empty() ? nlohmann::json(nullptr) : nlohmann::json(why)}});
    }
    nlohmann::json verdicts = nlohmann::json::array();
    for (prop::Verdict v : {prop::Verdict::Pass, prop::Verdict::Fail, prop::Verdict::NotSupported,
                            prop::Verdict::QualityWarning, prop::Verdict::Error, prop::Verdict::Crash,
                            prop::Verdict::Timeout})
        verdicts.push_back(prop::verdict_name(v));
    return {{"kvcheck_version", KVCHECK_VERSION},
            {"abi", {{"major", KVC_ABI_VERSION_MAJOR}, {"minor", KVC_ABI_VERSION_MINOR}}},
            {"model_abi", {{"major", KVCM_ABI_VERSION_MAJOR}, {"minor", KVCM_ABI_VERSION_MINOR}}},
            {"properties", props},
            {"model_properties", model_props},
            {"builtins", impls},
            {"vocabulary",
             {{"dtypes", words_json(dtype_words(), false)},
              {"rope_variants", words_json(rope_words(), false)},
              {"features", words_json(feature_words(), true)},
              {"quant", words_json(quant_words(), true)},
              {"scale_modes", words_json(scale_mode_words(), false)},
              {"precision_classes", words_json(precision_words(), false)},
              {"memory_spaces", words_json(memory_space_words(), false)},
              {"model_features", words_json(model_feature_words(), true)},
              {"weight_formats", words_json(weight_format_words(), false)}}},
            {"verdicts", verdicts}};
}

void print_words(std::ostream& o, const char* title, const std::vector<Word>& words) {
    std::size_t w = 0;
    for (const Word& x : words) w = std::max(w, x.name.size());
    o << "  " << title << ":\n";
    for (const Word& x : words)
        o << "    " << std::setw(static_cast<int>(w)) << std::left << x.name << "  " << x.meaning << "\n";
}

std::string list_text() {
    std::ostringstream o;
    o << "kvcheck " KVCHECK_VERSION ", plugin ABI " << KVC_ABI_VERSION_MAJOR << "." << KVC_ABI_VERSION_MINOR
      << "\n\nproperties (core: in every profile; full: only in --profile full; [feature]: its cases lie "
         "outside the declaration without it):\n";
    std::size_t w = 0;
    for (const prop::Property& p : prop::properties()) w = std::max(w, p.id.size());
    for (const prop::Property& p : prop::properties()) {
        std::string feature;
        for (const Word& x : feature_words())
            if (x.value == p.feature) feature = " [" + x.name + "]";
        o << "  " << std::setw(static_cast<int>(w)) << std::left << p.id << "  " << (p.core ? "core" : "full") << "  "
          << p.summary << feature << "\n";
    }
    o << "\nmodel level (model ABI " << KVCM_ABI_VERSION_MAJOR << "." << KVCM_ABI_VERSION_MINOR
      << ", plugins exporting " KVCM_ENTRY_SYMBOL "; docs/model-level.md):\n";
    w = 0;
    for (const std::string& id : model::model_property_ids()) w = std::max(w, id.size());
    for (const std::string& id : model::model_property_ids())
        o << "  " << std::setw(static_cast<int>(w)) << std::left << id << "  "
          << (harness::model_property_core(id) ? "core" : "full") << "  " << model::model_property_summary(id)
          << "\n";
    o << "\nbuilt-in implementations (validate --builtin NAME, or --builtin all):\n";
    w = 0;
    for (const Builtin& b : builtins()) w = std::max(w, b.name.size());
    for (const Builtin& b : builtins()) {
        o << "  " << std::setw(static_cast<int>(w)) << std::left << b.name << "  " << b.description << "\n";
        const std::string why = unavailable_reason(b);
        if (!why.empty()) o << "  " << std::string(w, ' ') << "  cannot run here: " << why << "\n";
    }
    o << "\ncapability vocabulary (what kvc_caps declares; reports use these words):\n";
    print_words(o, "dtypes", dtype_words());
    print_words(o, "rope variants", rope_words());
    print_words(o, "features", feature_words());
    print_words(o, "quantized scale forms (kvc_caps.quant)", quant_words());
    print_words(o, "fp8 scale modes (kvc_config.kv_scale_mode)", scale_mode_words());
    print_words(o, "precision classes", precision_words());
    print_words(o, "memory spaces", memory_space_words());
    print_words(o, "model features", model_feature_words());
    print_words(o, "weight formats", weight_format_words());
    o << "\nverdicts: PASS, FAIL, NOT_SUPPORTED, QUALITY_WARNING, ERROR, CRASH, TIMEOUT (conformant: no FAIL, ERROR, "
         "CRASH or TIMEOUT); a case that needs what the implementation does not declare gets none: it is counted "
         "apart, outside the declaration\n";
    return o.str();
}

// The levels a plugin exports, probed in a child (the plugin is never loaded here).
std::string plugin_text(const harness::Subject& s) {
    std::string levels;
    if (s.operation) levels += "operation";
    if (s.model) levels += std::string(levels.empty() ? "" : ", ") + "model";
    return "plugin " + s.target.origin + " exports: " + levels + "\n" + harness::subject_header(s);
}

nlohmann::json plugin_json(const harness::Subject& s) { return harness::subject_json(s); }

} // namespace

void add_list_command(CLI::App& app, int& exit_code) {
    static bool json = false;
    static std::string plugin;
    auto* list = app.add_subcommand("list", "The properties of both levels, the built-in implementations and the "
                                            "capability vocabulary; with --plugin, the levels a plugin exports");
    list->add_flag("--json", json, "print JSON instead of text");
    list->add_option("--plugin", plugin, "also say which tables this plugin exports (operation, model level)")
        ->check(path_given());
    list->callback([&exit_code] {
        nlohmann::json j = list_json();
        std::string text = list_text();
        if (!plugin.empty()) {
            try {
                const std::vector<harness::Subject> s = harness::load_subjects(plugin, "", false, {});
                j["plugin"] = plugin_json(s[0]);
                text += "\n" + plugin_text(s[0]);
            } catch (const BadInput& e) {
                std::cerr << "kvcheck list: " << printable(e.what(), true) << "\n";
                exit_code = kExitBadInput;
                return;
            } catch (const PluginFailed& e) {
                std::cerr << "kvcheck list: " << printable(e.what(), true) << "\n";
                exit_code = kExitPluginFailed;
                return;
            }
        }
        std::cout << (json ? dump_json(j, 2) + "\n" : text);
        exit_code = kExitOk;
    });
}

} // namespace kvc::cli
