#include "kvcheck/properties/heap.hpp"
#include "kvcheck/properties/sanitizers.hpp"

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
    return kBuiltWithAddressSanitizer
               ? "the allocator watch is blind in an AddressSanitizer build (ASan's allocator bypasses glibc's mallinfo2)"
               : nullptr;
}

} // namespace kvc::prop
