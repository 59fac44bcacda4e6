// Whether kvcheck is built with AddressSanitizer (tools/sanitize.sh, stage 3 of tools/test.sh), in one place. Two
// things cannot work in such a build, and every caller that depends on them asks here:
// - an address-space limit (RLIMIT_AS) on a case process: ASan's shadow memory alone takes terabytes of it;
// - the allocator growth watch: ASan's allocator bypasses glibc's, so mallinfo2 reports zeros (heap.hpp).
#pragma once

namespace kvc::prop {

#if defined(__SANITIZE_ADDRESS__) // g++, and clang >= 14, define it with -fsanitize=address
inline constexpr bool kBuiltWithAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) // older clang
inline constexpr bool kBuiltWithAddressSanitizer = true;
#else
inline constexpr bool kBuiltWithAddressSanitizer = false;
#endif
#else
inline constexpr bool kBuiltWithAddressSanitizer = false;
#endif

// Why no address-space limit can apply to a case process in this build, or nullptr when one can.
inline const char* address_limit_impossible() {
    return kBuiltWithAddressSanitizer
               ? "kvcheck was built with AddressSanitizer, whose shadow memory takes terabytes of address space"
               : nullptr;
}

} // namespace kvc::prop
