#include "memory_watch.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/heap.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvc::prop {

namespace {

// Saturated at 2^61, so that absurd reports (2^64 - 1) read as huge, never wrap to "-2 bytes".
int64_t saturated(uint64_t bytes) { return static_cast<int64_t>(std::min<uint64_t>(bytes, uint64_t{1} << 61)); }

} // namespace

MemoryWatch::MemoryWatch(const Target& target, const CaseConfig& cfg, const Checks& checks, const CheckScope& scope,
                         RunResult& result)
    : cfg_(cfg), scope_(scope), result_(result) {
    const bool device = target.caps.memory_space == KVC_MEMORY_DEVICE;
    if (device && (checks.heap || checks.device_memory)) { // NO-Q and MEMORY hold device memory against the reports
        std::string why_not;
        device_watch_ = DeviceWatch::open(&why_not);
        if (device_watch_) {
            device_.on = device_.device = true;
            device_.slack = kDeviceSlackBytes;
        } else {
            result_.watch_not_run = why_not;
        }
    }
    if (checks.heap) { // the host heap, whatever the declared memory space
        if (!heap_accounting_exact())
            throw std::runtime_error(std::string("the allocator watch needs glibc's per-thread cache off: run "
                                                 "with GLIBC_TUNABLES=") + kExactHeapTunable +
                                     " (kvcheck sets it itself; see properties/include/kvcheck/properties/heap.hpp)");
        heap_.on = true;
        heap_.host_of_device = device;
        heap_.slack = kHeapSlackBytes;
    }
    if (device_.on) result_.watched = "device memory (" + device_watch_->library() + ")";
    if (heap_.on) result_.watched += std::string(result_.watched.empty() ? "" : " and ") + "heap";
}

MemoryWatch::Reading MemoryWatch::reading(const char* call, const char* when) const {
    Reading r;
    const bool before = std::string(when) == "before";
    // the heap read nearest the call on both sides: whatever the device reading allocates stays outside the window
    if (heap_.on && !before) r.heap = heap_in_use();
    if (device_.on) {
        try {
            r.device = device_watch_->used();
        } catch (const std::runtime_error& e) { // after a call: most likely a sticky error the call left
            throw AbiError(KVC_ERR_INTERNAL, std::string(e.what()) + " (" + when + " " + call + ")");
        }
    }
    if (heap_.on && before) r.heap = heap_in_use();
    return r;
}

int64_t MemoryWatch::reported_for(const Account& a, const kvc_memory& m) const {
    const int64_t kv = saturated(m.capacity_bytes) + saturated(m.pool_bytes);
    int64_t reported = kv + saturated(m.workspace_bytes);
    if (a.host_of_device) { // the host bookkeeping of the device pool: kHostBytesPerDeviceBlock per reported block
        const uint64_t block_bytes = std::max<uint64_t>(
            uint64_t{1}, uint64_t{std::max<uint32_t>(m.block_size, 1u)} * token_bytes(cfg_));
        const uint64_t blocks = (static_cast<uint64_t>(kv) + block_bytes - 1) / block_bytes;
        reported += saturated(std::min<uint64_t>(blocks, uint64_t{1} << 54) * kHostBytesPerDeviceBlock);
    }
    return reported;
}

void MemoryWatch::judge_create(Account& a, const kvc_memory& m, int64_t reported) {
    a.create_unreported = a.grown - reported;
    a.workspace_credit =
        std::clamp<int64_t>(-a.create_unreported, 0, static_cast<int64_t>(std::min<uint64_t>(workspace_, 1ull << 61)));
    a.base_grown = a.grown;
    a.base_reported = reported;
    const int64_t besides_kv = static_cast<int64_t>(std::min<uint64_t>(workspace_, uint64_t{1} << 62)) +
                               std::max<int64_t>(a.create_unreported, 0);
    if (m.workspace_bytes > kMaxWorkspaceBytes || besides_kv > static_cast<int64_t>(kMaxWorkspaceBytes) + a.slack) {
        Mismatch mm;
        mm.what = "workspace bytes";
        mm.expected = static_cast<double>(kMaxWorkspaceBytes);
        mm.actual = static_cast<double>(besides_kv);
        scope_.fail("create() holds " + std::to_string(besides_kv) + " bytes besides its K/V storage (declared "
                    "workspace " + std::to_string(workspace_) + (a.device ? ", in device memory" : ", in the host heap") +
                    "): more than the 256 MiB a constant workspace may take",
                    mm);
    }
}

