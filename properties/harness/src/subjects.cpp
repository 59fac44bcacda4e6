#include "kvcheck/harness/subjects.hpp"

#include "kvcheck/harness/child.hpp"
#include "kvcheck/harness/errors.hpp"
#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/strict_json.hpp"
#include "kvcheck/harness/vocabulary.hpp"

#include "kvcheck/harness/builtins.hpp"
#include "kvcheck/properties/device_watch.hpp"
#include "kvcheck/properties/sanitizers.hpp"

#include "lent.hpp"

#include <cctype>
#include <csignal>
#include <regex>
#include <filesystem>
#include <sstream>

namespace kvc::harness {
namespace {

constexpr uint64_t kDefaultMemoryLimit = uint64_t{8} << 30;   // host plugins, per case (docs/cli.md, Isolation)
constexpr uint64_t kSmallestMemoryLimit = uint64_t{64} << 20; // kvcheck itself needs some to run a case at all

using prop::address_limit_impossible; // ASan's shadow memory (tools/sanitize.sh)

// The default: 8 GiB for host implementations; none for a device runtime (it reserves terabytes of address space)
// and none in a sanitizer build of kvcheck itself.
uint64_t default_memory_limit(bool device) {
    return device || address_limit_impossible() ? 0 : kDefaultMemoryLimit;
}

// Runs the probe: loads the implementation in a child and returns what the parent needs. Throws BadInput (it cannot
// be loaded, or a table is malformed: exit 2) or PluginFailed (it misbehaved while being loaded: exit 4).
Subject probe(Subject s, const IsolationOptions& o) {
    const std::optional<uint64_t> limit = parse_memory_limit(o.memory_limit);
    // Before the probe the memory space is unknown: the probe uses only what was asked for explicitly.
    s.isolation = o.isolation == "exec" ? Isolation::Exec : Isolation::Fork;
    s.memory_limit = limit.value_or(0);
    const ChildRun run = run_isolated(s, request_for(s, "probe"), o.timeout);
    const std::string& origin = s.target.origin;
    std::optional<nlohmann::json> answer;
    std::string guard_fault; // the lent buffers' fault handler, as get_caps overran the struct it was lent
    bool stray = false;
    std::istringstream lines(run.result);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("L ", 0) == 0 && !answer) {
            try {
                answer = json_strict::parse(line.substr(2));
            } catch (const std::exception&) { // syntax, a duplicate key, limits: a probe answer not to be trusted
                answer = nlohmann::json(nlohmann::json::value_t::discarded);
            }
        }
        else if (line.rfind(std::string(1, prop::kGuardFaultTag) + " ", 0) == 0) guard_fault = line.substr(2);
        else if (line != "M") stray = true;
    }
    if (run.end == ChildRun::End::Exited && run.code == kExecFailed)
        throw std::runtime_error("could not execute kvcheck again for exec isolation (/proc/self/exe)");
    std::string problem;
    if (run.end != ChildRun::End::Exited || run.code != 0) {
        problem = "the loading process " + ending_text(run, o.timeout);
        if (!guard_fault.empty() && run.end == ChildRun::End::Signaled && run.code == SIGSEGV)
            problem += ": " + guard_fault;
    } else if (stray || !guard_fault.empty() || (answer && (answer->is_discarded() || !answer->is_object()))) {
        // (the fault handler speaks only as the process dies of the fault: a "G" line is not kvcheck's otherwise)
        problem = "something other than kvcheck wrote to the loading process's result descriptor";
    } else if (!answer) {
        problem = "the implementation ended the loading process (exit status 0) before it had loaded";
    }
    if (problem.empty() && answer->contains("error")) {
        std::string error = printable(answer->at("error").get<std::string>());
        if (!answer->value("misbehaved", false)) throw BadInput(error);
        if (error.rfind(origin + ": ", 0) == 0) error.erase(0, origin.size() + 2);
        problem = error;
    }
    kvc_caps caps{};
    if (problem.empty()) {
        try {
            s.operation = answer->contains("caps");
            if (s.operation && !bytes_from_hex(answer->at("caps").get<std::string>(), &caps, sizeof caps))
                problem = "malformed answer from the probe";
            if (s.operation) {
                s.target.name = printable(answer->at("name").get<std::string>());
                s.version = printable(answer->at("version").get<std::string>());
                s.abi_major = answer->at("abi_major").get<uint32_t>();
                s.abi_minor = answer->at("abi_minor").get<uint32_t>();
            }
            if (answer->contains("model")) {
                const nlohmann::json& m = answer->at("model");
                ModelSide side;
                side.name = printable(m.at("name").get<std::string>());
                side.version = printable(m.at("version").get<std::string>());
                side.abi_major = m.at("abi_major").get<uint32_t>();
                side.abi_minor = m.at("abi_minor").get<uint32_t>();
                if (!bytes_from_hex(m.at("caps").get<std::string>(), &side.caps, sizeof side.caps))
                    problem = "malformed answer from the probe";
                s.model = side;
                if (!s.operation) s.target.name = side.name;
            }
            if (!s.operation && !s.model) problem = "malformed answer from the probe (no table)";
        } catch (const nlohmann::json::exception& e) {
            problem = std::string("malformed answer from the probe (") + e.what() + ")";
        }
    }
    if (!problem.empty()) {
        std::string text = origin + ": the implementation failed while being loaded (in its constructors, the entry "
                                    "function or get_caps): " + problem;
        if (!run.output.empty()) {
            std::string tail = run.output.size() > 400 ? run.output.substr(run.output.size() - 400) : run.output;
            text += "; it wrote: " + printable(tail);
        }
        throw PluginFailed(text);
    }
    s.target.caps = caps;
    const bool device = s.operation && caps.memory_space == KVC_MEMORY_DEVICE;
    s.isolation = o.isolation == "fork" ? Isolation::Fork
                  : o.isolation == "exec" || device ? Isolation::Exec
                                                    : Isolation::Fork;
    // RLIMIT_AS counts address space, not memory: a device runtime reserves terabytes of it. No default limit there.
    s.memory_limit = limit ? *limit : default_memory_limit(device);
    s.memory_limit_asked = limit.has_value();
    return s;
}

