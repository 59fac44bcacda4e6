#include "kvcheck/harness/replay.hpp"

#include "kvcheck/harness/errors.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/harness/isolate.hpp"
#include "kvcheck/harness/report.hpp"
#include "kvcheck/model/model_properties.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>

namespace kvc::harness {

std::string write_counterexample(const std::string& directory, bool several, const Subject& subj, Level level,
                                 const prop::CaseResult& r, int index, uint64_t run_seed, const std::string& case_text,
                                 std::string& error) {
    namespace fs = std::filesystem;
    fs::path dir = directory;
    if (several) dir /= subj.label;
    std::string name = r.property;
    for (char& c : name)
        if (c == '/' || c == '\\') c = '_';
    const fs::path file = dir / (name + "-" + std::to_string(index) + ".json");
    nlohmann::json doc;
    if (level == Level::Operation) {
        doc = prop::replay_document(r);
    } else {
        doc = {{"kvcheck_replay", 1},
               {"level", "model"},
               {"id", r.id},
               {"property", r.property},
               {"seed", r.seed},
               {"expected_failure", r.reason},
               {"case_text", case_text}};
        if (!r.model_case.is_null()) { // the case as run: replayed exactly, even when shrinking made it
            doc["case"] = r.model_case;
            doc["shrink_steps"] = r.shrink_steps;
        }
    }
    doc["verdict"] = prop::verdict_name(r.verdict);
    doc["run_seed"] = run_seed;
    doc["kvcheck_version"] = KVCHECK_VERSION;
    doc["implementation"] = {{"name", level == Level::Model && subj.model ? subj.model->name : subj.target.name},
                             {"origin", subj.target.origin}};
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) error = "cannot create " + dir.string() + ": " + ec.message();
    else if (write_file_atomically(file.string(), dump_json(doc, 2) + "\n", error)) return file.string();
    return "";
}

ReplayDocument read_replay(const std::string& path) {
    nlohmann::json j; // bounded, regular files only, strict (input_file.hpp): /dev/zero, 1e400, duplicate keys
    try {
        j = read_json_file(path);
    } catch (const InputError& e) {
        throw BadInput(e.what());
    }
    if (!j.is_object() || !j.contains("kvcheck_replay"))
        throw BadInput(path + ": not a kvcheck replay document (no \"kvcheck_replay\" field)");
    if (j["kvcheck_replay"] != 1)
        throw BadInput(path + ": replay document version " + j["kvcheck_replay"].dump() + ", this kvcheck reads 1");
    ReplayDocument d;
    if (!j.contains("property") || !j["property"].is_string())
        throw BadInput(path + ": missing string field \"property\"");
    d.property_id = j["property"].get<std::string>();
    if (j.contains("level")) {
        if (j["level"] == "model") d.level = Level::Model;
        else if (j["level"] != "operation")
            throw BadInput(path + ": \"level\" is " + j["level"].dump() + ", expected \"operation\" or \"model\"");
    }
    try {
        d.id = printable(j.value("id", d.property_id + "/?")); // shown on the terminal: no control characters
        d.recorded_verdict = j.value("verdict", std::string("FAIL"));
        if (!prop::verdict_from_name(d.recorded_verdict))
            throw BadInput(path + ": \"verdict\" is \"" + printable(d.recorded_verdict) + "\", not a verdict name");
        d.recorded_reason = printable(j.value("expected_failure", std::string()), true); // shown, like the id
        d.case_text = j.value("case_text", std::string());
        if (d.level == Level::Model) {
            const auto& ids = model::model_property_ids();
            if (std::find(ids.begin(), ids.end(), d.property_id) == ids.end())
                throw BadInput(path + ": unknown model-level property \"" + d.property_id +
                               "\" (kvcheck list shows the properties)");
            if (!j.contains("seed") || !j["seed"].is_number_unsigned())
                throw BadInput(path + ": a model-level case needs its case seed: an integer field \"seed\"");
            d.seed = j["seed"].get<uint64_t>();
            if (j.contains("case")) { // without it, the case is drawn again from the seed
                d.model_case = model::case_from_json(j["case"]);
                if (d.model_case->seed != d.seed)
                    throw BadInput(path + ": the case's seed " + std::to_string(d.model_case->seed) +
                                   " is not the case seed " + std::to_string(d.seed) + " (\"seed\")");
            }
            if (j.contains("shrink_steps")) {
                if (!j["shrink_steps"].is_number_unsigned() || j["shrink_steps"].get<uint64_t>() > INT32_MAX)
                    throw BadInput(path + ": \"shrink_steps\" is " + j["shrink_steps"].dump() +
                                   ", expected an integer from 0 to " + std::to_string(INT32_MAX));
                d.shrink_steps = static_cast<int>(j["shrink_steps"].get<uint64_t>());
            }
            return d;
        }
        d.property = prop::find_property(d.property_id);
        if (!d.property)
            throw BadInput(path + ": unknown property \"" + d.property_id + "\" (kvcheck list shows the properties)");
        if (!j.contains("case")) throw BadInput(path + ": missing object \"case\"");
        d.c = prop::case_from_json(j["case"]);
        if (d.c.ops.empty()) throw BadInput(path + ": the case has no operation (\"case\".\"ops\" is empty)");
        if (j.contains("seed") && !j["seed"].is_number_unsigned())
            throw BadInput(path + ": \"seed\" is " + j["seed"].dump() + ", expected an integer from 0 to 2^64 - 1");
        d.seed = j.value("seed", uint64_t{0});
        if (j.contains("expected_mismatch")) d.recorded_mismatch = prop::mismatch_from_json(j["expected_mismatch"]);
    } catch (const std::invalid_argument& e) {
        throw BadInput(path + ": malformed " + e.what());
    } catch (const nlohmann::json::exception& e) {
        throw BadInput(path + ": malformed field (" + std::string(e.what()) + ")");
    }
    return d;
}

} // namespace kvc::harness

