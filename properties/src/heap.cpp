#include "kvcheck/properties/heap.hpp"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace kvc::prop {

int64_t heap_in_use() {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

bool heap_accounting_exact() {
    const char* t = std::getenv("GLIBC_TUNABLES");
    return t != nullptr && std::strstr(t, kExactHeapTunable) != nullptr;
}

const char* heap_watch_blind_reason() {
#if defined(__SANITIZE_ADDRESS__) // g++ and clang >= 14 define it with -fsanitize=address
    return "the allocator watch is blind in an AddressSanitizer build (ASan's allocator bypasses glibc's mallinfo2)";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return "the allocator watch is blind in an AddressSanitizer build (ASan's allocator bypasses glibc's mallinfo2)";
#endif
#endif
    return nullptr;
}

} // namespace kvc::prop
