// validate: the orchestration of one run, the same for both levels. Chooses the cases (selection.hpp), runs each in
// a child (case_run.hpp), counts the verdicts (verdicts.hpp), prints what did not pass (console.hpp), writes its
// replay file (replay.hpp) and the reports (report.hpp).
#include "kvcheck/harness/run.hpp"

#include "kvcheck/harness/case_run.hpp"
#include "kvcheck/harness/console.hpp"
#include "kvcheck/harness/errors.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/harness/replay.hpp"
#include "kvcheck/harness/report.hpp"
#include "kvcheck/harness/selection.hpp"
#include "kvcheck/harness/verdicts.hpp"

#include "kvcheck/model/model_properties.hpp"

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

namespace kvc::harness {
namespace {

using prop::Verdict;

constexpr int kFullReportsPerProperty = 3; // failures printed in full per property; the rest get one line each

// The cases of one implementation: those of each level it exports and the run asks for.
std::vector<CaseRef> cases_of(const Subject& s, const Selection& sel, const std::string& level) {
    std::vector<CaseRef> out;
    if (s.operation && level != "model") out = sel.operation;
    if (s.model && level != "operation") out.insert(out.end(), sel.model.begin(), sel.model.end());
    return out;
}

// --cases-per-process: the conformant results that batches gave for one implementation's operation-level cases,
// asked for in case-list order. take(k) starts a batch at case k when no batch has been offered k yet.
class Batches {
  public:
    Batches(const Subject& subj, const std::vector<CaseRef>& cases, const prop::RunSettings& settings,
            double timeout_s, int per_process)
        : subj_(subj), cases_(cases), settings_(settings), timeout_s_(timeout_s), per_process_(per_process),
          on_(per_process > 1) {}

    // Case k's result from a batch, or nullopt: then it runs alone. `processes` counts the batches started.
    std::optional<CaseRun> take(std::size_t k, uint64_t& processes) {
        if (on_ && k >= offered_) run_from(k, processes);
        const auto it = kept_.find(k);
        if (it == kept_.end()) return std::nullopt;
        std::optional<CaseRun> r = std::move(it->second);
        kept_.erase(it);
        return r;
    }

  private:
    void run_from(std::size_t k, uint64_t& processes) {
        std::vector<BatchItem> items;
        for (std::size_t i = k; i < cases_.size() && cases_[i].level == Level::Operation &&
                                items.size() < static_cast<std::size_t>(per_process_);
             ++i)
            items.push_back({cases_[i].property, cases_[i].index});
        std::vector<std::optional<CaseRun>> got = run_cases_batched(subj_, items, settings_, timeout_s_);
        ++processes;
        bool kept = false;
        // a case outside the declaration is the parent's to decide (validate), never taken from a batch: it must not
        // keep the batching on against an implementation that fails every case it declares
        for (std::size_t i = 0; i < got.size(); ++i)
            if (got[i] && !got[i]->result.outside_declaration) {
                kept_.emplace(k + i, std::move(*got[i]));
                kept = true;
            }
        on_ = kept; // a batch that kept nothing ends the batching: against an implementation that fails or crashes
                    // every case, batches would only double the processes
        offered_ = k + got.size(); // the cases the batch did not reach go to the next batch
    }

