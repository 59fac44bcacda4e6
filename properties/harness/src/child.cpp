#include "kvcheck/harness/child.hpp"

#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/harness/report.hpp"
#include "kvcheck/model/model_case.hpp"
#include "kvcheck/model/model_properties.hpp"
#include "kvcheck/model/model_shrink.hpp"
#include "kvcheck/model/model_target.hpp"

#include "kvcheck/harness/builtins.hpp"
#include "kvcheck/pipe/proxy.hpp"
#include "kvcheck/properties/device_watch.hpp"
#include "kvcheck/properties/refused_allocation.hpp"
#include "kvcheck/properties/runner.hpp"

#include "lent.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <new>
#include <sstream>
#include <stdexcept>

namespace kvc::harness {
namespace {

using prop::Verdict;

uint64_t g_memory_limit = 0; // the request's memory_limit (RLIMIT_AS of this process); 0: none

// "M" (the memory limit refused an allocation) before a result that ran out of memory when the limit is the likely
// cause, in this process or (server isolation) in the served plugin's, which says so on its notes pipe.
std::string limit_marker(const prop::CaseResult& r) {
    if (!g_memory_limit || !r.out_of_memory) return "";
    if (prop::memory_limit_likely_hit(g_memory_limit) || pipe::client_notes().allocation_refused) return "M\n";
    return "";
}

void send(int fd, char tag, const prop::CaseResult& r) {
    write_all(fd, limit_marker(r) + std::string(1, tag) + " " + dump_json(prop::to_json(r)) + "\n");
}

// --connect: a client that broke the protocol (crashed, hung, sent what is not a frame) decides the verdict, whatever
// the property made of the failed call that noticed it. False when the connection is intact.
bool pipe_broke(prop::CaseResult& r) {
    const std::optional<pipe::Breakdown> b = pipe::breakdown();
    if (!b) return false;
    r.verdict = b->kind == pipe::Breakdown::Kind::Crash     ? Verdict::Crash
                : b->kind == pipe::Breakdown::Kind::Timeout ? Verdict::Timeout
                                                            : Verdict::Error;
    r.reason = b->text;
    // the breakdown is the verdict: an OUT_OF_MEMORY some earlier call returned must not let a note turn it into the
    // memory limit's ERROR (case_run.cpp, apply_memory_limit)
    r.out_of_memory = false;
    if (const std::string fault = pipe::client_notes().guard_fault;
        b->kind == pipe::Breakdown::Kind::Crash && !fault.empty())
        r.reason += ": " + printable(fault) + ": " + prop::kGuardFaultRule;
    r.failed_property.clear();
    r.mismatch.reset();
    return true;
}

// The note on a failure kept unshrunk because the client broke while shrinking: what the parent says of a case
// process that dies while shrinking (case_run.cpp), with the request the breakdown names.
std::string shrink_broke_note(const pipe::Breakdown& b) {
    std::string note = "not shrunk: while shrinking, " + b.text;
    if (const std::string fault = pipe::client_notes().guard_fault;
        b.kind == pipe::Breakdown::Kind::Crash && !fault.empty())
        note += ": " + printable(fault);
    return note;
}

int g_marker_fd = -1;

// operator new's last resort under the memory limit: say so once, then let it throw std::bad_alloc.
void report_refused_allocation() {
    static const char marker[] = "M\n";
    if (g_marker_fd >= 0 && ::write(g_marker_fd, marker, sizeof marker - 1) < 0) {
    }
    std::set_new_handler(nullptr);
}

// --connect: starts the client and completes the handshake (once per process). Throws prop::LoadError, or
// prop::PluginMisbehaved when the client broke the protocol.
void connect_in_child(const nlohmann::json& req) {
    try {
        pipe::connect(req.at("connect").get<std::string>(), req.at("reply_timeout").get<double>(),
                      req.value("served", false));
    } catch (const pipe::ConnectError& e) {
        if (e.misbehaved()) throw prop::PluginMisbehaved(e.what());
        throw prop::LoadError(e.what());
    }
}

prop::Target load_in_child(const nlohmann::json& req) {
    if (req.contains("plugin")) return prop::load_plugin(req.at("plugin").get<std::string>());
    if (req.contains("connect")) {
        connect_in_child(req);
        return prop::target_from_entry(pipe::proxy_entry, "connect:" + req.at("connect").get<std::string>());
    }
    const std::string name = req.at("builtin").get<std::string>();
    const Builtin* b = find_builtin(name);
    if (!b) throw prop::LoadError("unknown built-in \"" + name + "\"");
    try {
        return prop::target_from_entry(b->entry, "builtin:" + b->name);
    } catch (const prop::LoadError& e) {
        throw prop::LoadError(std::string("built-in ") + b->name + " cannot be used: " + e.what());
    }
}

// Which tables a plugin exports. dlopen() runs its constructors: this happens in the probe child only.
struct Exports {
    bool operation = false, model = false;
};
Exports exports_of(const std::string& path) {
    Exports e;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        e.operation = true; // prop::load_plugin says why it cannot be loaded
        return e;
    }
    e.operation = dlsym(h, KVC_ENTRY_SYMBOL) != nullptr;
    e.model = dlsym(h, KVCM_ENTRY_SYMBOL) != nullptr;
    if (!e.model) e.operation = true; // neither: prop::load_plugin names the missing symbol
    return e; // the handle stays open: the loaders below dlopen() the same library again
}

// The model-level table a case process judges: the plugin's, or, through the pipe (a served plugin that exports
// one), the proxy's. Throws model::TargetError, prop::LoadError.
model::ModelTarget model_target_in_child(const nlohmann::json& req) {
    if (req.contains("plugin")) return model::ModelTarget::from_library(req.at("plugin").get<std::string>());
    connect_in_child(req);
    return model::ModelTarget::from_entry(pipe::model_proxy_entry);
}

// The probe: what the parent needs of each exported table, or {"error", "misbehaved"}.
void probe(const nlohmann::json& req, int fd) {
    Exports ex;
    if (req.contains("plugin")) ex = exports_of(req.at("plugin").get<std::string>());
    else ex.operation = true;
    if (req.contains("connect")) {
        // The tables are the ones the client serves (from 1.5 a served plugin's model table too).
        try {
            connect_in_child(req);
        } catch (const prop::LoadError& e) {
            const bool misbehaved = dynamic_cast<const prop::PluginMisbehaved*>(&e) != nullptr;
            write_all(fd, "L " + dump_json(nlohmann::json{{"error", e.what()}, {"misbehaved", misbehaved}}) + "\n");
            return;
        }
        ex.model = pipe::model_proxy_entry(KVCM_ABI_VERSION_MAJOR, KVCM_ABI_VERSION_MINOR) != nullptr;
        ex.operation = pipe::proxy_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR) != nullptr;
    }
    nlohmann::json answer = nlohmann::json::object();
    if (ex.model) {
        try {
            const model::ModelTarget m = req.contains("connect")
                                             ? model::ModelTarget::from_entry(pipe::model_proxy_entry)
                                             : model_target_in_child(req);
            const kvcm_model_api* api = m.api();
            answer["model"] = {{"name", m.name()},
                               {"version", api->version},
                               {"abi_major", api->abi_major},
                               {"abi_minor", api->abi_minor},
                               {"caps", bytes_hex(&m.caps(), sizeof(kvcm_caps))}};
        } catch (const model::TargetError& e) {
            const std::string origin = req.contains("plugin") ? req.at("plugin").get<std::string>()
                                                              : "connect:" + req.at("connect").get<std::string>();
            answer = {{"error", origin + ": the model-level table (" KVCM_ENTRY_SYMBOL ") cannot be used: " + e.what()},
                      {"misbehaved", dynamic_cast<const model::TargetMisbehaved*>(&e) != nullptr}};
            write_all(fd, "L " + dump_json(answer) + "\n");
            return;
        }
    }
    if (ex.operation) {
        try {
            const prop::Target t =
                req.contains("connect")
                    ? prop::target_from_entry(pipe::proxy_entry, "connect:" + req.at("connect").get<std::string>())
                    : load_in_child(req);
            const kvc_plugin_api* api = t.api;
            answer["name"] = t.name;
            answer["version"] = api->version ? api->version : "(no version)";
            answer["abi_major"] = api->abi_major;
            answer["abi_minor"] = api->abi_minor;
            answer["caps"] = bytes_hex(&t.caps, sizeof t.caps);
        } catch (const prop::LoadError& e) {
            const bool misbehaved = dynamic_cast<const prop::PluginMisbehaved*>(&e) != nullptr;
            answer = {{"error", e.what()}, {"misbehaved", misbehaved}};
        }
    }
    write_all(fd, "L " + dump_json(answer) + "\n");
}

