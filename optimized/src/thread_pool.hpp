// A tiny persistent thread pool: run(n, fn, ctx) calls fn(ctx, i) for every i in [0, n) on the calling thread and
// the workers, and returns when all are done. Work items are claimed from an atomic counter, so which thread runs
// which item varies; callers make every item write its own output, which keeps results independent of that.
//
// Decode steps come back to back, a fraction of a millisecond each, and a sleeping thread takes tens of microseconds
// to wake (more in a virtual machine). So a worker that has finished spins for a short while (kSpin) on the next
// generation before it sleeps, and so does a run waiting for its workers to finish: an awake thread joins at once.
//
// One pool per process, shared by every cache, and a new one in a child made by fork() (which inherits no worker
// threads). Calls on distinct caches may come from distinct threads: a call that finds the pool busy runs its items
// itself, serially (same results, only slower).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace kvc::opt {

class ThreadPool {
public:
    using Fn = void (*)(void* ctx, size_t item);

    static ThreadPool& instance();

    // Threads a run can use: the workers plus the caller.
    unsigned concurrency() const { return static_cast<unsigned>(workers_.size()) + 1; }

    // Runs fn(ctx, 0..n-1) with at most max_threads threads (0: all). Allocates nothing.
    void run(size_t n, Fn fn, void* ctx, unsigned max_threads = 0);

    ~ThreadPool(); // never runs for the process-wide pool (see instance())
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

private:
    explicit ThreadPool(unsigned n_workers);
    void worker_loop(unsigned index);
    void drain();

    std::mutex busy_; // held by the one run that uses the workers
    std::mutex m_;
    std::condition_variable wake_, done_;
    // Written under m_; atomic so that a spinning thread may read them without it.
    std::atomic<uint64_t> generation_{0};
    unsigned participants_ = 0; // workers asked to join the current generation
    std::atomic<unsigned> finished_{0};
    bool stop_ = false;
    Fn fn_ = nullptr;
    void* ctx_ = nullptr;
    size_t n_ = 0;
    std::atomic<size_t> next_{0};
    std::vector<std::thread> workers_;
};

} // namespace kvc::opt
