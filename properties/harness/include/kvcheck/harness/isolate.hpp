// Running one piece of work in a child process, so that an implementation that crashes, hangs, exits, forks or
// floods cannot take the harness down with it. The child is a fork() of the harness; the body either does the work
// right there (fork isolation) or re-executes kvcheck itself with the work described on a descriptor (exec
// isolation, exec_self): a device context does not survive fork() without exec. The child leads a process group of
// its own, which is killed as a whole when the work ends; kvcheck is the subreaper of whatever left that group
// (setsid()) and kills it too, so nothing the implementation started outlives the work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kvc::harness {

struct ChildRun {
    enum class End {
        Exited,   // the child ended by itself; `code` is its exit status
        Signaled, // a signal killed it; `code` is the signal number
        TimedOut, // no end before the deadline: the harness killed it with SIGKILL
        Flooded,  // it wrote more than the bound to a pipe (`flooded` says which): the harness killed it
    };
    End end = End::Exited;
    int code = 0;
    std::string result;  // everything the body wrote to its result descriptor
    std::string output;  // the last few KiB the child wrote to its stdout and stderr (the implementation's messages)
    std::string flooded; // End::Flooded: "its result descriptor" or "its stdout and stderr"
};

struct ChildLimits {
    double timeout_s = 30;
    uint64_t address_space_bytes = 0;            // RLIMIT_AS of the child; 0: none
    std::size_t max_result_bytes = 64u << 20;    // read from the result pipe at most
    std::size_t max_output_bytes = 64u << 20;    // read from stdout and stderr at most (the last 4 KiB are kept)
};

// Forks; the child leads a new process group, runs body(result_fd) with stdout and stderr captured, then _exit(0)
// (or _exit(kBodyThrew) when the body throws). The parent collects both streams within the limits, waits at most
// timeout_s seconds in all, kills the child's whole process group with SIGKILL (whatever it left behind), reaps
// the child, then kills and reaps every descendant that left the group (kvcheck, a subreaper from the first call,
// has them as children by then). Not for concurrent use: every other child of kvcheck is taken for such a
// descendant. Throws std::system_error when a pipe or the fork itself cannot be made (a harness error).
ChildRun run_in_child(const std::function<void(int result_fd)>& body, const ChildLimits& limits);

constexpr int kBodyThrew = 120; // the child's exit status when the body threw
constexpr int kExecFailed = 121; // exec isolation: the child could not execute kvcheck again

// Exec isolation, called in the child: executes /proc/self/exe as `kvcheck <kExecChildCommand>` with `request` on
// descriptor kRequestFd and result_fd moved to kResultFd. Returns only by _exit(kExecFailed).
[[noreturn]] void exec_self(const std::string& request, int result_fd);
constexpr const char* kExecChildCommand = "__isolated-child"; // hidden: not a subcommand a user types
constexpr int kRequestFd = 3, kResultFd = 4;

// The exec'ed child's side (main() dispatches kExecChildCommand here; defined with the work in child.cpp):
// reads the request from kRequestFd, does the work, writes to kResultFd, ends with _exit().
[[noreturn]] void exec_child_main();

// Writes all of s to fd (retrying short writes and EINTR). False on an error.
bool write_all(int fd, const std::string& s);

// "SIGSEGV (segmentation fault)", "SIGABRT (aborted)", or "signal 42" for one without a name.
std::string signal_description(int sig);

} // namespace kvc::harness