void MemoryWatch::judge_account(Account& a, int64_t grown, const kvc_memory& m) {
    a.grown += grown;
    const int64_t reported = reported_for(a, m);
    if (!baseline_set_) return judge_create(a, m, reported); // the window around create()
    const int64_t grown_since = a.grown - a.base_grown, reported_growth = reported - a.base_reported;
    const int64_t raw = grown_since - reported_growth; // the lazy workspace's credit absorbs growth, never a fall
    const int64_t unexplained = raw > 0 ? std::max<int64_t>(raw - a.workspace_credit, 0) : raw;
    const int64_t rise = unexplained - a.lowest_unexplained;
    a.worst_rise = std::max(a.worst_rise, rise);
    const bool blind = !a.device && heap_watch_blind_reason() != nullptr; // ASan: NO-Q's note
    if (rise > a.slack && !blind) {
        Mismatch mm;
        const std::string bookkeeping = a.host_of_device ? " + " + std::to_string(kHostBytesPerDeviceBlock) +
                                                               " bytes of host bookkeeping per reported block"
                                                         : std::string();
        mm.what = std::string(a.device ? "device" : "heap") + " bytes not explained by reported capacity + pool + "
                  "workspace" + bookkeeping;
        mm.expected = static_cast<double>(a.lowest_unexplained + reported_growth + a.slack);
        mm.actual = static_cast<double>(grown_since);
        scope_.fail(std::string("since create ") +
                        (a.device           ? "device memory in use"
                         : a.host_of_device ? "the host heap of this DEVICE cache (watched as well as device memory)"
                                            : "the allocator") +
                        " grew by " + std::to_string(grown_since) + " bytes while the reported K/V storage and "
                        "workspace" + bookkeeping + " grew by " + std::to_string(reported_growth) + " bytes: " +
                        std::to_string(rise) +
                        " bytes of hidden storage (caching Q, or K/V it does not report; allowed: a slack of " +
                        std::to_string(a.slack) + " bytes" +
                        (a.workspace_credit > 0 ? " and the " + std::to_string(a.workspace_credit) +
                                                      " bytes of the declared workspace that create() did not allocate"
                                                : std::string()) +
                        ")",
                    mm);
    }
    a.lowest_unexplained = std::min(a.lowest_unexplained, unexplained);
}

void MemoryWatch::judge(const Reading& grown, const kvc_memory& m) {
    const bool create = !baseline_set_;
    if (create) {
        workspace_ = m.workspace_bytes;
        result_.workspace_bytes = workspace_;
    } else if (m.workspace_bytes != workspace_) {
        Mismatch mm;
        mm.what = "workspace_bytes";
        mm.expected = static_cast<double>(workspace_);
        mm.actual = static_cast<double>(m.workspace_bytes);
        scope_.fail("reported workspace changed after create (" + std::to_string(workspace_) + " -> " +
                        std::to_string(m.workspace_bytes) + " bytes): a workspace is constant; storage that grows with "
                        "the tokens appended is K/V (capacity, pool) or hidden storage",
                    mm);
    }
    if (device_.on) judge_account(device_, grown.device, m);
    if (heap_.on) judge_account(heap_, grown.heap, m);
    baseline_set_ = true;
    const Account& primary = device_.on ? device_ : heap_; // what the NO-Q note describes
    if (create) result_.create_unreported_bytes = primary.create_unreported;
    result_.hidden_heap_bytes = std::max(result_.hidden_heap_bytes, primary.worst_rise);
    check_kv_bound(m);
}

