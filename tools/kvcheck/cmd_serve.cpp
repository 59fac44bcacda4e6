// kvcheck serve-plugin LIB.so: the pipe protocol's server side (docs/protocol.md) around a plugin, so that any plugin
// can be judged through `kvcheck validate --connect "kvcheck serve-plugin LIB.so"` as a client written in another
// language would be. Each reply carries this process's allocator reading, which the proxy mirrors for NO-Q.
#include "commands.hpp"

#include "kvcheck/pipe/server.hpp"
#include "kvcheck/properties/heap.hpp"
#include "kvcheck/properties/target.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

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

int serve_plugin(const std::string& path, int notes_fd) {
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
    prop::Target t;
    try {
        t = prop::load_plugin(path);
    } catch (const prop::LoadError& e) {
        o.load_error = e.what();
        return pipe::serve(nullptr, kvc_caps{}, in, out, o) == 0 ? kExitBadInput : kExitBadInput;
    }
    return pipe::serve(t.api, t.caps, in, out, o) == 0 ? kExitOk : kExitBadInput;
}

} // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
    static std::string path; // CLI11 keeps references: the options must outlive parse()
    static int notes_fd = -1;
    auto* cmd = app.add_subcommand("serve-plugin", "Serve a plugin over the pipe protocol on stdin and stdout "
                                                   "(docs/protocol.md), for validate --connect. Exit 0 when stdin ends, "
                                                   "2 on a frame that breaks the protocol or a plugin that cannot load");
    cmd->add_option("plugin", path, "the plugin shared library")->check(path_given())->required();
    cmd->add_option("--notes-fd", notes_fd,
                    "a descriptor open for writing where the guards' fault line and the memory limit's refusals are "
                    "noted (server isolation sets it; docs/protocol.md, Notes)")
        ->check(CLI::Range(3, 1 << 20));
    cmd->callback([&exit_code] { exit_code = serve_plugin(path, notes_fd); });
}

} // namespace kvc::cli