const prop::Property& property_named(const nlohmann::json& req) {
    const prop::Property* p = prop::find_property(req.at("property").get<std::string>());
    if (!p) throw std::invalid_argument("unknown property in the request");
    return *p;
}

// The run's seed and size, which a case's index is drawn with (kinds case and cases).
prop::RunSettings run_settings(const nlohmann::json& req) {
    prop::RunSettings s;
    s.seed = req.at("run_seed").get<uint64_t>();
    s.cases = req.at("cases").get<int>();
    return s;
}

// Case `index` of p as the run draws it, evaluated once (no shrinking), with its id and seed.
prop::CaseResult evaluate_generated(const prop::Target& t, const prop::Property& p, const prop::RunSettings& s,
                                    int index) {
    prop::CaseResult r = prop::evaluate_case(t, p, prop::generate_case(p, s, index, &t.caps));
    r.id = prop::case_id(p.id, index);
    r.seed = prop::case_seed(s.seed, p.id, index);
    return r;
}

prop::CaseResult fresh_result(const nlohmann::json& req) {
    prop::CaseResult r;
    r.id = req.at("id").get<std::string>();
    r.property = req.at("property").get<std::string>();
    r.seed = req.at("seed").get<uint64_t>();
    return r;
}

// One model-level case: the case the request carries ("case": a replayed one, run as it is), else the one drawn from
// the case seed. A FAIL is reported ("P", kept if shrinking crashes or hangs), then shrunk with at most
// "max_shrink_runs" runs; without them it is reported as run, with "unshrunk_note" when there is one. The case as
// run (after shrinking, the shrunk one) goes back as "model_case": the parent prints it and writes it for replay.
void model_case(const nlohmann::json& req, int fd) {
    prop::CaseResult r = fresh_result(req);
    const auto take = [&r](const model::PropertyResult& p) {
        r.verdict = p.verdict;
        // the model level's only NOT_SUPPORTED is a feature or limit the engine does not declare
        r.outside_declaration = p.verdict == Verdict::NotSupported;
        r.reason = p.verdict == Verdict::Pass ? std::string() : p.message;
        r.headroom = p.worst_headroom;
        r.out_of_memory = p.out_of_memory;
        r.shrink_steps = p.shrink_steps;
        r.failed_property = p.verdict == Verdict::Fail ? r.property : std::string();
        r.model_case = p.the_case ? model::to_json(*p.the_case) : nlohmann::json();
    };
    const auto answer = [&](char tag) {
        nlohmann::json j = prop::to_json(r);
        j.erase("counterexample"); // the operation level's form; the model case is "model_case"
        j.erase("counterexample_text");
        write_all(fd, limit_marker(r) + tag + " " + dump_json(j) + "\n");
    };
    try {
        const model::ModelTarget t = model_target_in_child(req);
        model::PropertyResult p = req.contains("case")
                                      ? model::run_model_case(t, r.property, model::case_from_json(req.at("case")))
                                      : model::run_model_property(t, r.property, r.seed, 1);
        take(p);
        // a served plugin that broke the protocol (crashed, hung, wrote what is not a frame) decides the verdict
        const bool broke = pipe_broke(r);
        const int max_shrink_runs = req.value("max_shrink_runs", 0);
        if (!broke && p.verdict == Verdict::Fail && max_shrink_runs > 0) {
            answer('P');
            const prop::CaseResult unshrunk = r;
            take(model::shrink_model_failure(t, r.property, std::move(p), max_shrink_runs));
            if (const std::optional<pipe::Breakdown> b = pipe::breakdown()) { // the served plugin broke while shrinking
                r = unshrunk;
                r.notes.push_back(shrink_broke_note(*b));
            }
        } else if (!broke && p.verdict == Verdict::Fail && !req.value("unshrunk_note", std::string()).empty()) {
            r.notes.push_back(req.at("unshrunk_note").get<std::string>());
        }
    } catch (const model::TargetError& e) {
        r.verdict = Verdict::Error;
        r.reason = std::string("the implementation could not be loaded again in the case process: ") + e.what();
    } catch (const prop::LoadError& e) {
        r.verdict = Verdict::Error;
        r.reason = std::string("the implementation could not be loaded again in the case process: ") + e.what();
    } catch (const std::invalid_argument& e) { // the parent sends only cases it has read with the same reader
        r.verdict = Verdict::Error;
        r.reason = std::string("the model-level case in the request is malformed: ") + e.what();
    }
    answer('F');
}

} // namespace

