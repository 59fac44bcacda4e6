#include "isolate.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <system_error>
#include <thread>

namespace kvc::cli {
namespace {

constexpr std::size_t kOutputKept = 4096; // bytes of the child's own stdout/stderr kept for the report

using Clock = std::chrono::steady_clock;

// A pipe whose ends close themselves.
struct Pipe {
    int fd[2] = {-1, -1};
    Pipe() {
        if (pipe2(fd, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    }
    ~Pipe() {
        close_end(0);
        close_end(1);
    }
    Pipe(const Pipe&) = delete;
    Pipe& operator=(const Pipe&) = delete;
    void close_end(int i) {
        if (fd[i] >= 0) ::close(fd[i]);
        fd[i] = -1;
    }
};

[[noreturn]] void child_main(const std::function<void(int)>& body, Pipe& result, Pipe& output, pid_t parent) {
    // Die with the harness (Ctrl-C, a CI job killed): a hung implementation must not outlive it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(kBodyThrew); // the parent is already gone
    // A crashing implementation is a verdict, not a core file in the user's directory.
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    result.close_end(0);
    output.close_end(0);
    // Whatever the implementation prints is kept for the report instead of mixing into the harness's output.
    dup2(output.fd[1], STDOUT_FILENO);
    dup2(output.fd[1], STDERR_FILENO);
    output.close_end(1);
    std::setvbuf(stdout, nullptr, _IONBF, 0); // a crash must not lose what the implementation printed
    int status = 0;
    try {
        body(result.fd[1]);
    } catch (...) {
        status = kBodyThrew;
    }
    _exit(status); // no atexit handlers, no stdio flush: the parent's buffers are not ours to write
}

// Reads what is available on fd into buf; false at end of file or on an error other than EINTR/EAGAIN.
bool drain(int fd, std::string& buf, std::size_t keep_last) {
    char chunk[8192];
    for (;;) {
        const ssize_t n = ::read(fd, chunk, sizeof chunk);
        if (n > 0) {
            buf.append(chunk, static_cast<std::size_t>(n));
            if (keep_last && buf.size() > 2 * keep_last) buf.erase(0, buf.size() - keep_last);
            if (static_cast<std::size_t>(n) < sizeof chunk) return true; // probably nothing more right now
            continue;
        }
        if (n == 0) return false;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
    }
}

} // namespace

bool write_all(int fd, const std::string& s) {
    std::size_t done = 0;
    while (done < s.size()) {
        const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        done += static_cast<std::size_t>(n);
    }
    return true;
}

std::string signal_description(int sig) {
    const char* abbrev = sigabbrev_np(sig);
    const char* text = strsignal(sig);
    if (!abbrev) return "signal " + std::to_string(sig);
    std::string s = std::string("SIG") + abbrev;
    if (text && *text) {
        std::string t = text;
        if (!t.empty()) t[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(t[0])));
        s += " (" + t + ")";
    }
    return s;
}

ChildRun run_in_child(const std::function<void(int)>& body, double timeout_s) {
    Pipe result, output;
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr); // nothing buffered may be duplicated into the child
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
    if (pid == 0) child_main(body, result, output, parent);

    result.close_end(1);
    output.close_end(1);
    fcntl(result.fd[0], F_SETFL, O_NONBLOCK);
    fcntl(output.fd[0], F_SETFL, O_NONBLOCK);

    ChildRun run;
    bool result_open = true, output_open = true, timed_out = false, reaped = false;
    int status = 0;
    // Both pipes close when the child ends. A grandchild the implementation forked may hold them open longer, so a
    // quiet pipe also checks whether the child itself is gone.
    while (result_open || output_open) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        pollfd fds[2];
        nfds_t n = 0;
        if (result_open) fds[n++] = {result.fd[0], POLLIN, 0};
        if (output_open) fds[n++] = {output.fd[0], POLLIN, 0};
        const int ready = ::poll(fds, n, static_cast<int>(std::min<long long>(left, 100)));
        if (ready < 0) {
            if (errno == EINTR) continue;
            throw std::system_error(errno, std::generic_category(), "poll");
        }
        if (ready == 0) {
            if (waitpid(pid, &status, WNOHANG) == pid) {
                reaped = true;
                drain(result.fd[0], run.result, 0);
                drain(output.fd[0], run.output, kOutputKept);
                break;
            }
            continue;
        }
        for (nfds_t i = 0; i < n; ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (fds[i].fd == result.fd[0]) result_open = drain(result.fd[0], run.result, 0);
            else output_open = drain(output.fd[0], run.output, kOutputKept);
        }
    }

    // Reap: the pipes are closed, so the child is ending; wait for it, still within the deadline.
    std::chrono::microseconds nap(20);
    while (!reaped) {
        const pid_t w = timed_out ? 0 : waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            reaped = true;
            break;
        }
        if (w < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "waitpid");
        if (timed_out || Clock::now() >= deadline) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            run.end = ChildRun::End::TimedOut;
            run.code = 0;
            drain(output.fd[0], run.output, kOutputKept);
            break;
        }
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(5000));
    }
    if (run.end != ChildRun::End::TimedOut) {
        if (WIFSIGNALED(status)) {
            run.end = ChildRun::End::Signaled;
            run.code = WTERMSIG(status);
        } else {
            run.end = ChildRun::End::Exited;
            run.code = WEXITSTATUS(status);
        }
    }
    if (run.output.size() > kOutputKept) run.output.erase(0, run.output.size() - kOutputKept);
    return run;
}

} // namespace kvc::cli
