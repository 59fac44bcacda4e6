// kvcheck serve-plugin LIB.so: the pipe protocol's server side (docs/protocol.md) around a plugin, so that any plugin
// can be judged through `kvcheck validate --connect "kvcheck serve-plugin LIB.so"` as a client written in another
// language would be. It serves the tables the library exports: the operation level's, the model level's (protocol
// 1.5), or both. Each reply carries this process's allocator reading, which the proxy mirrors for NO-Q.
#include "commands.hpp"

#include "kvcheck/model/model_target.hpp"
#include "kvcheck/pipe/server.hpp"
#include "kvcheck/properties/device_watch.hpp"
#include "kvcheck/properties/heap.hpp"
#include "kvcheck/properties/target.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <optional>

namespace kvc::cli {
namespace {

// The protocol owns stdin and stdout; a plugin that prints would corrupt it. Its output goes to stderr instead and
// its stdin reads /dev/null. Returns the protocol's descriptors.
bool take_stdio(int* in, int* out) {
    *in = ::fcntl(0, F_DUPFD_CLOEXEC, 3);
    *out = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
    const int null = ::open("/dev/null", O_RDONLY);
    if (*in < 0 || *out < 0 || null < 0 || ::dup2(null, 0) < 0 || ::dup2(2, 1) < 0) return false;
    ::close(null);
    return true;
}

// A DEVICE plugin's case reads device memory from the case process (the reading is global to the device), and the
// CUDA context this process needs would count against the plugin's create() if the plugin made it there. So the
// context is made here, before the first request, as the case process's own watch does before create() when the
// plugin is loaded there. The runtime is pinned before the plugin is loaded (pin_runtime), so that its constructors
// cannot choose it: the one kvcheck resolved (`--cudart`, server isolation), else the environment's. Failing that,
// the plugin makes the context itself and its create() is charged with it: nothing is hidden.
void pin_runtime(const std::string& cudart) {
    if (cudart.empty()) prop::DeviceWatch::pin_runtime();
    else prop::DeviceWatch::pin_runtime(prop::RuntimeChoice{cudart, ""});
}

void make_device_context(const prop::Target& t) {
    if (t.caps.memory_space != KVC_MEMORY_DEVICE) return;
    std::string why_not;
    if (!prop::DeviceWatch::open(&why_not))
        std::fprintf(stderr, "kvcheck serve-plugin: no CUDA context before the first call: %s\n", why_not.c_str());
}

int serve_plugin(const std::string& path, int notes_fd, const std::string& cudart) {
    std::fflush(stdout);
    // Non-blocking: a notes pipe the plugin filled must not hang a reply or the fault handler (a note lost is words
    // lost, never a verdict).
    if (notes_fd >= 0 && (::fcntl(notes_fd, F_SETFD, FD_CLOEXEC) != 0 ||
                          ::fcntl(notes_fd, F_SETFL, ::fcntl(notes_fd, F_GETFL) | O_NONBLOCK) != 0)) {
        std::fprintf(stderr, "kvcheck serve-plugin: --notes-fd %d: not an open descriptor\n", notes_fd);
        return kExitBadInput;
    }
    int in = -1, out = -1;
    if (!take_stdio(&in, &out)) {
        std::fprintf(stderr, "kvcheck serve-plugin: cannot set up stdin and stdout\n");
        return kExitInternal;
    }
    pipe::ServeOptions o;
    o.notes_fd = notes_fd;
    // The reading is exact only with glibc's per-thread cache off, which main() arranges for every kvcheck process.
    if (prop::heap_accounting_exact() && !prop::heap_watch_blind_reason())
        o.reading = [] { return static_cast<uint64_t>(prop::heap_in_use()); };
    pin_runtime(cudart); // before the library's constructors run (the dlopen below)
    // Which tables the library exports, as the probe asks (harness/src/child.cpp): neither is the operation level's
    // to name as missing.
    bool operation = true, model = false;
    if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        model = ::dlsym(h, KVCM_ENTRY_SYMBOL) != nullptr;
        operation = !model || ::dlsym(h, KVC_ENTRY_SYMBOL) != nullptr;
    }
    prop::Target t;
    std::optional<model::ModelTarget> m;
    try {
        if (model) {
            try {
                m = model::ModelTarget::from_library(path);
            } catch (const model::TargetError& e) {
                throw prop::LoadError(path + ": the model-level table (" KVCM_ENTRY_SYMBOL ") cannot be used: " +
                                      e.what());
            }
            o.model = m->api();
            o.model_caps = m->caps();
        }
        if (operation) t = prop::load_plugin(path);
    } catch (const prop::LoadError& e) {
        o.load_error = e.what();
        o.model = nullptr;
        return pipe::serve(nullptr, kvc_caps{}, in, out, o) == 0 ? kExitBadInput : kExitBadInput;
    }
    make_device_context(t);
    return pipe::serve(t.api, t.caps, in, out, o) == 0 ? kExitOk : kExitBadInput;
}

} // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
    static std::string path; // CLI11 keeps references: the options must outlive parse()
    static int notes_fd = -1;
    static std::string cudart;
    auto* cmd = app.add_subcommand("serve-plugin", "Serve a plugin over the pipe protocol on stdin and stdout "
                                                   "(docs/protocol.md), for validate --connect. Exit 0 when stdin ends, "
                                                   "2 on a frame that breaks the protocol or a plugin that cannot load");
    cmd->add_option("plugin", path, "the plugin shared library")->check(path_given())->required();
    cmd->add_option("--notes-fd", notes_fd,
                    "a descriptor open for writing where the guards' fault line and the memory limit's refusals are "
                    "noted (server isolation sets it; docs/protocol.md, Notes)")
        ->check(CLI::Range(3, 1 << 20));
    cmd->add_option("--cudart", cudart,
                    "the CUDA runtime through which a DEVICE plugin's context is made before the first request: the one "
                    "kvcheck's device-memory watch reads (server isolation sets it); default: as the watch finds it "
                    "(KVCHECK_CUDART, else libcudart)");
    cmd->callback([&exit_code] { exit_code = serve_plugin(path, notes_fd, cudart); });
}

} // namespace kvc::cli