    const Subject& subj_;
    const std::vector<CaseRef>& cases_;
    const prop::RunSettings& settings_;
    double timeout_s_;
    int per_process_;
    bool on_;
    std::size_t offered_ = 0;             // the cases before this one have been offered to a batch
    std::map<std::size_t, CaseRun> kept_; // case k -> its conformant result from a batch
};

// The informative quantization loss of a property's cases (prop::CaseResult::quant_loss): how many cases carry
// one, their median and their largest; null when none does (no quantized case ran).
nlohmann::json quantization_loss_summary(const nlohmann::json& case_list, const std::string& property) {
    std::vector<double> v;
    for (const nlohmann::json& c : case_list)
        if (c.value("property", "") == property && c.contains("quantization_loss") &&
            c["quantization_loss"].is_number())
            v.push_back(c["quantization_loss"].get<double>());
    if (v.empty()) return nullptr;
    std::sort(v.begin(), v.end());
    return {{"cases", v.size()}, {"median", v[v.size() / 2]}, {"max", v.back()}};
}

std::string quantization_loss_text(const nlohmann::json& loss) {
    std::ostringstream s;
    s.precision(3);
    s << loss["cases"].get<std::size_t>() << " quantized cases, outputs against attention over the unquantized rows "
      << "(relative to max|v|): median " << loss["median"].get<double>() << ", max " << loss["max"].get<double>();
    return s.str();
}

} // namespace

int validate(const ValidateOptions& o) {
    check_timeout(o.timeout);
    const uint64_t seed = parse_seed(o.seed_text);
    const int shrink_first = parse_shrink_first(o.shrink_first_text);
    const Shard shard = o.shard.empty() ? Shard{} : parse_shard(o.shard);
    const Selection sel = select_cases(o.profile, o.cases, o.filter, shard);
    const auto no_case = [&] {
        std::string ids;
        for (const prop::Property& p : prop::properties()) ids += " " + p.id;
        for (const std::string& id : model::model_property_ids()) ids += " " + id;
        return BadInput("--filter " + o.filter + " selects no case of profile " + o.profile + " (properties:" + ids +
                        "; case ids are PROPERTY/INDEX)");
    };
    if (sel.operation_before_shard + sel.model_before_shard == 0) throw no_case();
    std::string error;
    for (const std::string* path : {&o.report, &o.junit})
        if (!path->empty() && !can_create_file(*path, error)) throw BadInput("cannot write the report " + error);
    if (!o.report.empty() && !o.junit.empty() && same_file(o.report, o.junit))
        throw BadInput("--report and --junit name the same file");
    if (!can_create_directory(o.counterexamples, error)) throw BadInput("cannot write counterexamples: " + error);
    // checked before the run: the directory would be made at the first replay file, and the report then fail on it
    for (const auto& [option, path] : {std::pair{"--report", &o.report}, std::pair{"--junit", &o.junit}})
        if (!path->empty() && same_file(o.counterexamples, *path))
            throw BadInput(std::string("--counterexamples ") + o.counterexamples + " and " + option + " " + *path +
                           " name the same path");
    std::vector<Skipped> skipped;
    const std::vector<Subject> subjects = subjects_of(o.plugin, o.builtin, o.connect, true, o.iso(), &skipped);
    const bool several = subjects.size() > 1;
    for (const Subject& s : subjects) {
        if (o.level == "model" && !s.model)
            throw BadInput(s.target.origin + " exports no model-level table (" KVCM_ENTRY_SYMBOL "); --level model "
                           "needs one");
        if (o.level == "operation" && !s.operation)
            throw BadInput(s.target.origin + " exports no operation-level table (" KVC_ENTRY_SYMBOL
                           "); --level operation needs one");
    }
    // The levels that run, and the counts of the selection line, over every implementation's levels.
    bool any_model = false;
    std::size_t selected = 0, unsharded = 0;
    {
        bool op = false, mod = false;
        for (const Subject& s : subjects) {
            op = op || (s.operation && o.level != "model");
            mod = mod || (s.model && o.level != "operation");
        }
        any_model = mod;
        if (op) {
            selected += sel.operation.size();
            unsharded += sel.operation_before_shard;
        }
        if (mod) {
            selected += sel.model.size();
            unsharded += sel.model_before_shard;
        }
    }
    if (unsharded == 0) throw no_case();

    prop::RunSettings settings;
    settings.seed = seed;
    settings.cases = o.cases;

    std::cout << "kvcheck " KVCHECK_VERSION " validate: seed " << seed << ", profile " << o.profile << ", "
              << o.cases << " cases per property, timeout " << o.timeout << " s per case\n";
    std::cout << "selected " << selected << " of " << unsharded << " cases";
    if (!o.filter.empty()) std::cout << " (filter " << o.filter << ")";
    if (!o.shard.empty()) std::cout << " in shard " << shard.index << "/" << shard.count;
    std::cout << "\n";
    std::cout << "rerun: kvcheck validate "
              << (o.plugin.empty() && o.connect.empty() ? "--builtin " + o.builtin : subjects[0].target_args)
              << " --seed " << seed << " --profile " << o.profile << " --cases " << o.cases;
    if (o.level != "auto") std::cout << " --level " << o.level;
    if (!o.filter.empty()) std::cout << " --filter " << shell_quote(o.filter);
    if (!o.shard.empty()) std::cout << " --shard " << o.shard;
    if (o.shrink_first_text != "3") std::cout << " --shrink-first " << shell_quote(o.shrink_first_text);
    if (o.cases_per_process > 1) std::cout << " --cases-per-process " << o.cases_per_process;
    std::cout << isolation_args(o.iso()) << "\n";

    nlohmann::json levels = nlohmann::json::array();
    for (const Level l : {Level::Operation, Level::Model})
        for (const Subject& s : subjects)
            if (s.has(l) && o.level != (l == Level::Model ? "operation" : "model")) {
                levels.push_back(level_name(l));
                break;
            }
    nlohmann::json report = {
        {"kvcheck_report", kReportSchema},
        {"tool", {{"name", "kvcheck"}, {"version", KVCHECK_VERSION}}},
        {"suite_version", KVCHECK_VERSION},
        {"abi", {{"major", KVC_ABI_VERSION_MAJOR}, {"minor", KVC_ABI_VERSION_MINOR}}},
        {"model_abi", {{"major", KVCM_ABI_VERSION_MAJOR}, {"minor", KVCM_ABI_VERSION_MINOR}}},
        {"run",
         {{"seed", seed},
          {"profile", o.profile},
          {"levels", levels},
          {"cases_per_property", o.cases},
          {"filter", o.filter.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.filter)},
          {"shard", {{"index", shard.index}, {"count", shard.count}}},
          {"selected_cases", selected},
          {"timeout_s", o.timeout},
          {"isolation", o.isolation},
          {"cases_per_process", o.cases_per_process},
          {"memory_limit", o.memory_limit},
          {"shrink_first", shrink_first >= kShrinkAll ? nlohmann::json("all") : nlohmann::json(shrink_first)}}},
        {"implementations", nlohmann::json::array()},
        {"skipped_implementations", nlohmann::json::array()}};
    // Never judged, so neither PASS nor FAIL: said on the screen and in the report, and nowhere counted.
    for (const Skipped& sk : skipped) {
        std::cout << "skipped built-in " << sk.name << ": " << sk.reason << " (not run, not counted)\n";
        report["skipped_implementations"].push_back({{"name", sk.name}, {"reason", sk.reason}});
    }