void MemoryWatch::check_kv_bound(const kvc_memory& m) const {
    const uint64_t row_bytes = token_bytes(cfg_);
    const uint64_t block = std::max<uint32_t>(m.block_size, 1u);
    const uint64_t blocks =
        static_cast<uint64_t>(cfg_.max_seqs) * cfg_.n_layers * ((cfg_.max_tokens + block - 1) / block);
    const long double bound = 2.0L * blocks * block * row_bytes + blocks * 4096.0L + 65536.0L;
    const long double kv = static_cast<long double>(m.capacity_bytes) + m.pool_bytes;
    if (kv <= bound) return;
    Mismatch mm;
    mm.what = "capacity_bytes + pool_bytes";
    mm.expected = static_cast<double>(bound);
    mm.actual = static_cast<double>(kv);
    scope_.fail("reported K/V storage (capacity + pool) exceeds twice the formula at max_seqs x max_tokens in whole "
                "blocks plus a page per block: pool_bytes is storage for K/V, not for anything else",
                mm);
}

void check_memory_report(const CheckScope& scope, const kvc_memory& m, const CacheModel& model, bool forked) {
    const CaseConfig& cfg = model.config();
    const uint64_t block = std::max<uint32_t>(m.block_size, 1u);
    const uint64_t live = model.live_bytes(), bound = model.live_bytes_in_blocks(block);
    Mismatch mm;
    if (m.live_bytes != live) {
        mm.what = "live_bytes";
        mm.expected = static_cast<double>(live);
        mm.actual = static_cast<double>(m.live_bytes);
        scope.fail(cfg.dv() == cfg.head_dim ? std::string(kLiveBytesRule)
                                            : "reported live bytes differ from tokens * n_kv_heads * (head_dim + "
                                              "head_dim_v) * sizeof(dtype): a K row of head_dim dims and a V row of "
                                              "head_dim_v (" + std::to_string(cfg.head_dim) + " + " +
                                                  std::to_string(cfg.dv()) + ")",
                   mm);
    }
    if (m.capacity_bytes > bound) {
        mm.what = "capacity_bytes";
        mm.expected = static_cast<double>(bound);
        mm.actual = static_cast<double>(m.capacity_bytes);
        scope.fail(cfg.evict ? "reported capacity exceeds what an evicting cache may hold: per sequence and layer, "
                               "the blocks of " + std::to_string(block) + " tokens that hold the sinks and the rows "
                               "a later query can see, plus one block (rows that left the window are not freed)"
                             : "reported capacity exceeds the formula rounded up to whole blocks of " +
                                   std::to_string(block) + " tokens per sequence and layer",
                   mm);
    }
    // without sharing (no fork yet) the live rows need at least their own bytes
    if (!forked && m.capacity_bytes < live) {
        mm.what = "capacity_bytes";
        mm.expected = static_cast<double>(live);
        mm.actual = static_cast<double>(m.capacity_bytes);
        scope.fail("reported capacity is smaller than the live bytes although no storage is shared (no fork yet)", mm);
    }
    const uint32_t largest_block = std::max(cfg.max_tokens, kLargestFixedBlock);
    if (m.block_size == 0 || m.block_size > largest_block) {
        mm.what = "block_size";
        mm.expected = m.block_size == 0 ? 1 : largest_block;
        mm.actual = m.block_size;
        scope.fail("reported block size " + std::to_string(m.block_size) + " is outside 1 .. " +
                       std::to_string(largest_block) + " (max_tokens, or a fixed page of up to " +
                       std::to_string(kLargestFixedBlock) + " tokens where max_tokens is shorter): capacity is held "
                       "to whole blocks, so a larger block would excuse storage no row needs",
                   mm);
    }
}

void check_shared_capacity(const CheckScope& scope, const kvc_memory& m, const CacheModel& model) {
    const uint32_t block = std::max<uint32_t>(m.block_size, 1u);
    const uint64_t bound = model.shared_bytes_in_blocks(block);
    if (m.capacity_bytes <= bound) return;
    Mismatch mm;
    mm.what = "capacity_bytes";
    mm.expected = static_cast<double>(bound);
    mm.actual = static_cast<double>(m.capacity_bytes);
    scope.fail("reported capacity exceeds the blocks of " + std::to_string(block) + " tokens the sequences need when "
               "each full block a fork shares is counted once (" + std::to_string(bound / std::max<uint64_t>(
                   uint64_t{block} * model.row_bytes(), 1)) + " blocks): the cache declares KVC_FEATURE_FORK_SHARES, "
               "so a shared block is neither counted once per sequence nor copied",
               mm);
}

} // namespace kvc::prop
