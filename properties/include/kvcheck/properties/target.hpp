// An implementation under test: a function table reached through the ABI entry point, whether it was linked in
// (our engines, the example) or loaded from a shared library (a third party's plugin).
#pragma once

#include "kvcheck/abi.h"

#include <memory>
#include <stdexcept>
#include <string>

namespace kvc::prop {

// A plugin that cannot be used: not a shared library, no entry symbol, an ABI it cannot speak. Bad input (exit 2).
class LoadError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A plugin that did harm while being loaded, beyond being unusable: get_caps wrote past the kvc_caps it was given.
class PluginMisbehaved : public LoadError {
public:
    using LoadError::LoadError;
};

struct Target {
    std::string name;                // the implementation's own name
    std::string origin;              // "builtin:NAME" or the plugin path
    const kvc_plugin_api* api = nullptr;
    kvc_caps caps{};
    std::shared_ptr<void> library;   // keeps a dlopen'ed library loaded; empty for built-ins
};

// Calls the entry with this harness's ABI version and checks the table: major version, struct size, required
// members; calls get_caps with a guard zone after the kvc_caps. Throws LoadError naming what is wrong
// (PluginMisbehaved for a write past kvc_caps). Runs plugin code: the CLI calls it only in a child process.
Target target_from_entry(kvc_entry_fn entry, const std::string& origin);

// Why the file at path cannot be a plugin, found without opening it, or "" when it may be one: it does not exist, is
// not readable, or is not a regular file (a directory, device, socket, or a FIFO, whose open would block until
// someone writes to it). Symbolic links are followed.
std::string plugin_file_problem(const std::string& path);

// dlopen()s path (its constructors run; RTLD_NODELETE: the library stays mapped for the rest of the process, so that
// threads it keeps never run unmapped code), looks up KVC_ENTRY_SYMBOL, refuses a symbol that is not a function,
// then target_from_entry. Throws LoadError.
Target load_plugin(const std::string& path);

} // namespace kvc::prop
