// The proxy's end of the pipe to a client process: starting it, writing a request and reading a reply within a
// deadline, noticing bytes written out of turn, and saying how the client ended. Nothing here allocates from the
// malloc heap after start(): the case process's heap is what NO-Q watches, and the proxy must not show up in it.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvc::pipe {

// Why an I/O step did not complete.
enum class IoEnd { Done, Eof, TimedOut, Failed };

class Channel {
public:
    // Runs `/bin/sh -c command` with its stdin and stdout on two pipes (stderr inherited, every other descriptor
    // closed). With `notes`, a third pipe is the client's descriptor 3: kvcheck serve-plugin writes there what its
    // process learns as it dies or runs out of memory (docs/protocol.md, "Notes"). Throws std::runtime_error when no
    // pipe or process can be made.
    void start(const std::string& command, bool notes = false);
    // A client that is not a process of ours (the frame-reader fuzz target): the two descriptors, taken over.
    void attach(int to_client, int from_client);
    bool started() const { return pid_ >= 0; }
    pid_t pid() const { return pid_; }

    // All of iov[0..n) written before the deadline (seconds from now). On Failed, errno_ says why (EPIPE: the
    // client closed its stdin or ended).
    IoEnd write_all(struct iovec* iov, int n, double timeout_s);
    // Exactly `bytes` bytes into iov[0..n) in order; *got says how many arrived when it ends early.
    IoEnd read_exact(const struct iovec* iov, int n, std::size_t bytes, double timeout_s, std::size_t* got);
    // Bytes the client wrote without being asked (read and dropped, at most `cap` of them kept in buf); 0 if none.
    std::size_t unrequested(unsigned char* buf, std::size_t cap);
    int last_errno() const { return errno_; }
    // What arrived on the notes pipe so far, appended to buf[*len..cap) (never blocks; nothing without notes).
    void take_notes(char* buf, std::size_t* len, std::size_t cap);

    // How the client has ended, in words, waiting up to wait_s for it: "exited with status 3", "died of SIGSEGV
    // (segmentation fault)", or "is still running". Written into out (NUL-terminated).
    void describe_end(double wait_s, char* out, std::size_t cap);
    // After describe_end(): the exit status of a client that exited by itself (not by a signal), else -1; the signal
    // that ended it, else 0.
    int exit_status() const;
    int end_signal() const;
    // Closes the client's stdin (its signal to end), waits up to wait_s for it to exit, then kills it.
    void close_and_wait(double wait_s);
    // SIGKILL to the client and reaps it (a hung or misbehaving client must not outlive its judgement).
    void kill_client();

private:
    pid_t pid_ = -1; // 0: attached descriptors, no process
    int to_client_ = -1, from_client_ = -1, notes_ = -1;
    int errno_ = 0;
    bool reaped_ = false;
    int wait_status_ = 0;
};

// An anonymous mapping that holds frames: outside the malloc heap, so the server's own buffers are not counted in
// the allocator reading it reports.
class MappedBuffer {
public:
    MappedBuffer() = default;
    MappedBuffer(const MappedBuffer&) = delete;
    MappedBuffer& operator=(const MappedBuffer&) = delete;
    ~MappedBuffer();
    // At least `bytes` bytes (contents not kept when it grows). Throws std::bad_alloc when the mapping fails.
    unsigned char* reserve(std::size_t bytes);
    unsigned char* data() const { return data_; }

private:
    unsigned char* data_ = nullptr;
    std::size_t size_ = 0;
};

} // namespace kvc::pipe
