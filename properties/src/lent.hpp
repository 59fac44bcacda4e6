// A buffer the harness lends to one plugin call, between two guard zones of a known pattern. After the call the
// call driver (call_driver.hpp) asks what the implementation did outside what it was lent: bytes written before or
// past the buffer, or into an input it was handed as const. Without guards a stray write lands in the harness's own
// heap or stack: a few bytes past `out` go unseen in most cases, and a plugin built against a larger `kvc_memory`
// corrupts the caller.
//
// Cheap by design: it runs around every call. The payload is a copy of what the harness would have lent (inputs)
// or NaN-filled (outputs); checking costs two comparisons of kGuardBytes and, for inputs, one of the payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvc::prop {

// Bytes of pattern before and after every lent buffer. A multiple of 64, so the payload keeps a cache line's
// alignment; large enough to hold a whole kvc_memory or kvc_caps written by a plugin built against a much larger
// struct, so that the scribble lands in the guard (and is reported) rather than in the harness's heap.
constexpr std::size_t kGuardBytes = 256;

class Lent {
public:
    // `name` is what messages call the buffer ("out", "k_out", "kvc_memory"). With `input` the payload is a copy of
    // it and must be unchanged after the call; without, it is filled with quiet NaN bytes (0x7fc00000 per float).
    Lent(std::string name, std::size_t bytes, const void* input = nullptr);
    Lent(Lent&&) noexcept = default;
    Lent& operator=(Lent&&) noexcept = default;

    void* data() { return base_.get() + kGuardBytes; }
    const void* data() const { return base_.get() + kGuardBytes; }
    template <typename T> T* as() { return static_cast<T*>(data()); }
    std::size_t size() const { return bytes_; }
    const std::string& name() const { return name_; }

    // Empty when the call stayed inside the buffer; otherwise what it did, in words naming the buffer and the call:
    // "wrote 4 bytes past `out` in append_attend". The extent is the farthest changed guard byte from the buffer
    // ("at least" when the whole guard changed); *bytes gets it (for an input written into: the first changed byte).
    // `input` (when given) is what the payload must still equal.
    std::string violation(const char* call, const void* input, std::size_t* bytes) const;

    // Fills the payload with quiet NaN floats (the guards stay): the poison of NO-Q part (3).
    void poison();

private:
    struct Free {
        void operator()(uint8_t* p) const;
    };
    std::string name_;
    std::size_t bytes_ = 0;
    std::unique_ptr<uint8_t, Free> base_;
};

} // namespace kvc::prop