// ---------------------------------------------------------------------------------------------------------------
// replay: one recorded case again, in its own child process.

#include "kvcheck/harness/case_run.hpp"
#include "kvcheck/harness/console.hpp"
#include "kvcheck/harness/run.hpp"
#include "kvcheck/harness/verdicts.hpp"
#include "kvcheck/model/model_case.hpp"

#include <iostream>

namespace kvc::harness {

int replay(const ReplayOptions& o) {
    check_timeout(o.timeout);
    const ReplayDocument d = read_replay(o.file);
    const std::vector<Subject> subjects = subjects_of(o.plugin, o.builtin, o.connect, false, o.iso());
    const Subject& subj = subjects[0];
    if (!subj.has(d.level))
        throw BadInput(o.file + " is a " + level_name(d.level) + "-level case, and " + subj.target.origin +
                       " exports no " + level_name(d.level) + "-level table (" +
                       (d.level == Level::Model ? KVCM_ENTRY_SYMBOL : KVC_ENTRY_SYMBOL) + ")");
    std::cout << "kvcheck " KVCHECK_VERSION " replay " << o.file << "\n" << subject_header(subj);
    std::cout << "case " << d.id << " of " << (d.level == Level::Model ? "model-level property " : "property ")
              << d.property_id << " (case seed " << d.seed << ")\n";
    if (!d.recorded_reason.empty()) std::cout << "recorded: " << d.recorded_verdict << ": " << d.recorded_reason << "\n";
    if (d.recorded_mismatch)
        std::cout << "recorded first mismatch: " << prop::mismatch_text(*d.recorded_mismatch) << "\n";
    // A model-level case is the file's, run as it is; a file without one has its case drawn again from the seed
    // inside the caps declared now (here: no plugin code runs).
    if (d.model_case && d.shrink_steps > 0)
        std::cout << "the recorded case, shrunk in " << d.shrink_steps << " steps from the case drawn from seed "
                  << d.seed << ":\n";
    else if (d.level == Level::Model && !d.model_case)
        std::cout << "the case drawn from seed " << d.seed << " (the file records no case):\n";
    std::cout << indent(d.level == Level::Operation ? prop::describe(d.c)
                        : d.model_case          ? d.model_case->describe()
                                                : model::draw_case(d.seed, subj.model->caps).describe(),
                        "  ");
    const CaseRun run = d.level == Level::Model
                            ? replay_model_case_isolated(subj, d.property_id, d.id, d.seed, d.model_case, o.timeout)
                            : replay_isolated(subj, *d.property, d.c, d.id, d.seed, o.timeout);
    const prop::CaseResult& r = run.result;
    std::cout << "verdict: " << prop::verdict_name(r.verdict) << "\n";
    if (!r.reason.empty()) std::cout << "reason: " << r.reason << "\n";
    if (r.mismatch) std::cout << "first mismatch: " << prop::mismatch_text(*r.mismatch) << "\n";
    for (const std::string& n : r.notes) std::cout << "note: " << n << "\n";
    if (!run.output.empty()) std::cout << "the implementation wrote:\n" << indent(run.output, "  | ");
    return conformant(r.verdict) ? kExitOk : kExitNotConformant;
}

} // namespace kvc::harness