Subject load_builtin(const Builtin& b, const IsolationOptions& o) {
    Subject s;
    s.target.origin = "builtin:" + b.name;
    s.builtin = b.name;
    s.label = b.name;
    s.target_args = "--builtin " + b.name;
    return probe(std::move(s), o);
}

} // namespace

const char* level_name(Level l) { return l == Level::Model ? "model" : "operation"; }

const char* isolation_name(Isolation i) {
    return i == Isolation::Exec ? "exec" : i == Isolation::Server ? "server" : "fork";
}

std::string shell_quote(const std::string& s) {
    const bool plain = !s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                         "0123456789_./:=+-,@%") == std::string::npos;
    if (plain) return s;
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

std::optional<uint64_t> parse_memory_limit(const std::string& text) {
    if (text == "auto") return std::nullopt;
    if (text == "none" || text == "0") return uint64_t{0};
    static const std::regex form("([0-9]{1,12})(\\.[0-9]{1,6})?([KMGTkmgt]i?B?|B)?");
    std::smatch m;
    long double bytes = 0;
    if (std::regex_match(text, m, form)) {
        bytes = std::stold(m[1].str() + m[2].str());
        const std::string unit = m[3].str();
        const char u = unit.empty() ? 'B' : static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
        for (const char step : {'K', 'M', 'G', 'T'}) {
            bytes *= 1024;
            if (u == step) break;
            if (step == 'T' || u == 'B') bytes /= 1024; // (undone for bytes, at the first step)
            if (u == 'B') break;
        }
    }
    if (bytes < static_cast<long double>(kSmallestMemoryLimit) || bytes > 1e18L)
        throw BadInput("--memory-limit " + text + ": expected auto, none, or a size of at least 64M such as 4G, "
                                                  "512M or 8589934592 (bytes)");
    if (const char* why = address_limit_impossible())
        throw BadInput("--memory-limit " + text + ": no address-space limit can apply to a case here: " + why +
                       " (use auto or none)");
    return static_cast<uint64_t>(bytes);
}

std::string bytes_text(uint64_t b) {
    std::ostringstream s;
    if (b >= (uint64_t{1} << 30) && b % (uint64_t{1} << 30) == 0) s << (b >> 30) << " GiB";
    else if (b >= (uint64_t{1} << 20) && b % (uint64_t{1} << 20) == 0) s << (b >> 20) << " MiB";
    else s << b << " bytes";
    return s.str();
}

void check_timeout(double timeout) {
    // CLI11's range check lets NaN through (every comparison with it is false): NaN would switch timeouts off.
    if (!(timeout >= 0.001 && timeout <= 1e6)) {
        std::ostringstream m;
        m << "--timeout " << timeout << ": expected seconds from 0.001 to 1000000";
        throw BadInput(m.str());
    }
}