std::string bytes_hex(const void* p, std::size_t n) {
    static const char digits[] = "0123456789abcdef";
    const auto* b = static_cast<const unsigned char*>(p);
    std::string s;
    for (std::size_t i = 0; i < n; ++i) {
        s += digits[b[i] >> 4];
        s += digits[b[i] & 15];
    }
    return s;
}

bool bytes_from_hex(const std::string& s, void* p, std::size_t n) {
    if (s.size() != 2 * n) return false;
    auto* b = static_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
        const auto nibble = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
        b[i] = static_cast<unsigned char>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
    }
    return true;
}

void run_request(const nlohmann::json& req, int fd) {
    g_marker_fd = fd;
    prop::report_guard_faults_to(fd); // a fault in a lent buffer's protected guard names the buffer before death
    // The CUDA runtime the device-memory watch reads, as kvcheck resolved it before any plugin code ran: pinned
    // (dlopen()ed) here, before the implementation is loaded, so that nothing the plugin does to the environment
    // changes it. A fork()ed case process inherited the pin already.
    if (const auto c = req.find("cudart"); c != req.end() && c->is_object())
        prop::DeviceWatch::pin_runtime(prop::RuntimeChoice{c->value("path", std::string()),
                                                           c->value("why_not", std::string())});
    g_memory_limit = req.value("memory_limit", uint64_t{0});
    if (g_memory_limit) std::set_new_handler(report_refused_allocation);
    const std::string kind = req.at("kind").get<std::string>();
    if (kind == "probe") return probe(req, fd);
    if (kind == "model_case") return model_case(req, fd);
    prop::Target t;
    try {
        t = load_in_child(req);
    } catch (const prop::LoadError& e) {
        prop::CaseResult r = fresh_result(req);
        r.verdict = Verdict::Error;
        r.reason = std::string("the implementation could not be loaded again in the case process: ") + e.what();
        send(fd, 'F', r);
        return;
    }
    if (kind == "cases") { // a batch (--cases-per-process): each case evaluated as generated, never shrunk here
        const prop::RunSettings s = run_settings(req);
        for (const nlohmann::json& item : req.at("items")) {
            prop::CaseResult r = evaluate_generated(t, property_named(item), s, item.at("index").get<int>());
            const bool broke = pipe_broke(r);
            send(fd, 'F', r);
            if (broke) return; // the client is gone: the cases after this one go to a process of their own
        }
        return;
    }
    const prop::Property* p = &property_named(req);
    if (kind == "replay") {
        prop::CaseResult r = prop::evaluate_case(t, *p, prop::case_from_json(req.at("case")));
        pipe_broke(r);
        r.id = req.at("id").get<std::string>();
        r.seed = req.at("seed").get<uint64_t>();
        send(fd, 'F', r);
        return;
    }
    prop::RunSettings s = run_settings(req);
    s.max_shrink_runs = req.at("max_shrink_runs").get<int>();
    const int index = req.at("index").get<int>();
    const std::string unshrunk_note = req.at("unshrunk_note").get<std::string>();
    prop::CaseResult first = evaluate_generated(t, *p, s, index);
    pipe_broke(first);
    if (first.verdict != Verdict::Fail) {
        send(fd, 'F', first);
        return;
    }
    if (!unshrunk_note.empty()) {
        first.notes.push_back(unshrunk_note);
        send(fd, 'F', first);
        return;
    }
    send(fd, 'P', first); // survives if shrinking crashes or hangs
    prop::CaseResult unshrunk = first;
    prop::CaseResult shrunk = prop::shrink_case(t, *p, s, index, std::move(first));
    if (const std::optional<pipe::Breakdown> b = pipe::breakdown()) { // the client broke while shrinking
        unshrunk.notes.push_back(shrink_broke_note(*b));
        send(fd, 'F', unshrunk);
        return;
    }
    send(fd, 'F', shrunk);
}

