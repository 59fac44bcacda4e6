#include "lent.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

namespace kvc::prop {

namespace {

// The guard pattern: position-dependent bytes, so a plugin that writes a constant (zeros, NaN, 0xff) changes every
// byte it touches, and none of them is a plausible float (0xA5.. patterns are tiny negative numbers at most).
uint8_t pattern(std::size_t i) { return static_cast<uint8_t>(0xA5u ^ (i * 0x3Bu)); }

void fill_nan(uint8_t* p, std::size_t bytes) {
    static const uint8_t nan[4] = {0x00, 0x00, 0xc0, 0x7f}; // little-endian quiet NaN
    for (std::size_t i = 0; i < bytes; ++i) p[i] = nan[i % 4];
}

std::size_t page_size() {
    static const std::size_t p = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// ---- the fault handler's view of the protected guards ----
// Read inside a SIGSEGV handler, possibly on a thread the implementation started: fixed storage, lock-free atomics,
// a slot published by storing its `lo` last. Only the thread that lends buffers writes slots.

struct Slot {
    std::atomic<uintptr_t> lo{0}; // first byte of the mapping; 0: the slot is free
    uintptr_t hi = 0;             // one past its last byte
    uintptr_t start = 0;          // the payload
    std::size_t bytes = 0;
    char name[64] = {};
};
static_assert(std::atomic<uintptr_t>::is_always_lock_free, "the fault handler reads slots without a lock");

// Live guarded buffers at once: those of the call under way (seven for a batch), the model's, a description's.
// A buffer lent while every slot is taken is still protected; a fault in it is just not named.
constexpr int kSlots = 128;
Slot g_slots[kSlots];
std::atomic<const char*> g_call{nullptr};
std::atomic<int> g_fault_fd{-1};
struct sigaction g_previous;
bool g_installed = false;

int claim_slot(uintptr_t lo, uintptr_t hi, uintptr_t start, std::size_t bytes, const char* name) {
    for (int i = 0; i < kSlots; ++i) {
        Slot& s = g_slots[i];
        if (s.lo.load(std::memory_order_relaxed) != 0) continue;
        s.hi = hi;
        s.start = start;
        s.bytes = bytes;
        const std::size_t n = std::min(std::strlen(name), sizeof s.name - 1);
        std::memcpy(s.name, name, n);
        s.name[n] = '\0';
        s.lo.store(lo, std::memory_order_release);
        return i;
    }
    return -1;
}

// Async-signal-safe text: appends to a fixed line, cutting what does not fit.
struct Line {
    char text[512];
    std::size_t n = 0;
    void put(const char* s) {
        while (*s && n < sizeof text) text[n++] = *s++;
    }
    void put(uint64_t v) {
        char digits[24];
        int k = 0;
        do digits[k++] = static_cast<char>('0' + v % 10);
        while ((v /= 10) != 0);
        while (k > 0 && n < sizeof text) text[n++] = digits[--k];
    }
};

// 1: the faulting access was a write, 0: a read, -1: this architecture's fault context is not read here.
int was_write(const void* context) {
#if defined(__x86_64__)
    return (static_cast<const ucontext_t*>(context)->uc_mcontext.gregs[REG_ERR] & 2) != 0 ? 1 : 0;
#else
    (void)context;
    return -1;
#endif
}

void tell(const Slot& s, uintptr_t at, const void* context) {
    Line line;
    const int fd = g_fault_fd.load(std::memory_order_relaxed);
    line.put(fd >= 0 ? "G " : "kvcheck: ");
    const int write = was_write(context);
    line.put(write == 1 ? "wrote " : write == 0 ? "read " : "reached ");
    const uintptr_t end = s.start + s.bytes;
    line.put(static_cast<uint64_t>(at >= end ? at - end + 1 : s.start - at));
    line.put(at >= end ? " bytes past `" : " bytes before `");
    line.put(s.name);
    line.put("`, into a protected guard page");
    if (const char* call = g_call.load(std::memory_order_relaxed)) {
        line.put(", in ");
        line.put(call);
    }
    line.put(" (a ");
    line.put(static_cast<uint64_t>(s.bytes));
    line.put("-byte buffer lent by the harness)");
    if (line.n == sizeof line.text) --line.n;
    line.text[line.n++] = '\n';
    if (::write(fd >= 0 ? fd : STDERR_FILENO, line.text, line.n) < 0) {
    }
}

void on_fault(int sig, siginfo_t* info, void* context) {
    const bool fault = info->si_code > 0; // the kernel's, for an access; <= 0: sent (raise, kill, sigqueue)
    const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
    for (const Slot& s : g_slots) {
        const uintptr_t lo = fault ? s.lo.load(std::memory_order_acquire) : 0;
        if (lo != 0 && at >= lo && at < s.hi) {
            tell(s, at, context);
            break;
        }
    }
    // Under the disposition from before, the process dies of the signal (or the implementation's own handler sees
    // it) exactly as without the guards: a faulting access faults again as soon as this returns; a sent signal is
    // sent again.
    sigaction(sig, &g_previous, nullptr);
    if (!fault) raise(sig);
}

void install_handler_once() {
    if (g_installed) return;
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &g_previous) == 0) g_installed = true;
}

} // namespace

