#pragma once
// Whether the implementation's own allocator was refused memory during this process: a call that returned
// KVC_ERR_OUT_OF_MEMORY with errno ENOMEM just after it (malloc and mmap set it when the address-space limit says
// no). The case process tells the harness, so that an engine reporting OUT_OF_MEMORY for reasons of its own (its
// blocks or context ran out) is quoted instead of being blamed on --memory-limit.
#include "kvcheck/abi.h"

#include <atomic>
#include <cerrno>

namespace kvc::prop {

inline std::atomic<bool> g_refused_allocation{false};

// Called just after an implementation's call, before anything else can touch errno.
inline void note_if_refused(kvc_status s, int errno_after) {
    if (s == KVC_ERR_OUT_OF_MEMORY && errno_after == ENOMEM) g_refused_allocation = true;
}

inline bool allocation_was_refused() { return g_refused_allocation; }

} // namespace kvc::prop
