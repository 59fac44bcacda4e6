// Implementations under test, as the parent process knows them. The parent never loads a plugin nor calls into one
// (a constructor, an entry function or get_caps could exit, crash or hang it): a probe child loads it, says which
// tables it exports (operation level: abi.h; model level: model_abi.h) and what each declares, and every case
// child loads it again for itself.
#pragma once

#include "kvcheck/model_abi.h"
#include "kvcheck/properties/target.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvc::harness {

// The two interfaces a plugin may export (one .so may export both).
enum class Level { Operation, Model };
const char* level_name(Level l); // "operation", "model"

// Server: the case process is forked, and the plugin runs in `kvcheck serve-plugin`, a process of the case's own that
// executes calls and sends back raw outputs; the case process, which never loads the plugin, grades them.
enum class Isolation { Fork, Exec, Server };
const char* isolation_name(Isolation i); // "fork", "exec", "server"

// What the probe reported of the model-level table.
struct ModelSide {
    std::string name, version;
    uint32_t abi_major = 0, abi_minor = 0;
    kvcm_caps caps{};
};

struct Subject {
    prop::Target target;     // operation level: name, origin and capabilities (`target.api` stays null here)
    std::string version;     // operation level, printable()
    uint32_t abi_major = 0, abi_minor = 0;
    bool operation = false;            // exports the operation-level table (every built-in does)
    std::optional<ModelSide> model;    // exports the model-level table
    std::string label;       // short name for tables: the built-in's name, or the plugin's own name
    std::string target_args; // how to name it on a command line: "--builtin NAME" or "--plugin PATH"
    std::string plugin_file; // what a child dlopen()s, or
    std::string builtin;     // the built-in a child takes, or
    std::string connect;     // the command of a client process a child starts and talks to (docs/protocol.md)
    bool served = false;     // connect is kvcheck serve-plugin around a plugin (server isolation): its notes are read
    double reply_timeout = 0; // --connect: seconds the proxy waits for one reply before the connection breaks
    Isolation isolation = Isolation::Fork;
    uint64_t memory_limit = 0;       // RLIMIT_AS of each case's child; 0: none
    bool memory_limit_asked = false; // given with --memory-limit, not the default
    bool has(Level l) const { return l == Level::Operation ? operation : model.has_value(); }
};

// --isolation and --memory-limit as given, and the per-case timeout (validate and replay share them).
struct IsolationOptions {
    std::string isolation = "auto";
    std::string memory_limit = "auto";
    double timeout = 30;
};

// "auto" (nullopt), "none" or 0 (no limit), or a size: bytes, or a number with K, M, G or T (powers of 1024).
// Throws BadInput.
std::optional<uint64_t> parse_memory_limit(const std::string& text);
// Throws BadInput unless 0.001 <= timeout <= 1e6 (NaN included).
void check_timeout(double timeout);
std::string bytes_text(uint64_t b); // "8 GiB", "512 MiB", "1234 bytes"
std::string shell_quote(const std::string& s);
// The isolation options as a rerun or replay command line needs them (only those not left at auto).
std::string isolation_args(const IsolationOptions& o);

// A built-in left out because it cannot run here, and why (the CUDA error).
struct Skipped {
    std::string name, reason;
};

// Exactly one of plugin / builtin; builtin "all" (when allowed) is every built-in that can run here, the others go to
// *skipped with their reason. Throws BadInput (cannot be loaded, malformed table: exit 2), PluginFailed (misbehaved
// while loading: exit 4), NotRunnable (a single built-in that cannot run here: exit 5).
std::vector<Subject> load_subjects(const std::string& plugin, const std::string& builtin, bool allow_all,
                                   const IsolationOptions& o, std::vector<Skipped>* skipped = nullptr);

// load_subjects, or load_connected when `connect` is given (then plugin and builtin must not be). A plugin is then
// served (server isolation) when --isolation is server, or auto and the plugin is a host one (either table or both).
std::vector<Subject> subjects_of(const std::string& plugin, const std::string& builtin, const std::string& connect,
                                 bool allow_all, const IsolationOptions& o, std::vector<Skipped>* skipped = nullptr);

// --connect COMMAND: the client process a probe child starts, and what it declares over the pipe protocol. Throws
// BadInput (it cannot serve this kvcheck) or PluginFailed (it crashed, hung or broke the protocol while connecting).
// `served`: the command is kvcheck serve-plugin with --notes-fd 3 (server isolation).
Subject load_connected(const std::string& command, const IsolationOptions& o, bool served = false);

// The lines printed before its cases run, and its entry in the JSON report (without counts).
std::string subject_header(const Subject& s);
nlohmann::json subject_json(const Subject& s);

} // namespace kvc::harness
