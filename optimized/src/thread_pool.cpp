#include "thread_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvc::opt {
namespace {

// How long a thread with nothing to do polls before it sleeps: a few decode steps' gaps, short enough that an idle
// process gives its cores back at once to a human eye.
constexpr auto kSpin = std::chrono::microseconds(100);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

// Polls done() for up to kSpin; true when it came true.
template <typename Done> bool spin_until(Done done) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            if (done()) return true;
            cpu_relax();
        }
        if (std::chrono::steady_clock::now() >= until) return false;
    }
}

} // namespace

ThreadPool& ThreadPool::instance() {
    // One pool per process. A process forked without exec (the conformance harness runs each case in a fork of
    // itself) inherits the pool object but none of its threads: waiting for those workers would hang forever. So the
    // pool belongs to the process that made it, and a forked child makes its own on first use. The parent's object
    // is left alone in the child (its std::thread handles name threads the child does not have) and never
    // destroyed, in either process: workers blocked on their condition variable end with the process.
    static std::atomic<ThreadPool*> pool{nullptr};
    static std::atomic<pid_t> owner{0};
    static std::mutex make;
    const pid_t me = getpid();
    ThreadPool* p = pool.load(std::memory_order_acquire);
    if (p != nullptr && owner.load(std::memory_order_acquire) == me) return *p;
    std::lock_guard<std::mutex> lk(make);
    p = pool.load(std::memory_order_acquire);
    if (p != nullptr && owner.load(std::memory_order_acquire) == me) return *p;
    // hardware_concurrency() - 1 workers: the calling thread is the last one. At most 15 (beyond that the
    // engine's memory-bound kernels gain nothing).
    const unsigned hc = std::thread::hardware_concurrency();
    p = new ThreadPool(hc > 1 ? std::min(hc - 1, 15u) : 0u);
    owner.store(me, std::memory_order_release);
    pool.store(p, std::memory_order_release);
    return *p;
}

ThreadPool::ThreadPool(unsigned n_workers) {
    workers_.reserve(n_workers);
    for (unsigned i = 0; i < n_workers; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(m_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::drain() {
    for (size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_; i = next_.fetch_add(1, std::memory_order_relaxed))
        fn_(ctx_, i);
}

void ThreadPool::run(size_t n, Fn fn, void* ctx, unsigned max_threads) {
    if (n == 0) return;
    unsigned helpers = static_cast<unsigned>(workers_.size());
    if (max_threads != 0) helpers = std::min(helpers, max_threads - 1);
    helpers = static_cast<unsigned>(std::min<size_t>(helpers, n - 1));
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (helpers == 0 || !busy.owns_lock()) { // serial: nobody to help, or another cache's call holds the workers
        for (size_t i = 0; i < n; ++i) fn(ctx, i);
        return;
    }
    {
        std::lock_guard<std::mutex> lk(m_);
        fn_ = fn;
        ctx_ = ctx;
        n_ = n;
        next_.store(0, std::memory_order_relaxed);
        participants_ = helpers;
        finished_.store(0, std::memory_order_relaxed);
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    drain();
    spin_until([&] { return finished_.load(std::memory_order_acquire) == helpers; });
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [&] { return finished_.load(std::memory_order_relaxed) == helpers; });
    fn_ = nullptr;
    ctx_ = nullptr;
}

void ThreadPool::worker_loop(unsigned index) {
    uint64_t seen = 0;
    for (;;) {
        // A new generation seen while spinning is then checked under the lock, where participants_ is safe to read.
        spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
        {
            std::unique_lock<std::mutex> lk(m_);
            wake_.wait(lk, [&] { return stop_ || (generation_.load(std::memory_order_relaxed) != seen && index < participants_); });
            if (stop_) return;
            seen = generation_.load(std::memory_order_relaxed);
        }
        drain();
        {
            std::lock_guard<std::mutex> lk(m_);
            finished_.fetch_add(1, std::memory_order_release);
        }
        done_.notify_one();
    }
}

} // namespace kvc::opt
