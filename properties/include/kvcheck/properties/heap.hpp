// Bytes the process holds from malloc right now (glibc's mallinfo2: in-use chunks of every arena plus mmapped
// chunks). The NO-Q property reads it around every call to find storage an implementation did not report.
//
// glibc's per-thread cache (tcache) keeps freed small chunks out of mallinfo2's free counts, so with it on, an
// implementation's freed temporaries look like retained memory. The allocator watch is exact only with the cache
// off: GLIBC_TUNABLES=glibc.malloc.tcache_count=0, which must be set before the process starts (kvcheck re-executes
// itself with it; the test programs get it from ctest).
#pragma once

#include <cstdint>

namespace kvc::prop {

constexpr const char* kExactHeapTunable = "glibc.malloc.tcache_count=0";

int64_t heap_in_use();

// True when this process runs with glibc's per-thread cache off, so heap_in_use() counts freed memory as free.
bool heap_accounting_exact();

// Why heap_in_use() cannot see this process's allocations, or nullptr when it can. Under AddressSanitizer every
// malloc goes to ASan's own allocator and mallinfo2 reports zeros: NO-Q's allocator watch would pass anything, so it
// is skipped with this reason (tools/sanitize.sh builds that way).
const char* heap_watch_blind_reason();

} // namespace kvc::prop
