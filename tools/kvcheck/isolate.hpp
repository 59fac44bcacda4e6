// Running one piece of work in a child process, so that an implementation that crashes, hangs or exits cannot take
// the harness down with it. The child is a fork() of the harness (no exec): it inherits the loaded plugin, runs the
// body, writes its result to a pipe and ends with _exit(). The parent waits for the result with a deadline.
#pragma once

#include <functional>
#include <string>

namespace kvc::cli {

struct ChildRun {
    enum class End {
        Exited,   // the child ended by itself; `code` is its exit status
        Signaled, // a signal killed it; `code` is the signal number
        TimedOut, // no end before the deadline: the harness killed it with SIGKILL
    };
    End end = End::Exited;
    int code = 0;
    std::string result; // everything the body wrote to its result descriptor
    std::string output; // the last few KiB the child wrote to its stdout and stderr (the implementation's messages)
};

// Forks; the child runs body(result_fd) with stdout and stderr captured, then _exit(0) (or _exit(kBodyThrew) when the
// body throws). The parent collects both streams, waits at most timeout_s seconds in all, and reaps the child.
// Throws std::system_error when a pipe or the fork itself cannot be made (a harness error).
ChildRun run_in_child(const std::function<void(int result_fd)>& body, double timeout_s);

constexpr int kBodyThrew = 120; // the child's exit status when the body threw

// Writes all of s to fd (retrying short writes and EINTR). False on an error.
bool write_all(int fd, const std::string& s);

// "SIGSEGV (segmentation fault)", "SIGABRT (aborted)", or "signal 42" for one without a name.
std::string signal_description(int sig);

} // namespace kvc::cli
