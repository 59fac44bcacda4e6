#include "channel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>

namespace kvc::pipe {
namespace {

double now_s() {
    struct timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Waits for `events` on fd until the deadline; false when it passed.
bool wait_for(int fd, short events, double deadline) {
    for (;;) {
        const double left = deadline - now_s();
        if (left <= 0) return false;
        struct pollfd p{fd, events, 0};
        const int ms = left > 1e6 ? 1000000000 : static_cast<int>(left * 1000) + 1;
        const int r = ::poll(&p, 1, ms);
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return true; // let the read or write report the error
    }
}

void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
}

} // namespace

void Channel::start(const std::string& command, bool notes) {
    int in[2], out[2] = {-1, -1}, note[2] = {-1, -1};
    if (::pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    if (::pipe2(out, O_CLOEXEC) != 0 || (notes && ::pipe2(note, O_CLOEXEC) != 0)) {
        for (int fd : {in[0], in[1], out[0], out[1]})
            if (fd >= 0) ::close(fd);
        throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    }
    // A client that ends while a request is written must be an EPIPE here, not a SIGPIPE that ends the case process.
    ::signal(SIGPIPE, SIG_IGN);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
        // The client: the request pipe on stdin, the reply pipe on stdout, stderr as the case process has it (the
        // harness captures it), and no other descriptor: the case process's result pipe must stay out of its reach.
        if (::dup2(in[0], 0) < 0 || ::dup2(out[1], 1) < 0 || (notes && ::dup2(note[1], 3) < 0)) _exit(127);
        ::signal(SIGPIPE, SIG_DFL);
        ::syscall(SYS_close_range, notes ? 4u : 3u, ~0u, 0u);
        ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    if (notes) {
        ::close(note[1]);
        notes_ = note[0];
        ::fcntl(notes_, F_SETFL, ::fcntl(notes_, F_GETFL) | O_NONBLOCK);
    }
    pid_ = pid;
    to_client_ = in[1];
    from_client_ = out[0];
    ::fcntl(to_client_, F_SETFL, ::fcntl(to_client_, F_GETFL) | O_NONBLOCK);
    ::fcntl(from_client_, F_SETFL, ::fcntl(from_client_, F_GETFL) | O_NONBLOCK);
}

void Channel::attach(int to_client, int from_client) {
    ::signal(SIGPIPE, SIG_IGN);
    pid_ = 0;
    to_client_ = to_client;
    from_client_ = from_client;
    ::fcntl(to_client_, F_SETFL, ::fcntl(to_client_, F_GETFL) | O_NONBLOCK);
    ::fcntl(from_client_, F_SETFL, ::fcntl(from_client_, F_GETFL) | O_NONBLOCK);
}

IoEnd Channel::write_all(struct iovec* iov, int n, double timeout_s) {
    const double deadline = now_s() + timeout_s;
    int i = 0;
    while (i < n) {
        if (iov[i].iov_len == 0) {
            ++i;
            continue;
        }
        const ssize_t w = ::writev(to_client_, iov + i, n - i);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                if (!wait_for(to_client_, POLLOUT, deadline)) return IoEnd::TimedOut;
                continue;
            }
            errno_ = errno;
            return IoEnd::Failed;
        }
        std::size_t done = static_cast<std::size_t>(w);
        while (i < n && done >= iov[i].iov_len) done -= iov[i++].iov_len;
        if (i < n) {
            iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + done;
            iov[i].iov_len -= done;
        }
    }
    return IoEnd::Done;
}

IoEnd Channel::read_exact(const struct iovec* iov, int n, std::size_t bytes, double timeout_s, std::size_t* got) {
    const double deadline = now_s() + timeout_s;
    *got = 0;
    int i = 0;
    std::size_t in_part = 0;
    while (*got < bytes && i < n) {
        if (in_part == iov[i].iov_len) {
            ++i;
            in_part = 0;
            continue;
        }
        const ssize_t r = ::read(from_client_, static_cast<char*>(iov[i].iov_base) + in_part, iov[i].iov_len - in_part);
        if (r > 0) {
            in_part += static_cast<std::size_t>(r);
            *got += static_cast<std::size_t>(r);
            continue;
        }
        if (r == 0) return IoEnd::Eof;
        if (errno == EINTR) continue;
        if (errno == EAGAIN) {
            if (!wait_for(from_client_, POLLIN, deadline)) return IoEnd::TimedOut;
            continue;
        }
        errno_ = errno;
        return IoEnd::Failed;
    }
    return IoEnd::Done;
}

