// kvcheck list: what this build can check and with what words. The properties (id, core or full, summary), the
// built-in implementations, and the capability vocabulary a plugin declares itself in.
#include "commands.hpp"

#include "report.hpp"
#include "vocabulary.hpp"

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
            {"properties", props},
            {"builtins", impls},
            {"vocabulary",
             {{"dtypes", words_json(dtype_words(), false)},
              {"rope_variants", words_json(rope_words(), false)},
              {"features", words_json(feature_words(), true)},
              {"precision_classes", words_json(precision_words(), false)},
              {"memory_spaces", words_json(memory_space_words(), false)}}},
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
      << "\n\nproperties (core: in every profile; full: only in --profile full; [feature]: NOT_SUPPORTED without "
         "it):\n";
    std::size_t w = 0;
    for (const prop::Property& p : prop::properties()) w = std::max(w, p.id.size());
    for (const prop::Property& p : prop::properties()) {
        std::string feature;
        for (const Word& x : feature_words())
            if (x.value == p.feature) feature = " [" + x.name + "]";
        o << "  " << std::setw(static_cast<int>(w)) << std::left << p.id << "  " << (p.core ? "core" : "full") << "  "
          << p.summary << feature << "\n";
    }
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
    print_words(o, "precision classes", precision_words());
    print_words(o, "memory spaces", memory_space_words());
    o << "\nverdicts: PASS, FAIL, NOT_SUPPORTED, QUALITY_WARNING, ERROR, CRASH, TIMEOUT (conformant: no FAIL, ERROR, "
         "CRASH or TIMEOUT)\n";
    return o.str();
}

} // namespace

void add_list_command(CLI::App& app, int& exit_code) {
    static bool json = false;
    auto* list = app.add_subcommand("list", "The properties, the built-in implementations and the capability "
                                            "vocabulary");
    list->add_flag("--json", json, "print JSON instead of text");
    list->callback([&exit_code] {
        std::cout << (json ? dump_json(list_json(), 2) + "\n" : list_text());
        exit_code = kExitOk;
    });
}

} // namespace kvc::cli