    std::size_t total_cases = 0;
    for (const Subject& subj : subjects) total_cases += cases_of(subj, sel, o.level).size();
    Progress progress(total_cases);
    std::vector<Row> rows;
    int totals[kVerdictCount] = {};
    int outside_total = 0; // cases outside the declaration, of every implementation: no verdict
    int unshrunk_failures = 0;
    std::vector<std::string> quant_lines; // the quantization loss of each property that has quantized cases
    uint64_t case_processes = 0; // processes started for cases (a batch is one; shrinking happens inside a case's)
    for (const Subject& subj : subjects) {
        const std::vector<CaseRef> cases = cases_of(subj, sel, o.level);
        progress.clear();
        std::cout << "\n" << subject_header(subj) << std::flush;
        nlohmann::json case_list = nlohmann::json::array();
        nlohmann::json outside_list = nlohmann::json::array(); // cases outside the declaration, apart from verdicts
        std::map<std::string, int> printed_in_full; // per property
        std::map<std::string, int> failures;        // per property: the first shrink_first are shrunk
        int counts[kVerdictCount] = {};
        const std::size_t first_row = rows.size();
        Batches batches(subj, cases, settings, o.timeout, o.cases_per_process);
        for (std::size_t k = 0; k < cases.size(); ++k) {
            const CaseRef& ref = cases[k];
            const std::string& pid = ref.property_id();
            if (rows.size() == first_row || rows.back().property != pid)
                rows.push_back({subj.label, pid, ref.level, ref.core(), {}, -1, {}});
            Row& row = rows.back();
            CaseRun run;
            bool shrink = true;
            // A case outside the declaration is decided here from the declared caps (harness code only): no child
            // starts for a case that cannot test anything.
            std::optional<prop::CaseResult> outside;
            if (ref.level == Level::Operation)
                outside = prop::outside_declaration(
                    subj.target.caps, *ref.property,
                    prop::generate_case(*ref.property, settings, ref.index, &subj.target.caps));
            if (outside) {
                run.result = std::move(*outside);
                run.result.id = prop::case_id(pid, ref.index);
                run.result.seed = prop::case_seed(seed, pid, ref.index);
            } else if (ref.level == Level::Operation) {
                // The parent decides before the child starts: cases run one at a time, so it knows the FAILs so far.
                shrink = failures[pid] < shrink_first;
                const std::string unshrunk_note =
                    shrink ? std::string()
                           : "not shrunk: only the first " + std::to_string(shrink_first) + " failures of " + pid +
                                 " are shrunk (--shrink-first)";
                if (std::optional<CaseRun> from_batch = batches.take(k, case_processes)) {
                    run = std::move(*from_batch);
                } else { // one process for this case alone: every non-conformant verdict is made this way
                    run = run_case_isolated(subj, *ref.property, settings, ref.index, o.timeout, unshrunk_note);
                    ++case_processes;
                }
            } else { // the same --shrink-first rule as above
                shrink = failures[pid] < shrink_first;
                run = run_model_case_isolated(subj, pid, prop::case_id(pid, ref.index),
                                              model_case_seed(seed, pid, ref.index), o.timeout,
                                              shrink ? std::string()
                                                     : "not shrunk: only the first " + std::to_string(shrink_first) +
                                                           " failures of " + pid + " are shrunk (--shrink-first)");
                ++case_processes;
            }
            const prop::CaseResult& r = run.result;
            const auto property_done = [&] {
                progress.step(subj.label, r.id);
                if (k + 1 == cases.size() || cases[k + 1].property_id() != pid)
                    progress.property_done(subj.label, pid, row);
            };
            if (r.outside_declaration) {
                add_to_row(row, r);
                ++outside_total;
                outside_list.push_back({{"id", r.id},
                                        {"property", r.property},
                                        {"level", level_name(ref.level)},
                                        {"seed", r.seed},
                                        {"reason", r.reason}});
                property_done();
                continue;
            }
            if (r.verdict == Verdict::Fail) ++failures[pid];
            if (r.verdict == Verdict::Fail && !shrink) ++unshrunk_failures;
            const int vi = verdict_index(r.verdict);
            add_to_row(row, r);
            ++counts[vi];
            ++totals[vi];
            nlohmann::json cj = prop::to_json(r);
            if (ref.level == Level::Model) {
                cj.erase("counterexample"); // the operation level's form; the model case is "model_case"
                cj.erase("counterexample_text");
            }
            cj["level"] = level_name(ref.level);
            if (!run.output.empty()) cj["implementation_output"] = run.output;
            if (!conformant(r.verdict)) {
                if (ref.level == Level::Model) {
                    cj["counterexample_text"] = run.case_text;
                } else if (!cj.contains("counterexample")) {
                    cj["counterexample"] = prop::to_json(r.counterexample);
                    cj["counterexample_text"] = run.case_text;
                }
                std::string write_error;
                const std::string file = write_counterexample(o.counterexamples, several, subj, ref.level, r,
                                                              ref.index, seed, run.case_text, write_error);
                if (file.empty()) {
                    progress.clear();
                    std::cerr << "kvcheck: warning: counterexample of " << r.id << " not written: " << write_error
                              << "\n";
                }
                std::string command;
                if (!file.empty()) {
                    command = "kvcheck replay " + shell_quote(file) + " " + subj.target_args + isolation_args(o.iso());
                    cj["replay_file"] = file;
                    cj["replay_command"] = command;
                }
                const bool full = printed_in_full[r.property]++ < kFullReportsPerProperty;
                progress.clear();
                std::cout << "\n"
                          << case_details(r, subj.label, run.case_text, run.output, command, seed, full) << std::flush;
            }
            case_list.push_back(std::move(cj));
            property_done();
        }
        nlohmann::json impl = subject_json(subj);
        nlohmann::json per_property = nlohmann::json::array();
        for (std::size_t i = first_row; i < rows.size(); ++i) {
            per_property.push_back({{"id", rows[i].property},
                                    {"level", level_name(rows[i].level)},
                                    {"core", rows[i].core},
                                    {"counts", counts_json(rows[i].counts)},
                                    {"outside_declaration", rows[i].outside},
                                    {"worst_headroom", rows[i].worst.json()},
                                    {"result", row_result(rows[i], o.shard.empty())}});
            const nlohmann::json loss = quantization_loss_summary(case_list, rows[i].property);
            if (!loss.is_null()) {
                per_property.back()["quantization_loss"] = loss;
                quant_lines.push_back(subj.label + " " + rows[i].property + ": " + quantization_loss_text(loss));
            }
        }
        impl["counts"] = counts_json(counts);
        bool untested_core = false;
        for (std::size_t i = first_row; i < rows.size(); ++i)
            untested_core = untested_core || (o.shard.empty() && core_never_ran(rows[i]));
        impl["conformant"] = nonconformant(counts) == 0 && !untested_core;
        impl["properties"] = per_property;
        impl["cases"] = std::move(case_list);
        impl["outside_declaration"] = std::move(outside_list);
        report["implementations"].push_back(std::move(impl));
    }
    progress.clear();

