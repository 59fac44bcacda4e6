// The memory rules of the plugin harness: NO-Q's allocator watch and MEMORY's checks of what a cache reports.
//
// NO-Q (and MEMORY for DEVICE caches) read the allocator just before and just after every call into the
// implementation: the host heap (heap.hpp) always, and for DEVICE caches device memory (device_watch.hpp) too. Each
// is its own account with the same rules; only the slack differs (kHeapSlackBytes, kDeviceSlackBytes: device memory
// comes in 2 MiB pages). Declaring DEVICE does not take the host heap out of the watch: a DEVICE cache's host heap
// may grow by what its reported capacity + pool + workspace grows by (an implementation that keeps its K/V on the
// host while declaring DEVICE is judged as a HOST one) plus kHostBytesPerDeviceBlock per reported block (the host
// bookkeeping of a device pool: free lists, reference counts, block tables), and by nothing else.
//
// create() may allocate anything constant: K/V storage (capacity + pool), a declared workspace, and (ABI 1.0
// plugins, which cannot declare one) an undeclared constant scratch; together at most kMaxWorkspaceBytes beyond the
// K/V storage. From then on, every byte the allocator grows by must come with as much growth of the reported
// capacity + pool + workspace: "unexplained" = allocator growth since create - reported growth since create, and
// its largest rise above its lowest earlier value must stay within the slack. Judging rises (not the level) means
// storage reported but never allocated is no credit for hidden growth later, and one temporary freed a call late is
// not summed up call after call. Hidden Q storage grows with the tokens appended; a workspace does not: reported
// workspace must not change after create. One exception: a declared workspace may be allocated when first needed
// (a scratch made on the first append), so what create() left unallocated of it absorbs growth once, up to the
// declared bytes. That hides nothing an eager workspace could not hold.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/properties/cache_model.hpp"
#include "kvcheck/properties/device_watch.hpp"
#include "kvcheck/properties/mismatch.hpp"
#include "kvcheck/properties/session.hpp"
#include "kvcheck/properties/target.hpp"

#include <cstdint>
#include <memory>

namespace kvc::prop {

class MemoryWatch {
public:
    // Chooses what to watch from the target's memory space and the checks asked for; records in `result` what it
    // watches (or why the device watch could not run). Throws std::runtime_error when the heap watch is asked for
    // but cannot be exact (glibc's per-thread cache on).
    MemoryWatch(const Target& target, const CaseConfig& cfg, const Checks& checks, const CheckScope& scope,
                RunResult& result);

    bool active() const { return heap_.on || device_.on; }

    // What the watched allocators hold (0 for one not watched).
    struct Reading {
        int64_t heap = 0, device = 0;
        Reading operator-(const Reading& o) const { return {heap - o.heap, device - o.device}; }
    };

    // The allocators' reading now; `call` and `when` ("before", "after") name a failed reading.
    Reading reading(const char* call, const char* when) const;

    // Judges one call: `grown` is what the allocators grew by across it, `report` the cache's memory report after it.
    // The first call judged is create(): it fixes the baselines and the workspace.
    void judge(const Reading& grown, const kvc_memory& report);

private:
    // pool_bytes is no free pass: capacity + pool may not exceed the K/V of every sequence at max_tokens in every
    // layer, in whole blocks of the reported size, twice (growth reserve), plus a page of alignment per block and a
    // first slab of 64 KiB.
    void check_kv_bound(const kvc_memory& m) const;

    // One allocator's account.
    struct Account {
        bool on = false;
        bool device = false;             // device memory (else the host heap)
        bool host_of_device = false;     // the host heap of a DEVICE cache: credited its pool's bookkeeping too
        int64_t slack = 0;
        int64_t grown = 0;               // growth summed over the windows around calls
        int64_t create_unreported = 0;   // what create() allocated beyond its report (an undeclared constant scratch)
        int64_t workspace_credit = 0;    // the declared workspace create() did not allocate (allocated when needed)
        int64_t base_grown = 0, base_reported = 0; // right after create
        int64_t lowest_unexplained = 0;  // the lowest value of (growth - reported growth) since create
        int64_t worst_rise = 0;
    };
    int64_t reported_for(const Account& a, const kvc_memory& m) const;
    void judge_create(Account& a, const kvc_memory& m, int64_t reported);
    void judge_account(Account& a, int64_t grown, const kvc_memory& m);

    const CaseConfig& cfg_;
    const CheckScope& scope_;
    RunResult& result_;
    Account heap_, device_;
    std::shared_ptr<DeviceWatch> device_watch_;
    bool baseline_set_ = false;      // create() has been judged
    uint64_t workspace_ = 0;         // reported right after create; constant from then on
};

// The host bytes a DEVICE cache may add per block of its reported K/V storage (capacity + pool in blocks of the
// reported block size): a free-list node, a reference count and a block-table entry take about 60 bytes in a C++
// engine (std::set node 48, uint32_t count 4, a doubling vector's entry up to 8; optimized/cuda/engine.cpp).
constexpr int64_t kHostBytesPerDeviceBlock = 64;

// The largest block size MEMORY accepts beyond max_tokens. Engines with fixed pages keep their page size however
// short a sequence may grow (vLLM 16 or 32, FlashMLA 64, TensorRT-LLM 64 or 128 tokens), so a page longer than
// max_tokens is honest up to this; beyond it the capacity bound (whole blocks) would excuse storage no row needs.
constexpr uint32_t kLargestFixedBlock = 256;

// MEMORY's rules for one report against the model: live bytes equal the formula, capacity within whole blocks of
// the reported size, capacity at least the live bytes while nothing can be shared (no fork yet), a sane block size.
void check_memory_report(const CheckScope& scope, const kvc_memory& m, const CacheModel& model, bool forked);

// KVC_FEATURE_FORK_SHARES: capacity at most the blocks of the reported size that the sequences need when every full
// block a fork shares is counted once and only partly filled last blocks are copied (CacheModel's
// shared_bytes_in_blocks).
void check_shared_capacity(const CheckScope& scope, const kvc_memory& m, const CacheModel& model);

} // namespace kvc::prop
