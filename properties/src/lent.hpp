// A buffer the harness lends to one plugin call, at either level (the operation level's call driver, the model
// level's Model), between guard zones. After the call the caller asks what the implementation did outside what it
// was lent: bytes written before or past the buffer, or into an input it was handed as const. Without guards a stray
// write lands in the harness's own heap or stack: a few bytes past `out` go unseen in most cases and crash others,
// and a plugin built against a larger struct corrupts the caller.
//
// Each side of the payload has two guards. Next to it, kGuardBytes (or more) of a known pattern, checked after the
// call: a near stray write (one element before, a few hundred bytes past) is a FAIL naming the buffer and the byte
// count. Beyond the pattern, pages mapped PROT_NONE, at least as large as the buffer itself (so at least one of its
// rows) up to kMaxProtectedBytes: a far stray write faults at once, and the process dies of SIGSEGV as it would
// have, but first a handler tells which buffer was overrun and by how much (report_guard_faults_to), so that the
// CRASH verdict names it. A write that starts in the pattern and runs on (a whole extra row, memset past the end)
// reaches the protected pages too: it is caught either way.
//
// Cheap enough to run around every call: one mapping per buffer, the payload a copy of what the harness would have
// lent (inputs) or NaN-filled (outputs); checking compares the pattern zones and, for inputs, the payload. A Lent
// takes nothing from the malloc heap (its name is a literal, its bookkeeping lives in the object), so that lending
// inside a process whose heap is watched (kvcheck serve-plugin reports its allocator reading) moves no reading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvc::prop {

// Bytes of pattern before and after every lent buffer: at least a page and at least what a plugin built against a
// much larger kvc_memory, kvc_caps or kvcm_caps could write, so that such a scribble lands in a guard (and is
// reported) rather than in the harness's memory. A multiple of 64, so the payload keeps a cache line's alignment.
constexpr std::size_t kGuardBytes = 4096;
// The protected pages beyond each pattern zone span the buffer's own size (at least a page), at most this much.
constexpr std::size_t kMaxProtectedBytes = std::size_t{1} << 20;

class Lent {
public:
    // `name` is what messages call the buffer ("out", "k_out", "kvc_memory"). With `input` the payload is a copy of
    // it and must be unchanged after the call; without, it is filled with quiet NaN bytes (0x7fc00000 per float).
    // Throws std::bad_alloc when the mapping cannot be made.
    // `name` must outlive the Lent (a string literal).
    Lent(const char* name, std::size_t bytes, const void* input = nullptr);
    Lent(Lent&& other) noexcept;
    Lent& operator=(Lent&& other) noexcept;
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;
    ~Lent();

    void* data();
    const void* data() const;
    template <typename T> T* as() { return static_cast<T*>(data()); }
    std::size_t size() const { return bytes_; }
    const char* name() const { return name_; }

    // Empty when the call stayed inside the buffer; otherwise what it did, in words naming the buffer and the call:
    // "wrote 4 bytes past `out` in append_attend". The extent is the farthest changed guard byte from the buffer
    // ("at least" when the whole pattern zone changed); *bytes gets it (for an input written into: the first changed
    // byte). `input` (when given) is what the payload must still equal.
    std::string violation(const char* call, const void* input, std::size_t* bytes) const;

    // Fills the payload with quiet NaN floats (the guards stay): the poison of NO-Q part (3).
    void poison();
    // Poisons the payload and gives the protected pages back: a buffer kept alive after its call (so that a pointer
    // the implementation kept reads NaN) costs its payload and pattern pages only.
    void retire();

private:
    // One mapping: [protected][pattern, kGuardBytes][payload][pattern, to the next page and at least kGuardBytes]
    // [protected]. Retired, only the middle (the pattern and payload pages) stays mapped. base == nullptr: moved from.
    struct Region {
        uint8_t* base = nullptr;
        std::size_t total = 0;
        std::size_t guard = 0; // protected bytes on each side; 0 once retired
        uint8_t* payload = nullptr;
        std::size_t after = 0; // pattern bytes after the payload
        int slot = -1;
    };
    void release();
    const char* name_ = "";
    std::size_t bytes_ = 0;
    Region region_;
};

// Names the call under way while it lives, for the message of a fault in a protected guard. `call` must outlive it
// (a string literal).
class LentCall {
public:
    explicit LentCall(const char* call);
    ~LentCall();
    LentCall(const LentCall&) = delete;
    LentCall& operator=(const LentCall&) = delete;

private:
    const char* previous_;
};

// Where the SIGSEGV handler of the protected guards writes, before the process dies of the fault: one line
// "G <what>\n", <what> as violation() words it ("wrote at byte 8192 past `out` ... in append_attend"). The case
// process passes its result descriptor; -1 (the default) writes "kvcheck: <what>\n" to stderr instead.
void report_guard_faults_to(int fd);

// The line's tag on a result descriptor.
constexpr char kGuardFaultTag = 'G';
// What a CRASH reason adds after the line's words, wherever the process that died was (case process or server).
constexpr const char* kGuardFaultRule = "an implementation may reach only the buffers it is lent, within their size";

// What a call did to buffers lent on the far side of a process boundary. Through the pipe route the plugin runs in
// `kvcheck serve-plugin`, which lends it guarded copies exactly as the call driver does here and sends what
// violation() found with its reply; the proxy hands that over through this source, and the call driver reports it
// after the call as if its own guards had found it, so that both routes give one verdict.
struct FarViolation {
    const char* buffer; // the buffer's name, as violation() words it ("out", "k_scales")
    const char* what;   // violation()'s words
    std::size_t bytes;  // violation()'s *bytes
};
// Gives the violations of the call that just returned (valid until the next call), and forgets them.
using FarViolationSource = std::size_t (*)(const FarViolation** out);
// nullptr (the default): nothing is lent far away.
void set_far_violation_source(FarViolationSource source);
FarViolationSource far_violation_source();

} // namespace kvc::prop
