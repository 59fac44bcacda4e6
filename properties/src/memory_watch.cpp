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
        device_ = DeviceWatch::open(&why_not);
        if (device_) {
            kind_ = Kind::Device;
            result_.watched = "device memory (" + device_->library() + ")";
        } else {
            result_.watch_not_run = why_not;
        }
    } else if (checks.heap && !device) {
        if (!heap_accounting_exact())
            throw std::runtime_error(std::string("the allocator watch needs glibc's per-thread cache off: run "
                                                 "with GLIBC_TUNABLES=") + kExactHeapTunable +
                                     " (kvcheck sets it itself; see properties/include/kvcheck/properties/heap.hpp)");
        kind_ = Kind::Heap;
        result_.watched = "heap";
    }
}

int64_t MemoryWatch::reading(const char* call, const char* when) const {
    switch (kind_) {
    case Kind::None: return 0;
    case Kind::Heap: return heap_in_use();
    case Kind::Device:
        try {
            return device_->used();
        } catch (const std::runtime_error& e) { // after a call: most likely a sticky error the call left
            throw AbiError(KVC_ERR_INTERNAL, std::string(e.what()) + " (" + when + " " + call + ")");
        }
    }
    return 0;
}

void MemoryWatch::judge_create(const kvc_memory& m, int64_t reported) {
    baseline_set_ = true;
    workspace_ = m.workspace_bytes;
    create_unreported_ = grown_ - reported;
    workspace_credit_ =
        std::clamp<int64_t>(-create_unreported_, 0, static_cast<int64_t>(std::min<uint64_t>(workspace_, 1ull << 61)));
    base_grown_ = grown_;
    base_reported_ = reported;
    result_.workspace_bytes = workspace_;
    result_.create_unreported_bytes = create_unreported_;
    const int64_t besides_kv = static_cast<int64_t>(std::min<uint64_t>(workspace_, uint64_t{1} << 62)) +
                               std::max<int64_t>(create_unreported_, 0);
    if (m.workspace_bytes > kMaxWorkspaceBytes ||
        besides_kv > static_cast<int64_t>(kMaxWorkspaceBytes) + kHeapSlackBytes) {
        Mismatch mm;
        mm.what = "workspace bytes";
        mm.expected = static_cast<double>(kMaxWorkspaceBytes);
        mm.actual = static_cast<double>(besides_kv);
        scope_.fail("create() holds " + std::to_string(besides_kv) + " bytes besides its K/V storage (declared "
                    "workspace " + std::to_string(workspace_) + "): more than the 256 MiB a constant workspace may take",
                    mm);
    }
    check_kv_bound(m);
}

void MemoryWatch::judge(int64_t grown, const kvc_memory& m) {
    grown_ += grown;
    const int64_t reported = saturated(m.capacity_bytes) + saturated(m.pool_bytes) + saturated(m.workspace_bytes);
    if (!baseline_set_) return judge_create(m, reported); // the window around create()
    Mismatch mm;
    if (m.workspace_bytes != workspace_) {
        mm.what = "workspace_bytes";
        mm.expected = static_cast<double>(workspace_);
        mm.actual = static_cast<double>(m.workspace_bytes);
        scope_.fail("reported workspace changed after create (" + std::to_string(workspace_) + " -> " +
                        std::to_string(m.workspace_bytes) + " bytes): a workspace is constant; storage that grows with "
                        "the tokens appended is K/V (capacity, pool) or hidden storage",
                    mm);
    }
    const int64_t grown_since = grown_ - base_grown_, reported_growth = reported - base_reported_;
    const int64_t raw = grown_since - reported_growth; // the lazy workspace's credit absorbs growth, never a fall
    const int64_t unexplained = raw > 0 ? std::max<int64_t>(raw - workspace_credit_, 0) : raw;
    const int64_t rise = unexplained - lowest_unexplained_;
    result_.hidden_heap_bytes = std::max(result_.hidden_heap_bytes, rise);
    const bool blind = kind_ == Kind::Heap && heap_watch_blind_reason() != nullptr; // ASan: NO-Q's note
    const bool dev = kind_ == Kind::Device;
    const int64_t slack = dev ? kDeviceSlackBytes : kHeapSlackBytes;
    if (rise > slack && !blind) {
        mm.what = std::string(dev ? "device" : "heap") + " bytes not explained by reported capacity + pool + "
                  "workspace";
        mm.expected = static_cast<double>(lowest_unexplained_ + reported_growth + slack);
        mm.actual = static_cast<double>(grown_since);
        scope_.fail(std::string("since create ") + (dev ? "device memory in use" : "the allocator") + " grew by " +
                        std::to_string(grown_since) + " bytes while the reported K/V storage and workspace grew by " +
                        std::to_string(reported_growth) + " bytes: " + std::to_string(rise) +
                        " bytes of hidden storage (caching Q, or K/V it does not report; allowed: a slack of " +
                        std::to_string(slack) + " bytes" +
                        (workspace_credit_ > 0 ? " and the " + std::to_string(workspace_credit_) +
                                                     " bytes of the declared workspace that create() did not allocate"
                                               : std::string()) +
                        ")",
                    mm);
    }
    lowest_unexplained_ = std::min(lowest_unexplained_, unexplained);
    check_kv_bound(m);
}

void MemoryWatch::check_kv_bound(const kvc_memory& m) const {
    const uint64_t row_bytes =
        2ull * cfg_.n_kv_heads * head_row_bytes(cfg_.cache_dtype, cfg_.head_dim, cfg_.int8_scale_dtype);
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
        scope.fail(kLiveBytesRule, mm);
    }
    if (m.capacity_bytes > bound) {
        mm.what = "capacity_bytes";
        mm.expected = static_cast<double>(bound);
        mm.actual = static_cast<double>(m.capacity_bytes);
        scope.fail("reported capacity exceeds the formula rounded up to whole blocks of " + std::to_string(block) +
                       " tokens per sequence and layer",
                   mm);
    }
    // without sharing (no fork yet) the live rows need at least their own bytes
    if (!forked && m.capacity_bytes < live) {
        mm.what = "capacity_bytes";
        mm.expected = static_cast<double>(live);
        mm.actual = static_cast<double>(m.capacity_bytes);
        scope.fail("reported capacity is smaller than the live bytes although no storage is shared (no fork yet)", mm);
    }
    if (m.block_size == 0 || (cfg.max_tokens > 0 && m.block_size > std::max(cfg.max_tokens, 1u))) {
        mm.what = "block_size";
        mm.expected = 1;
        mm.actual = m.block_size;
        scope.fail("reported block size must be between 1 and max_tokens", mm);
    }
}

} // namespace kvc::prop