    bool ok = nonconformant(totals) == 0;
    for (const auto& impl : report["implementations"]) ok = ok && impl["conformant"].get<bool>();
    const int code = ok ? kExitOk : kExitNotConformant;
    report["counts"] = counts_json(totals);
    report["outside_declaration"] = outside_total;
    report["run"]["case_processes"] = case_processes;
    report["conformant"] = ok;
    report["exit_code"] = code;

    std::cout << "\nverdict table (seed " << seed << ", profile " << o.profile << ", " << o.cases
              << " cases per property" << (o.shard.empty() ? "" : ", shard " + o.shard) << ")\n";
    std::cout << verdict_table(rows, several, any_model, o.shard.empty());
    for (const std::string& l : quant_lines)
        std::cout << "quantization loss (informative, not graded), " << l << "\n";
    if (unshrunk_failures)
        std::cout << unshrunk_failures << " failures were reported unshrunk (only the first " << shrink_first
                  << " of each property are shrunk; --shrink-first N or all changes that)\n";
    if (several)
        for (const auto& impl : report["implementations"])
            std::cout << impl["label"].get<std::string>() << ": "
                      << (impl["conformant"].get<bool>() ? "CONFORMANT" : "NOT CONFORMANT") << "\n";
    std::cout << "overall: " << (ok ? "CONFORMANT" : "NOT CONFORMANT") << " (" << counts_text(totals)
              << outside_text(outside_total) << "; seed "
              << seed << ")\n";

    // both reports or neither: a half-written pair is as misleading as a half-written file
    std::vector<std::pair<std::string, std::string>> files;
    if (!o.report.empty()) files.emplace_back(o.report, dump_json(report, 2) + "\n");
    if (!o.junit.empty()) files.emplace_back(o.junit, junit_from_report(report));
    if (!files.empty() && !write_files_atomically(files, error)) {
        std::cerr << "kvcheck: " << printable(error, true) << "\n";
        return kExitInternal;
    }
    for (const auto& f : files) std::cout << "wrote " << printable(f.first) << "\n"; // a path may hold any byte
    return code;
}

} // namespace kvc::harness
