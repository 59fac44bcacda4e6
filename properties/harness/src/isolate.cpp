#include "kvcheck/harness/isolate.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <system_error>
#include <thread>
#include <vector>

namespace kvc::harness {
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

// The process group of the child now running, for the signal handler: Ctrl-C or a CI job's SIGTERM kills it whole.
volatile std::sig_atomic_t g_running_group = 0;

void kill_group_and_die(int sig) {
    const pid_t group = static_cast<pid_t>(g_running_group);
    if (group > 0) kill(-group, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

void install_group_killer() {
    static bool installed = false;
    if (installed) return;
    installed = true;
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
        struct sigaction old {};
        if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue; // ignored stays ignored
        struct sigaction sa {};
        sa.sa_handler = kill_group_and_die;
        sigemptyset(&sa.sa_mask);
        sigaction(sig, &sa, nullptr);
    }
}

// The processes whose parent is this one. kvcheck runs one child at a time and has reaped it when it asks, so each
// of them is a descendant of that child, re-parented here when its own parent ended (kvcheck is their subreaper).
std::vector<pid_t> adopted_processes() {
    std::vector<pid_t> pids;
    const pid_t self = getpid();
    DIR* proc = opendir("/proc");
    if (!proc) return pids;
    while (const dirent* e = readdir(proc)) {
        char* end = nullptr;
        const long pid = std::strtol(e->d_name, &end, 10);
        if (pid <= 0 || *end != '\0') continue;
        std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
        std::string line;
        if (!std::getline(stat, line)) continue; // gone meanwhile
        // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so the fields follow the last ')'
        const std::size_t paren = line.rfind(')');
        if (paren == std::string::npos) continue;
        long ppid = 0;
        if (std::sscanf(line.c_str() + paren + 1, " %*c %ld", &ppid) == 1 && ppid == self)
            pids.push_back(static_cast<pid_t>(pid));
    }
    closedir(proc);
    return pids;
}

// What a case started and that left its process group (setsid(), setpgid()) survives the group's SIGKILL. Once the
// case child is reaped, such processes are children of kvcheck, the subreaper: each is killed and reaped, which
// hands its own children to kvcheck in turn, until none is left. A pid stays ours until we reap it, so a kill here
// never hits an unrelated process.
void reap_escaped() {
    for (std::vector<pid_t> orphans = adopted_processes(); !orphans.empty(); orphans = adopted_processes()) {
        for (const pid_t p : orphans) kill(p, SIGKILL);
        for (const pid_t p : orphans)
            while (waitpid(p, nullptr, 0) < 0 && errno == EINTR) {
            }
    }
}

[[noreturn]] void child_main(const std::function<void(int)>& body, Pipe& result, Pipe& output, pid_t parent,
                             const ChildLimits& limits) {
    // A group of its own: whatever the implementation forks is in it, and the parent kills the group when done.
    setpgid(0, 0);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL); // not the parent's handler
    // A write to a pipe nobody reads (an implementation scribbling on descriptors it does not own) fails with EPIPE
    // instead of killing the case process: what it did to the result pipe is then judged from what arrives there.
    signal(SIGPIPE, SIG_IGN);
    // Die with the harness (Ctrl-C, a CI job killed): a hung implementation must not outlive it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(kBodyThrew); // the parent is already gone
    // A crashing implementation is a verdict, not a core file in the user's directory.
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    if (limits.address_space_bytes) {
        struct rlimit as = {limits.address_space_bytes, limits.address_space_bytes};
        setrlimit(RLIMIT_AS, &as);
    }
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

// Reads what is available on fd into buf, counting the bytes in `total`; false at end of file, on an error other
// than EINTR/EAGAIN, or once `total` passes `bound` (the caller then kills the child).
bool drain(int fd, std::string& buf, std::size_t keep_last, std::size_t& total, std::size_t bound) {
    char chunk[8192];
    for (;;) {
        if (total > bound) return false;
        const ssize_t n = ::read(fd, chunk, sizeof chunk);
        if (n > 0) {
            total += static_cast<std::size_t>(n);
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

ChildRun run_in_child(const std::function<void(int)>& body, const ChildLimits& limits) {
    install_group_killer();
    // Orphans of what the case starts become children of kvcheck rather than of init, whatever session or process
    // group they moved to, so that reap_escaped() can find and end them (the setting is not inherited by the child).
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    Pipe result, output;
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr); // nothing buffered may be duplicated into the child
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(limits.timeout_s));
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
    if (pid == 0) child_main(body, result, output, parent, limits);
    setpgid(pid, pid); // also here, so that the group exists before the parent may need to kill it (no race)
    g_running_group = pid;

    result.close_end(1);
    output.close_end(1);
    fcntl(result.fd[0], F_SETFL, O_NONBLOCK);
    fcntl(output.fd[0], F_SETFL, O_NONBLOCK);

    ChildRun run;
    bool result_open = true, output_open = true, timed_out = false, ended = false;
    std::size_t result_total = 0, output_total = 0;
    const auto flooded = [&] {
        if (result_total > limits.max_result_bytes) run.flooded = "its result descriptor";
        else if (output_total > limits.max_output_bytes) run.flooded = "its stdout and stderr";
        return !run.flooded.empty();
    };
    // Has the child ended? Asked without reaping it (WNOWAIT): while it is a zombie its pid, and so its process
    // group id, cannot be reused, so killing the group afterwards cannot hit an unrelated process.
    const auto child_ended = [&] {
        siginfo_t info{};
        return waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
    };
    // Both pipes close when the child ends. A grandchild the implementation forked may hold them open longer, so a
    // quiet pipe also checks whether the child itself is gone.
    while ((result_open || output_open) && !flooded()) {
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
            if (child_ended()) {
                ended = true;
                drain(result.fd[0], run.result, 0, result_total, limits.max_result_bytes);
                drain(output.fd[0], run.output, kOutputKept, output_total, limits.max_output_bytes);
                break;
            }
            continue;
        }
        for (nfds_t i = 0; i < n; ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (fds[i].fd == result.fd[0])
                result_open = drain(result.fd[0], run.result, 0, result_total, limits.max_result_bytes);
            else output_open = drain(output.fd[0], run.output, kOutputKept, output_total, limits.max_output_bytes);
        }
    }
    const bool killed = timed_out || flooded();

    // The pipes are closed, so the child is ending: wait for it (unreaped), still within the deadline.
    std::chrono::microseconds nap(20);
    while (!killed && !ended) {
        if (child_ended()) {
            ended = true;
            break;
        }
        if (Clock::now() >= deadline) {
            timed_out = true;
            break;
        }
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(5000));
    }
    // Whatever is left of the group (the child itself on a timeout or a flood, and anything the implementation
    // forked) dies now; then the child is reaped.
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL); // in case it left its group (setpgid of its own): it is still ours to end
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    reap_escaped();
    g_running_group = 0;
    if (timed_out || !run.flooded.empty()) {
        run.end = timed_out ? ChildRun::End::TimedOut : ChildRun::End::Flooded;
        run.code = 0;
        if (timed_out) drain(output.fd[0], run.output, kOutputKept, output_total, ~std::size_t{0} / 2);
    } else if (WIFSIGNALED(status)) {
        run.end = ChildRun::End::Signaled;
        run.code = WTERMSIG(status);
    } else {
        run.end = ChildRun::End::Exited;
        run.code = WEXITSTATUS(status);
    }
    if (run.output.size() > kOutputKept) run.output.erase(0, run.output.size() - kOutputKept);
    if (run.result.size() > limits.max_result_bytes) run.result.resize(limits.max_result_bytes);
    return run;
}

void exec_self(const std::string& request, int result_fd) {
    // The request travels in an anonymous memory file: a pipe would block on a request larger than its buffer,
    // with nobody reading yet.
    const int memfd = memfd_create("kvcheck-request", MFD_CLOEXEC);
    if (memfd < 0 || !write_all(memfd, request) || lseek(memfd, 0, SEEK_SET) != 0) _exit(kExecFailed);
    // Move both out of the way first, so that the dup2() calls below cannot overwrite one with the other.
    const int req = fcntl(memfd, F_DUPFD_CLOEXEC, 10), res = fcntl(result_fd, F_DUPFD_CLOEXEC, 10);
    if (req < 0 || res < 0 || dup2(req, kRequestFd) < 0 || dup2(res, kResultFd) < 0) _exit(kExecFailed);
    char name[] = "kvcheck";
    std::string command = kExecChildCommand;
    char* argv[] = {name, command.data(), nullptr};
    execv("/proc/self/exe", argv); // the descriptors made by dup2() are not close-on-exec; the others are
    _exit(kExecFailed);
}

} // namespace kvc::harness