std::string isolation_args(const IsolationOptions& o) {
    std::string a;
    if (o.isolation != "auto") a += " --isolation " + o.isolation;
    if (o.memory_limit != "auto") a += " --memory-limit " + shell_quote(o.memory_limit);
    return a;
}

std::vector<Subject> load_subjects(const std::string& plugin, const std::string& builtin, bool allow_all,
                                   const IsolationOptions& o, std::vector<Skipped>* skipped) {
    if (plugin.empty() == builtin.empty())
        throw BadInput("give exactly one of --plugin PATH, --builtin NAME or --connect COMMAND (see kvcheck list for "
                       "the built-ins)");
    std::vector<Subject> out;
    if (!plugin.empty()) {
        Subject s;
        // dlopen() searches the library path for a name without a slash; a file name given here means that file.
        s.plugin_file = plugin.find('/') == std::string::npos ? "./" + plugin : plugin;
        if (const std::string why = prop::plugin_file_problem(s.plugin_file); !why.empty())
            throw BadInput(plugin + ": " + why);
        prop::DeviceWatch::pin_runtime(); // resolved here, in kvcheck's own process, before the probe loads the plugin
        if (const std::string why = prop::DeviceWatch::runtime_problem(s.plugin_file); !why.empty())
            throw BadInput(plugin + ": " + why);
        s.target.origin = s.plugin_file;
        s.target_args = "--plugin " + shell_quote(plugin);
        s = probe(std::move(s), o);
        s.label = s.target.name;
        out.push_back(std::move(s));
        return out;
    }
    if (builtin == "all" && allow_all) {
        for (const Builtin& b : builtins()) {
            const std::string why = unavailable_reason(b);
            if (why.empty()) out.push_back(load_builtin(b, o));
            else if (skipped) skipped->push_back({b.name, why});
        }
        if (out.empty()) throw NotRunnable("no built-in implementation can run on this machine");
        return out;
    }
    const Builtin* b = find_builtin(builtin);
    if (!b) {
        std::string known;
        for (const Builtin& x : builtins()) known += " " + x.name;
        throw BadInput("unknown built-in \"" + builtin + "\"; this build has:" + known +
                       (allow_all ? " (or all)" : ""));
    }
    const std::string why = unavailable_reason(*b);
    if (!why.empty()) throw NotRunnable("built-in " + b->name + " cannot run on this machine: " + why);
    out.push_back(load_builtin(*b, o));
    return out;
}

namespace {

// A library with a model table beside an operation-level table older than ABI 1.2: serve-plugin speaks that table's
// older protocol minor, which has no model level.
bool served_at_older_minor(const Subject& probed) { return probed.model && probed.operation && probed.abi_minor < 2; }

// Server isolation: a plugin already probed (in a probe child) is then judged through the pipe route with
// `kvcheck serve-plugin --notes-fd 3 PATH` as the client, so that no process that grades ever runs the plugin's code:
// its operation-level table, its model-level table (protocol 1.5), or both. A DEVICE plugin is served too: the case
// process reads device memory itself (the reading is global to the device), and the server makes its CUDA context
// through the runtime kvcheck resolved before the first call (--cudart), so the context never counts as the cache's.
// A library whose operation-level table is older than ABI 1.2 beside a model table is refused here (asked for
// explicitly), never half judged: the pipe speaks that table's older protocol minor, which has no model level.
Subject serve(const Subject& probed, const IsolationOptions& o) {
    if (served_at_older_minor(probed))
        throw BadInput(probed.plugin_file + ": --isolation server serves both tables of a library only when its "
                                            "operation-level table is of ABI 1.2 or later (the pipe speaks an older "
                                            "table's protocol minor, which has no model level); judge it with "
                                            "--isolation auto, fork or exec");
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) throw std::runtime_error("--isolation server: cannot find kvcheck's own executable (/proc/self/exe)");
    const std::string file = std::filesystem::absolute(probed.plugin_file).string();
    std::string cudart;
    if (const prop::RuntimeChoice* c = prop::DeviceWatch::pinned();
        probed.target.caps.memory_space == KVC_MEMORY_DEVICE && c != nullptr && c->why_not.empty() && !c->path.empty())
        cudart = " --cudart " + shell_quote(c->path);
    // (exec: the shell becomes kvcheck, so that how the process ended is the plugin's doing, not the shell's report)
    Subject s = load_connected("exec " + shell_quote(self.string()) + " serve-plugin --notes-fd 3" + cudart + " " +
                                   shell_quote(file), o, true);
    if (s.operation != probed.operation || s.model.has_value() != probed.model.has_value())
        throw std::runtime_error(probed.plugin_file + ": kvcheck serve-plugin served other tables than the plugin "
                                                      "exports");
    s.abi_minor = probed.abi_minor; // the table's own, reported as such (the connection may speak a later minor)
    s.target.origin = probed.plugin_file + " (served by kvcheck serve-plugin)";
    s.target_args = probed.target_args;
    s.isolation = Isolation::Server;
    return s;
}

