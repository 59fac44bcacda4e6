#include "kvcheck/harness/case_run.hpp"

#include "kvcheck/harness/child.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/strict_json.hpp"
#include "kvcheck/harness/verdicts.hpp"
#include "kvcheck/model/model_case.hpp"
#include "kvcheck/model/model_shrink.hpp"

#include "lent.hpp"

#include <algorithm>
#include <csignal>
#include <optional>
#include <sstream>

namespace kvc::harness {

using prop::Verdict;

namespace {

// What the case process wrote to its result pipe: the last provisional ("P", a FAIL before shrinking) and final ("F")
// results, operator new's "M" marker (an allocation the memory limit refused), the lent buffers' fault handler's "G"
// line (an access into a protected guard, just before the process dies of it), and the last thing that was not the
// protocol, if any.
struct PipeContents {
    std::optional<prop::CaseResult> provisional, final_result;
    bool allocation_refused = false;
    std::string guard_fault;
    std::string unreadable;
};

PipeContents read_pipe(const std::string& bytes) {
    PipeContents pipe;
    std::istringstream lines(bytes);
    for (std::string line; std::getline(lines, line);) {
        if (line == "M") {
            pipe.allocation_refused = true;
            continue;
        }
        if (line.size() > 2 && line[0] == prop::kGuardFaultTag && line[1] == ' ') {
            pipe.guard_fault = line.substr(2);
            continue;
        }
        if (line.size() < 2 || (line[0] != 'P' && line[0] != 'F') || line[1] != ' ') {
            pipe.unreadable = "unexpected line from the case process";
            continue;
        }
        try {
            prop::CaseResult r = prop::case_result_from_json(json_strict::parse(line.substr(2)));
            (line[0] == 'F' ? pipe.final_result : pipe.provisional) = std::move(r);
        } catch (const std::exception& e) {
            pipe.unreadable = e.what();
        }
    }
    return pipe;
}

// Which result to trust, given how the process ended: the final one, else the unshrunk failure, else a verdict made
// from the ending itself (CRASH, TIMEOUT, ERROR). A flooded pipe's results are never trusted.
prop::CaseResult result_of(const ChildRun& run, const PipeContents& pipe, const prop::CaseResult& fresh,
                           const std::function<prop::Case()>& the_case, double timeout_s) {
    const auto make_case = [&] { return the_case ? the_case() : prop::Case{}; };
    std::string ending; // how the child ended, in words, when it did not end normally
    if (run.end != ChildRun::End::Exited || run.code != 0) ending = "the case process " + ending_text(run, timeout_s);
    if (!pipe.guard_fault.empty())
        ending += ": " + pipe.guard_fault + ": " + prop::kGuardFaultRule;
    if (run.end == ChildRun::End::Exited && run.code != 0 && run.code != kBodyThrew && run.code != kExecFailed)
        ending = "the implementation ended the process (exit status " + std::to_string(run.code) +
                 ") before the case finished";
    const bool flooded = run.end == ChildRun::End::Flooded;

    prop::CaseResult r = fresh;
    if (pipe.final_result && !flooded) {
        r = *pipe.final_result;
        // The JSON carries the case only for FAIL (the shrunk one); any other verdict is about the case as generated.
        if (!conformant(r.verdict) && r.verdict != Verdict::Fail) r.counterexample = make_case();
    } else if (pipe.provisional && !flooded) {
        // it failed, then shrinking crashed or hung (or ended the process): keep the unshrunk failure
        r = *pipe.provisional;
        r.notes.push_back("not shrunk: while shrinking, " +
                          (ending.empty() ? std::string("the case process ended without a final result") : ending));
    } else {
        r.counterexample = make_case();
        if (run.end == ChildRun::End::Signaled) {
            r.verdict = Verdict::Crash;
            r.reason = ending;
        } else if (run.end == ChildRun::End::TimedOut) {
            r.verdict = Verdict::Timeout;
            r.reason = ending;
        } else if (run.end == ChildRun::End::Exited && run.code != kBodyThrew && run.code != kExecFailed &&
                   pipe.unreadable.empty()) {
            // exit() inside a case, whatever its status (0 too): the implementation ended the process
            r.verdict = Verdict::Crash;
            r.reason = "the implementation ended the process (exit status " + std::to_string(run.code) +
                       ") before the case finished";
        } else {
            r.verdict = Verdict::Error;
            r.reason = !ending.empty() ? ending
                                       : "the case process ended without a readable result" +
                                             (pipe.unreadable.empty() ? std::string() : " (" + pipe.unreadable + ")");
        }
    }
    // Bytes that are not the protocol beside a readable result: something other than kvcheck's case process wrote to
    // its result pipe (the implementation can reach the descriptor), so the result on it is not trusted.
    if (!pipe.unreadable.empty() && (pipe.final_result || pipe.provisional) && !flooded) {
        r.notes.push_back(std::string("the result the pipe also carried: ") + prop::verdict_name(r.verdict));
        r.verdict = Verdict::Error;
        r.reason = "the case process ended without a readable result: its result pipe also carried bytes that are "
                   "not the protocol (" + pipe.unreadable + "), so the result on it is not trusted";
        // nothing of it stays but the note: no headroom, failed property or mismatch the implementation may have made
        r.headroom = 0;
        r.failed_property.clear();
        r.mismatch.reset();
        r.counterexample = make_case();
    }
    return r;
}

// The memory limit: an allocation it refused (the "M" marker: kvcheck's operator new, or the implementation's
// allocator failing with ENOMEM, or the address space reaching the limit; child.cpp) is an ERROR naming the limit,
// not the implementation's fault as such. A KVC_ERR_OUT_OF_MEMORY without it is the implementation's own word (its
// blocks or context ran out): its message is the reason, and the limit only a note. By flag, never by searching the
// reason: an implementation's message text could say anything.
void apply_memory_limit(prop::CaseResult& r, bool allocation_refused, uint64_t memory_limit, bool memory_limit_asked) {
    if (!memory_limit || conformant(r.verdict)) return;
    if (allocation_refused) {
        r.reason = "the case exceeded its memory limit of " + bytes_text(memory_limit) +
                   " (address space; --memory-limit): " + r.reason;
        r.verdict = Verdict::Error;
    } else if (r.out_of_memory) {
        r.notes.push_back("the implementation reported OUT_OF_MEMORY on its own: no allocation reached the memory "
                          "limit of " + bytes_text(memory_limit) + " (--memory-limit), so raising it will not help");
    } else if (r.verdict == Verdict::Crash && memory_limit_asked) {
        r.notes.push_back("a memory limit of " + bytes_text(memory_limit) +
                          " was in force (--memory-limit); an allocation it refused may be the cause");
    }
}

} // namespace

prop::CaseResult interpret(const ChildRun& run, const prop::CaseResult& fresh,
                           const std::function<prop::Case()>& the_case, double timeout_s, uint64_t memory_limit,
                           bool memory_limit_asked) {
    PipeContents pipe = read_pipe(run.result);
    // The fault handler speaks only as the process dies of the fault: a "G" line from a process that did not is not
    // kvcheck's, and is treated as any other line that is not the protocol.
    if (!pipe.guard_fault.empty() && !(run.end == ChildRun::End::Signaled && run.code == SIGSEGV)) {
        pipe.guard_fault.clear();
        pipe.unreadable = "unexpected line from the case process";
    }
    prop::CaseResult r = result_of(run, pipe, fresh, the_case, timeout_s);
    apply_memory_limit(r, pipe.allocation_refused, memory_limit, memory_limit_asked);
    r.reason = printable(r.reason, true);
    return r;
}

CaseRun run_case_isolated(const Subject& subj, const prop::Property& p, const prop::RunSettings& s, int index,
                          double timeout_s, const std::string& unshrunk_note) {
    nlohmann::json req = request_for(subj, "case");
    req["property"] = p.id;
    req["index"] = index;
    req["run_seed"] = s.seed;
    req["cases"] = s.cases;
    req["max_shrink_runs"] = s.max_shrink_runs;
    req["unshrunk_note"] = unshrunk_note;
    req["id"] = prop::case_id(p.id, index);
    req["seed"] = prop::case_seed(s.seed, p.id, index);
    const ChildRun run = run_isolated(subj, req, timeout_s);
    prop::CaseResult fresh;
    fresh.id = prop::case_id(p.id, index);
    fresh.property = p.id;
    fresh.seed = prop::case_seed(s.seed, p.id, index);
    const auto generate = [&] { return prop::generate_case(p, s, index, &subj.target.caps); };
    CaseRun out{interpret(run, fresh, generate, timeout_s, subj.memory_limit, subj.memory_limit_asked),
                printable(run.output, true), Level::Operation, ""};
    if (!conformant(out.result.verdict)) out.case_text = prop::describe(out.result.counterexample);
    return out;
}

std::vector<std::optional<CaseRun>> run_cases_batched(const Subject& subj, const std::vector<BatchItem>& items,
                                                      const prop::RunSettings& s, double timeout_s) {
    std::vector<std::optional<CaseRun>> out(items.size());
    if (items.empty()) return out;
    nlohmann::json req = request_for(subj, "cases");
    req["run_seed"] = s.seed;
    req["cases"] = s.cases;
    nlohmann::json list = nlohmann::json::array();
    for (const BatchItem& it : items) list.push_back({{"property", it.property->id}, {"index", it.index}});
    req["items"] = std::move(list);
    const ChildRun run = run_isolated(subj, req, timeout_s * static_cast<double>(items.size()));
    if (run.end == ChildRun::End::Flooded) return out; // nothing on a flooded pipe is trusted: every case runs alone
    // Line i must be case i's final result. A readable result that is not conformant leaves its case to run alone
    // and the next line is read; anything else (the memory limit's marker, bytes that are not the protocol, a result
    // out of order) ends the trust in this pipe, and every case from there runs alone.
    std::istringstream lines(run.result);
    std::size_t next = 0;
    for (std::string line; next < items.size() && std::getline(lines, line); ++next) {
        if (line.size() < 2 || line[0] != 'F' || line[1] != ' ') break;
        prop::CaseResult r;
        try {
            r = prop::case_result_from_json(json_strict::parse(line.substr(2)));
        } catch (const std::exception&) {
            break;
        }
        const BatchItem& it = items[next];
        if (r.id != prop::case_id(it.property->id, it.index) || r.property != it.property->id) break;
        if (conformant(r.verdict)) {
            r.reason = printable(r.reason, true);
            out[next] = CaseRun{std::move(r), "", Level::Operation, ""};
        }
    }
    // the cases after the one where the batch ended (or stopped being trusted) were not reached
    out.resize(std::min(items.size(), next + 1));
    return out;
}

CaseRun replay_isolated(const Subject& subj, const prop::Property& p, const prop::Case& c, const std::string& id,
                        uint64_t seed, double timeout_s) {
    nlohmann::json req = request_for(subj, "replay");
    req["property"] = p.id;
    req["case"] = prop::to_json(c);
    req["id"] = id;
    req["seed"] = seed;
    const ChildRun run = run_isolated(subj, req, timeout_s);
    prop::CaseResult fresh;
    fresh.id = id;
    fresh.property = p.id;
    fresh.seed = seed;
    return {interpret(run, fresh, [&] { return c; }, timeout_s, subj.memory_limit, subj.memory_limit_asked),
            printable(run.output, true), Level::Operation, prop::describe(c)};
}

namespace {

// A model-level case in a child: `given` when set, else the one drawn from the case seed; a FAIL shrunk with at most
// max_shrink_runs runs. The result's model_case and the case text are the case as run: the child's (the shrunk one),
// read with the reader of replay files; else the one asked for, made here (no plugin code runs in the parent).
CaseRun model_case_isolated(const Subject& subj, const std::string& property, const std::string& id,
                            uint64_t case_seed, double timeout_s, const std::optional<model::ModelCase>& given,
                            int max_shrink_runs, const std::string& unshrunk_note) {
    nlohmann::json req = request_for(subj, "model_case");
    req["property"] = property;
    req["id"] = id;
    req["seed"] = case_seed;
    if (given) req["case"] = model::to_json(*given);
    req["max_shrink_runs"] = max_shrink_runs;
    req["unshrunk_note"] = unshrunk_note;
    const ChildRun run = run_isolated(subj, req, timeout_s);
    prop::CaseResult fresh;
    fresh.id = id;
    fresh.property = property;
    fresh.seed = case_seed;
    CaseRun out{interpret(run, fresh, nullptr, timeout_s, subj.memory_limit, subj.memory_limit_asked),
                printable(run.output, true), Level::Model, ""};
    prop::CaseResult& r = out.result;
    if (conformant(r.verdict)) return out;
    std::optional<model::ModelCase> c;
    if (!r.model_case.is_null()) {
        try {
            c = model::case_from_json(r.model_case);
            if (c->seed != case_seed)
                throw std::invalid_argument("its seed " + std::to_string(c->seed) + " is not the case seed");
        } catch (const std::invalid_argument& e) {
            c.reset();
            r.notes.push_back(std::string("the result the case process sent: ") + prop::verdict_name(r.verdict));
            r.verdict = Verdict::Error;
            r.reason = std::string("the case process sent a model-level case kvcheck cannot read (") + e.what() +
                       "), so its result is not trusted";
        }
    }
    if (!c && given) c = given;
    if (!c && subj.model) c = model::draw_case(case_seed, subj.model->caps);
    if (c) {
        r.model_case = model::to_json(*c);
        out.case_text = c->describe();
    }
    return out;
}

} // namespace

CaseRun run_model_case_isolated(const Subject& subj, const std::string& property, const std::string& id,
                                uint64_t case_seed, double timeout_s, const std::string& unshrunk_note) {
    return model_case_isolated(subj, property, id, case_seed, timeout_s, std::nullopt,
                               unshrunk_note.empty() ? model::kMaxShrinkRuns : 0, unshrunk_note);
}

CaseRun replay_model_case_isolated(const Subject& subj, const std::string& property, const std::string& id,
                                   uint64_t case_seed, const std::optional<model::ModelCase>& given,
                                   double timeout_s) {
    return model_case_isolated(subj, property, id, case_seed, timeout_s, given, 0, "");
}

uint64_t model_case_seed(uint64_t run_seed, const std::string& property, int index) {
    return prop::case_seed(run_seed, property, index);
}

} // namespace kvc::harness