nlohmann::json request_for(const Subject& s, const std::string& kind) {
    nlohmann::json req = {{"kind", kind}, {"memory_limit", s.memory_limit}};
    const prop::RuntimeChoice& cudart = prop::DeviceWatch::pin_runtime(); // in kvcheck's process: no plugin code yet
    req["cudart"] = {{"path", cudart.path}, {"why_not", cudart.why_not}};
    if (!s.plugin_file.empty()) req["plugin"] = s.plugin_file;
    else if (!s.connect.empty()) {
        req["connect"] = s.connect;
        req["reply_timeout"] = s.reply_timeout;
        if (s.served) req["served"] = true;
    } else req["builtin"] = s.builtin;
    return req;
}

ChildRun run_isolated(const Subject& s, const nlohmann::json& req, double timeout_s) {
    ChildLimits limits;
    limits.timeout_s = timeout_s;
    limits.address_space_bytes = s.memory_limit;
    const std::string text = s.isolation == Isolation::Exec ? dump_json(req) : std::string();
    return run_in_child(
        [&](int fd) {
            if (s.isolation == Isolation::Exec) exec_self(text, fd);
            run_request(req, fd);
        },
        limits);
}

std::string ending_text(const ChildRun& run, double timeout_s) {
    std::ostringstream m;
    switch (run.end) {
    case ChildRun::End::Signaled: m << "died of " << signal_description(run.code); break;
    case ChildRun::End::TimedOut: m << "gave no result within the " << timeout_s << " s timeout and was killed"; break;
    case ChildRun::End::Flooded:
        m << "wrote more than kvcheck reads from a case process to " << run.flooded << " and was killed";
        break;
    case ChildRun::End::Exited:
        if (run.code == kExecFailed) m << "could not execute kvcheck again (exec isolation)";
        else if (run.code == kBodyThrew) m << "ended on an exception that escaped into the harness";
        else m << "ended the process (exit status " << run.code << ")";
        break;
    }
    return m.str();
}

// The re-executed kvcheck of exec isolation: the request on kRequestFd, the answer on kResultFd, as in a fork()ed
// child. Not a subcommand: main() calls it before parsing any option.
void exec_child_main() {
    std::string text;
    char chunk[65536];
    for (;;) {
        const ssize_t n = ::read(kRequestFd, chunk, sizeof chunk);
        if (n > 0) text.append(chunk, static_cast<std::size_t>(n));
        else if (n == 0) break;
        else if (errno != EINTR) break;
    }
    ::close(kRequestFd);
    const nlohmann::json req = nlohmann::json::parse(text, nullptr, false);
    if (req.is_discarded() || !req.is_object()) {
        std::cerr << "kvcheck: " << kExecChildCommand << " is kvcheck's own: it runs what kvcheck validate sends it\n";
        _exit(2); // kExitBadInput
    }
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    int status = 0;
    try {
        run_request(req, kResultFd);
    } catch (...) {
        status = kBodyThrew;
    }
    _exit(status); // as a fork()ed child ends: no atexit handlers, no destructors of the implementation's statics
}

} // namespace kvc::harness
