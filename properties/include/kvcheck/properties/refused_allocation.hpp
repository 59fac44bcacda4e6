#pragma once
// Whether the implementation's own allocator was refused memory during this process: a call that returned
// KVC_ERR_OUT_OF_MEMORY with errno ENOMEM just after it (malloc and mmap set it when the address-space limit says
// no). The case process tells the harness, so that an engine reporting OUT_OF_MEMORY for reasons of its own (its
// blocks or context ran out) is quoted instead of being blamed on --memory-limit.
#include "kvcheck/abi.h"

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>

namespace kvc::prop {

inline std::atomic<bool> g_refused_allocation{false};

// Called just after an implementation's call, before anything else can touch errno.
inline void note_if_refused(kvc_status s, int errno_after) {
    if (s == KVC_ERR_OUT_OF_MEMORY && errno_after == ENOMEM) g_refused_allocation = true;
}

inline bool allocation_was_refused() { return g_refused_allocation; }

// The most address space this process held at once (VmPeak), in bytes; 0 when /proc cannot say.
inline uint64_t address_space_peak() {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "VmPeak: %llu kB", &kib) == 1) break;
    std::fclose(f);
    return static_cast<uint64_t>(kib) * 1024;
}

// Whether an OUT_OF_MEMORY is likely the doing of this process's address-space `limit` (0: none, never): the
// implementation's allocator was refused, or the address space came within an eighth of the limit. Otherwise the
// status is the implementation's own word, and is quoted as such.
inline bool memory_limit_likely_hit(uint64_t limit) {
    return limit && (allocation_was_refused() || address_space_peak() >= limit - limit / 8);
}

} // namespace kvc::prop