std::size_t Channel::unrequested(unsigned char* buf, std::size_t cap) {
    std::size_t total = 0;
    unsigned char chunk[4096];
    for (;;) {
        const ssize_t r = ::read(from_client_, chunk, sizeof chunk);
        if (r <= 0) break;
        const std::size_t keep = total < cap ? std::min(cap - total, static_cast<std::size_t>(r)) : 0;
        std::memcpy(buf + total, chunk, keep);
        total += static_cast<std::size_t>(r);
        if (total > (1u << 20)) break; // enough to judge; a flood is not read to its end
    }
    return total;
}

void Channel::take_notes(char* buf, std::size_t* len, std::size_t cap) {
    if (notes_ < 0) return;
    for (;;) {
        char chunk[512];
        const ssize_t r = ::read(notes_, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return;
        const std::size_t keep = std::min(cap - *len, static_cast<std::size_t>(r));
        std::memcpy(buf + *len, chunk, keep);
        *len += keep;
        if (*len == cap) return; // more than a note is not read: the rest is not kvcheck's
    }
}

int Channel::exit_status() const { return reaped_ && WIFEXITED(wait_status_) ? WEXITSTATUS(wait_status_) : -1; }

int Channel::end_signal() const { return reaped_ && WIFSIGNALED(wait_status_) ? WTERMSIG(wait_status_) : 0; }

void Channel::describe_end(double wait_s, char* out, std::size_t cap) {
    const double deadline = now_s() + wait_s;
    while (!reaped_ && pid_ > 0) {
        const pid_t r = ::waitpid(pid_, &wait_status_, WNOHANG);
        if (r == pid_) {
            reaped_ = true;
            break;
        }
        if (r < 0 || now_s() >= deadline) break;
        struct timespec t{0, 5 * 1000 * 1000};
        ::nanosleep(&t, nullptr);
    }
    if (pid_ == 0) std::snprintf(out, cap, "closed its stdout");
    else if (!reaped_) std::snprintf(out, cap, "is still running");
    else if (WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) > 128)
        std::snprintf(out, cap, "exited with status %d (as a shell reports a command that died of signal %d)",
                      WEXITSTATUS(wait_status_), WEXITSTATUS(wait_status_) - 128);
    else if (WIFEXITED(wait_status_)) std::snprintf(out, cap, "exited with status %d", WEXITSTATUS(wait_status_));
    else if (WIFSIGNALED(wait_status_) && sigabbrev_np(WTERMSIG(wait_status_))) {
        // Worded as the harness words a case process's death ("died of SIGSEGV (segmentation fault)").
        const int sig = WTERMSIG(wait_status_);
        const int n = std::snprintf(out, cap, "died of SIG%s (%s)", sigabbrev_np(sig), strsignal(sig));
        const std::size_t paren = std::strlen("died of SIG") + std::strlen(sigabbrev_np(sig)) + 2;
        if (n > 0 && paren < cap && out[paren]) out[paren] = static_cast<char>(std::tolower(out[paren]));
    } else if (WIFSIGNALED(wait_status_))
        std::snprintf(out, cap, "died of signal %d (%s)", WTERMSIG(wait_status_), strsignal(WTERMSIG(wait_status_)));
    else std::snprintf(out, cap, "ended");
}

void Channel::close_and_wait(double wait_s) {
    close_fd(to_client_);
    char ignored[64];
    describe_end(wait_s, ignored, sizeof ignored);
    kill_client();
}

void Channel::kill_client() {
    if (pid_ > 0 && !reaped_) { // (never pid 0 or -1: kill() would reach a whole group)
        ::kill(pid_, SIGKILL);
        if (::waitpid(pid_, &wait_status_, 0) == pid_) reaped_ = true;
    }
    close_fd(to_client_);
    close_fd(from_client_);
    close_fd(notes_);
}

MappedBuffer::~MappedBuffer() {
    if (data_) ::munmap(data_, size_);
}

unsigned char* MappedBuffer::reserve(std::size_t bytes) {
    if (bytes <= size_ && data_) return data_;
    const std::size_t page = 1u << 16;
    const std::size_t want = (bytes + page - 1) / page * page + page;
    void* p = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (data_) ::munmap(data_, size_);
    data_ = static_cast<unsigned char*>(p);
    size_ = want;
    return data_;
}

} // namespace kvc::pipe