void Lent::release() {
    if (region_.base == nullptr) return;
    if (region_.slot >= 0) g_slots[region_.slot].lo.store(0, std::memory_order_release);
    munmap(region_.base, region_.total);
    region_ = Region{};
}

Lent::~Lent() { release(); }

Lent::Lent(Lent&& other) noexcept : name_(other.name_), bytes_(other.bytes_), region_(other.region_) {
    other.region_ = Region{};
}

Lent& Lent::operator=(Lent&& other) noexcept {
    if (this != &other) {
        release();
        name_ = other.name_;
        bytes_ = other.bytes_;
        region_ = other.region_;
        other.region_ = Region{};
    }
    return *this;
}

Lent::Lent(const char* name, std::size_t bytes, const void* input) : name_(name), bytes_(bytes) {
    if (bytes > (std::size_t{1} << 48)) throw std::bad_alloc();
    install_handler_once();
    const std::size_t page = page_size();
    const std::size_t guard = round_up(std::clamp(bytes, page, kMaxProtectedBytes), page);
    const std::size_t rw_end = round_up(guard + kGuardBytes + bytes + kGuardBytes, page);
    const std::size_t total = rw_end + guard;
    void* m = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    auto* base = static_cast<uint8_t*>(m);
    if (mprotect(base + guard, rw_end - guard, PROT_READ | PROT_WRITE) != 0) {
        munmap(m, total);
        throw std::bad_alloc();
    }
    region_ = Region{base, total, guard, base + guard + kGuardBytes, rw_end - guard - kGuardBytes - bytes, -1};
    uint8_t* p = region_.payload;
    for (std::size_t i = 0; i < kGuardBytes; ++i) (p - kGuardBytes)[i] = pattern(i);
    for (std::size_t i = 0; i < region_.after; ++i) p[bytes + i] = pattern(i);
    if (input != nullptr && bytes > 0)
        std::memcpy(p, input, bytes);
    else
        fill_nan(p, bytes);
    region_.slot = claim_slot(reinterpret_cast<uintptr_t>(base), reinterpret_cast<uintptr_t>(base + total),
                              reinterpret_cast<uintptr_t>(p), bytes, name_);
}

void* Lent::data() { return region_.payload; }
const void* Lent::data() const { return region_.payload; }

std::string Lent::violation(const char* call, const void* input, std::size_t* bytes) const {
    const uint8_t* b = region_.payload - kGuardBytes; // the pattern before
    const uint8_t* after = region_.payload + bytes_;
    std::size_t past = 0, before = 0;
    for (std::size_t i = region_.after; i-- > 0;)
        if (after[i] != pattern(i)) {
            past = i + 1;
            break;
        }
    for (std::size_t i = 0; i < kGuardBytes; ++i)
        if (b[i] != pattern(i)) {
            before = kGuardBytes - i;
            break;
        }
    auto extent = [](std::size_t n, std::size_t zone) {
        return (n == zone ? "at least " : "") + std::to_string(n) + (n == 1 ? " byte" : " bytes");
    };
    std::string what;
    if (past > 0) what = "wrote " + extent(past, region_.after) + " past `" + name_ + "`";
    if (before > 0)
        what += (what.empty() ? "wrote " : " and ") + extent(before, kGuardBytes) + " before `" + name_ + "`";
    const uint8_t* payload = region_.payload;
    if (what.empty() && input != nullptr && bytes_ > 0 && std::memcmp(payload, input, bytes_) != 0) {
        std::size_t i = 0;
        while (payload[i] == static_cast<const uint8_t*>(input)[i]) ++i;
        *bytes = i;
        return std::string("wrote into `") + name_ + "`, a const input, in " + call + " (first changed byte " +
               std::to_string(i) + " of " + std::to_string(bytes_) + ")";
    }
    if (what.empty()) return {};
    *bytes = std::max(past, before);
    return what + " in " + call + " (a " + std::to_string(bytes_) + "-byte buffer lent by the harness)";
}

void Lent::poison() { fill_nan(region_.payload, bytes_); }

void Lent::retire() {
    poison();
    Region& r = region_;
    if (r.guard == 0) return;
    if (r.slot >= 0) g_slots[r.slot].lo.store(0, std::memory_order_release);
    r.slot = -1;
    munmap(r.base, r.guard);
    munmap(r.base + r.total - r.guard, r.guard);
    r.base += r.guard;
    r.total -= 2 * r.guard;
    r.guard = 0;
}

LentCall::LentCall(const char* call) : previous_(g_call.exchange(call, std::memory_order_relaxed)) {}
LentCall::~LentCall() { g_call.store(previous_, std::memory_order_relaxed); }

void report_guard_faults_to(int fd) { g_fault_fd.store(fd, std::memory_order_relaxed); }

namespace {
FarViolationSource g_far = nullptr;
}
void set_far_violation_source(FarViolationSource source) { g_far = source; }
FarViolationSource far_violation_source() { return g_far; }

} // namespace kvc::prop
