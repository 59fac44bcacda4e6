// Running cases: generate case `index` of a property from a seed, run it against a target, shrink a failure to a
// minimal counterexample, and say what happened as a verdict. Process isolation (CRASH, TIMEOUT) is the caller's
// business: the CLI runs each case in a child process; the tests run in-process.
#pragma once

#include "kvcheck/properties/properties.hpp"
#include "kvcheck/properties/session.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace kvc::prop {

enum class Verdict { Pass, Fail, NotSupported, QualityWarning, Error, Crash, Timeout };
const char* verdict_name(Verdict v); // "PASS", "FAIL", ...
std::optional<Verdict> verdict_from_name(const std::string& s);

// A passing case whose worst error uses more than this fraction of its bound is a QUALITY_WARNING.
constexpr double kQualityWarningHeadroom = 0.5;

struct CaseResult {
    std::string id;       // "EQUIV/17": property / case index
    std::string property; // the property the case belongs to
    Verdict verdict = Verdict::Pass;
    std::string reason;   // why, in words (empty on PASS)
    std::string failed_property; // on FAIL: the property that failed (the case's own)
    double headroom = 0;  // error / allowed of the worst graded output
    std::optional<Mismatch> mismatch; // first mismatch, logical coordinates
    uint64_t seed = 0;    // the case's own seed (from the run seed, property and index)
    Case counterexample;  // the case as run (shrunk on FAIL)
    int shrink_steps = 0; // accepted shrinks
    std::vector<std::string> notes;
    // An allocation was refused during the case: a call returned KVC_ERR_OUT_OF_MEMORY, or kvcheck's own operator
    // new threw std::bad_alloc. Under --memory-limit the harness reads that as the limit, not as the
    // implementation's fault (harness/case_run.cpp); carried as a flag so no message text can fake or hide it.
    bool out_of_memory = false;
    // A quantized cache: the largest error of its outputs against attention over the unquantized rows, relative to
    // max |v| (what quantizing loses). Informative, never graded; -1 when not measured. JSON "quantization_loss".
    double quant_loss = -1;
    // ABI 1.3, where the implementation declares pipeline rules: which declarations graded the case's outputs
    // ("pipeline rule 2 (f16, n >= 64)", "the default pipeline"); empty otherwise. JSON "graded_by". A failure's
    // reason names the one that graded the failing call.
    std::vector<std::string> graded_by;
    // The case needs a capability the implementation does not declare (a feature, a dtype, a shape beyond its
    // limits): it tested nothing, so it is no verdict. Reports count such cases apart from the verdicts; the verdict
    // field stays NOT_SUPPORTED for readers that know only verdicts. JSON "outside_declaration".
    bool outside_declaration = false;
    // Model level: the case as run (on FAIL the shrunk one), in kvc::model's JSON form (model/model_case.hpp, which
    // reads it strictly; this library only carries it); null otherwise. JSON "model_case".
    nlohmann::json model_case;
};

struct RunSettings {
    uint64_t seed = 20261129;
    int cases = 200;       // per property: sizes ramp over the indices as RapidCheck does
    int max_shrink_runs = 300; // per failing case; 0: report failures as generated
};

std::string case_id(const std::string& property, int index);
uint64_t case_seed(uint64_t run_seed, const std::string& property, int index);

// The case `index` of `p`, drawn from every capability (so undeclared ones come out NOT_SUPPORTED) but within the
// size limits of `limits` when given (a limit is a size to respect, not a feature to skip on).
Case generate_case(const Property& p, const RunSettings& s, int index, const kvc_caps* limits = nullptr);

// The result of a case that needs a capability caps do not declare (outside_declaration set), or nullopt. Runs no
// implementation code, so a parent process decides it without starting a child.
std::optional<CaseResult> outside_declaration(const kvc_caps& caps, const Property& p, const Case& c);

// Runs one given case (no shrinking). Never throws for anything the implementation does.
CaseResult evaluate_case(const Target& t, const Property& p, const Case& c);

// generate_case + evaluate_case, and on FAIL a greedy walk down RapidCheck's shrink tree to a smaller failing case.
CaseResult run_case(const Target& t, const Property& p, const RunSettings& s, int index);

// The shrinking half of run_case: `first` is evaluate_case of case `index` as generated (id and seed set). Returns
// it unchanged unless it is a FAIL; at most s.max_shrink_runs candidates are evaluated.
CaseResult shrink_case(const Target& t, const Property& p, const RunSettings& s, int index, CaseResult first);

// JSON has no NaN or infinity, and a failing output is often exactly that. Every JSON kvcheck writes spells a
// non-finite number as a string: "NaN", "Infinity" or "-Infinity" (the sign of a NaN is not kept); finite numbers
// stay numbers. json_number writes that form; number_from_json reads it back (and plain numbers), and throws
// std::invalid_argument for anything else.
nlohmann::json json_number(double x);
double number_from_json(const nlohmann::json& j);

// Mismatch::describe with non-finite values spelled as in JSON (NaN, Infinity, -Infinity), for every text kvcheck
// prints: stdout, the reports' "text" fields, JUnit.
std::string mismatch_text(const Mismatch& m);

// A mismatch: {what, op, seq, layer, pos, head, dim, expected, actual, text}, values in the form above.
nlohmann::json to_json(const Mismatch& m);
Mismatch mismatch_from_json(const nlohmann::json& j); // throws std::invalid_argument

// Everything a CaseResult holds, numbers in the form above.
nlohmann::json to_json(const CaseResult& r);
CaseResult case_result_from_json(const nlohmann::json& j); // throws std::invalid_argument

// Replay files: a case and the property it checks, readable by `kvcheck replay`, with the recorded mismatch (when
// there was one) in the JSON form of to_json.
nlohmann::json replay_document(const CaseResult& r);

} // namespace kvc::prop
