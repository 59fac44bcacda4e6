#include "lent.hpp"

#include <algorithm>
#include <cstdlib>
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

} // namespace

void Lent::Free::operator()(uint8_t* p) const { std::free(p); }

Lent::Lent(std::string name, std::size_t bytes, const void* input) : name_(std::move(name)), bytes_(bytes) {
    const std::size_t total = (2 * kGuardBytes + bytes + 63) / 64 * 64;
    base_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, total)));
    if (!base_) throw std::bad_alloc();
    uint8_t* b = base_.get();
    for (std::size_t i = 0; i < kGuardBytes; ++i) {
        b[i] = pattern(i);
        b[kGuardBytes + bytes + i] = pattern(i);
    }
    if (input != nullptr && bytes > 0)
        std::memcpy(b + kGuardBytes, input, bytes);
    else
        fill_nan(b + kGuardBytes, bytes);
}

std::string Lent::violation(const char* call, const void* input, std::size_t* bytes) const {
    const uint8_t* b = base_.get();
    const uint8_t* after = b + kGuardBytes + bytes_;
    std::size_t past = 0, before = 0;
    for (std::size_t i = kGuardBytes; i-- > 0;)
        if (after[i] != pattern(i)) {
            past = i + 1;
            break;
        }
    for (std::size_t i = 0; i < kGuardBytes; ++i)
        if (b[i] != pattern(i)) {
            before = kGuardBytes - i;
            break;
        }
    auto extent = [](std::size_t n) {
        return (n == kGuardBytes ? "at least " : "") + std::to_string(n) + (n == 1 ? " byte" : " bytes");
    };
    std::string what;
    if (past > 0) what = "wrote " + extent(past) + " past `" + name_ + "`";
    if (before > 0) what += (what.empty() ? "wrote " : " and ") + extent(before) + " before `" + name_ + "`";
    if (what.empty() && input != nullptr && bytes_ > 0 && std::memcmp(b + kGuardBytes, input, bytes_) != 0) {
        std::size_t i = 0;
        while (b[kGuardBytes + i] == static_cast<const uint8_t*>(input)[i]) ++i;
        *bytes = i;
        return std::string("wrote into `") + name_ + "`, a const input, in " + call + " (first changed byte " +
               std::to_string(i) + " of " + std::to_string(bytes_) + ")";
    }
    if (what.empty()) return {};
    *bytes = std::max(past, before);
    return what + " in " + call + " (a " + std::to_string(bytes_) + "-byte buffer lent by the harness)";
}

void Lent::poison() { fill_nan(base_.get() + kGuardBytes, bytes_); }

} // namespace kvc::prop