// What `--isolation auto` serves: a plugin, whichever tables it exports and whatever its memory space, except a library
// whose operation-level table is older than ABI 1.2 beside a model table, which stays in a forked case process.
bool served_by_default(const Subject& probed) {
    if (probed.plugin_file.empty()) return false;
    return !served_at_older_minor(probed);
}

} // namespace

std::vector<Subject> subjects_of(const std::string& plugin, const std::string& builtin, const std::string& connect,
                                 bool allow_all, const IsolationOptions& o, std::vector<Skipped>* skipped) {
    if (o.isolation == "server" && (plugin.empty() || !builtin.empty() || !connect.empty()))
        throw BadInput("--isolation server serves a plugin: give --plugin PATH (a built-in is kvcheck's own code, and "
                       "--connect runs its own process already)");
    if (!connect.empty()) {
        if (!plugin.empty() || !builtin.empty())
            throw BadInput("give exactly one of --plugin PATH, --builtin NAME or --connect COMMAND");
        return {load_connected(connect, o)};
    }
    std::vector<Subject> subjects = load_subjects(plugin, builtin, allow_all, o, skipped);
    if (!plugin.empty() &&
        (o.isolation == "server" || (o.isolation == "auto" && served_by_default(subjects.front()))))
        subjects.front() = serve(subjects.front(), o);
    return subjects;
}

Subject load_connected(const std::string& command, const IsolationOptions& o, bool served) {
    if (command.find_first_not_of(" \t") == std::string::npos) throw BadInput("--connect: an empty command");
    Subject s;
    s.connect = command;
    s.served = served;
    // A reply may take most of a case's time, never all of it: the proxy then names the request that hangs before
    // the case's own timeout ends the process.
    s.reply_timeout = 0.8 * o.timeout;
    s.target.origin = "connect:" + command;
    s.target_args = "--connect " + shell_quote(command);
    s = probe(std::move(s), o);
    s.label = s.target.name;
    return s;
}

std::string subject_header(const Subject& s) {
    std::ostringstream o;
    if (s.operation) {
        o << "implementation: " << s.target.name << " " << s.version << " (" << printable(s.target.origin)
          << "), ABI " << s.abi_major << "." << s.abi_minor << "\n";
        o << caps_to_text(s.target.caps, "  ");
    }
    if (s.model) {
        o << (s.operation ? "  model level: " : "implementation (model level): ") << s.model->name << " "
          << s.model->version << (s.operation ? "" : " (" + printable(s.target.origin) + ")") << ", model ABI "
          << s.model->abi_major << "." << s.model->abi_minor << "\n";
        o << model_caps_to_text(s.model->caps, "  ");
    }
    o << "  isolation: " << isolation_name(s.isolation) << ", memory limit per case: "
      << (s.memory_limit ? bytes_text(s.memory_limit) : std::string("none")) << "\n";
    return o.str();
}

nlohmann::json subject_json(const Subject& s) {
    nlohmann::json levels = nlohmann::json::array();
    if (s.operation) levels.push_back("operation");
    if (s.model) levels.push_back("model");
    nlohmann::json j = {{"name", s.target.name},
                        {"version", s.operation ? s.version : s.model->version},
                        {"origin", s.target.origin},
                        {"label", s.label},
                        {"levels", levels},
                        {"isolation", isolation_name(s.isolation)},
                        {"memory_limit_bytes",
                         s.memory_limit ? nlohmann::json(s.memory_limit) : nlohmann::json(nullptr)}};
    if (s.operation) {
        j["abi"] = {{"major", s.abi_major}, {"minor", s.abi_minor}};
        j["capabilities"] = caps_to_json(s.target.caps);
    }
    if (s.model)
        j["model"] = {{"name", s.model->name},
                      {"version", s.model->version},
                      {"abi", {{"major", s.model->abi_major}, {"minor", s.model->abi_minor}}},
                      {"capabilities", model_caps_to_json(s.model->caps)}};
    return j;
}

} // namespace kvc::harness
