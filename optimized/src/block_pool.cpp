#include "block_pool.hpp"

#include <cstring>

#include "dtype_convert.hpp"
#include "kvcheck/reference/splitmix64.hpp"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace kvc::opt {
namespace {

uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

constexpr uint64_t kMaxBlockIds = 0xffffffffull; // ids are uint32_t in the block tables
constexpr uint64_t kSmallSlabBytes = 64 * 1024;  // a first slab this big (or 256 blocks, if fewer)
constexpr uint64_t kSmallSlabBlocks = 256;
constexpr uint64_t kGrowthDivisor = 64;          // later slabs: 1/64 of what is held, so reserve stays < 2 %

} // namespace

void advise_huge_pages(void* p, uint64_t bytes) {
    constexpr uintptr_t kHuge = uintptr_t(2) << 20;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// Large slabs ask for transparent huge pages: a decode walks one head's rows block by block, a new 4 KiB page
// every run, and TLB misses on those pages keep the prefetches from running ahead. Only the 2 MiB-aligned
// middle of the slab is advised (it is malloc's memory; the ends may share pages with other chunks). Never in seal
// mode, where mprotect works on single pages.
void BlockPool::advise_huge_pages(void* slab, uint64_t bytes) const {
    if (!opt_.seal) opt::advise_huge_pages(slab, bytes);
}

BlockPool::BlockPool(const PoolOptions& opt) : opt_(opt) {
    const long p = sysconf(_SC_PAGESIZE);
    page_ = p > 0 ? static_cast<uint64_t>(p) : 4096;
    // Seal mode rounds every block to whole pages so mprotect covers exactly one block. Otherwise blocks are packed.
    stride_ = opt_.seal ? round_up(opt_.block_bytes, page_) : opt_.block_bytes;
}

BlockPool::~BlockPool() {
    for (uint32_t id = 0; id < base_.size(); ++id)
        if (sealed_[id]) protect(id, false); // free() writes into the chunk: never hand it a read-only page
    for (const Slab& s : slabs_) std::free(s.mem);
}

bool BlockPool::before(uint32_t a, uint32_t b) const {
    const uint64_t ka = (uint64_t(rank_.empty() ? a : rank_[a]) << 32) | a;
    const uint64_t kb = (uint64_t(rank_.empty() ? b : rank_[b]) << 32) | b;
    return ka > kb; // std::*_heap keep the greatest on top: this puts the lowest key there
}

bool BlockPool::grow(uint64_t at_least) {
    uint64_t n = std::max<uint64_t>(at_least, blocks_held_ / kGrowthDivisor);
    n = std::max<uint64_t>(n, std::min<uint64_t>(kSmallSlabBlocks, std::max<uint64_t>(1, kSmallSlabBytes / stride_)));
    const uint64_t limit = std::min<uint64_t>(opt_.max_blocks ? opt_.max_blocks : kMaxBlockIds, kMaxBlockIds);
    if (blocks_held_ + at_least > limit) return false;
    n = std::min<uint64_t>(n, limit - blocks_held_);
    // The ids of a returned slab are reused by a new slab of at most that many blocks, so ids stay bounded by the
    // peak however often slabs come and go. Otherwise the new slab takes fresh ids.
    uint32_t reuse = UINT32_MAX;
    for (uint32_t s = 0; s < slabs_.size(); ++s)
        if (slabs_[s].mem == nullptr && slabs_[s].n >= n && (reuse == UINT32_MAX || slabs_[s].n < slabs_[reuse].n))
            reuse = s;
    if (reuse == UINT32_MAX && base_.size() + n > kMaxBlockIds) return false;
    const uint64_t bytes = n * stride_;
    if (bytes / stride_ != n) return false;
    void* mem = nullptr;
    if (posix_memalign(&mem, opt_.seal ? page_ : 64, static_cast<size_t>(bytes)) != 0 || mem == nullptr)
        return false;
    try {
        const size_t total = reuse == UINT32_MAX ? base_.size() + n : base_.size();
        base_.reserve(total);
        refs_.reserve(total);
        sealed_.reserve(total);
        slab_of_.reserve(total);
        if (!rank_.empty()) rank_.reserve(total);
        free_.reserve(free_.size() + n);
        slabs_.reserve(slabs_.size() + 2);
    } catch (...) {
        std::free(mem);
        return false;
    }
    uint32_t s = reuse;
    if (s == UINT32_MAX) {
        s = static_cast<uint32_t>(slabs_.size());
        slabs_.push_back(Slab{nullptr, static_cast<uint32_t>(base_.size()), static_cast<uint32_t>(n), 0, 0});
        base_.resize(base_.size() + n, nullptr);
        refs_.resize(base_.size(), 0);
        sealed_.resize(base_.size(), 0);
        slab_of_.resize(base_.size(), s);
        while (!rank_.empty() && rank_.size() < base_.size()) rank_.push_back(static_cast<uint32_t>(rank_.size()));
    } else if (slabs_[s].n > n) { // the rest of the returned range stays a returned range of its own
        const Slab rest{nullptr, slabs_[s].first + static_cast<uint32_t>(n), slabs_[s].n - static_cast<uint32_t>(n), 0, 0};
        slabs_.push_back(rest);
        for (uint32_t id = rest.first; id < rest.first + rest.n; ++id) slab_of_[id] = static_cast<uint32_t>(slabs_.size() - 1);
    }
    Slab& slab = slabs_[s];
    slab.mem = mem;
    slab.n = static_cast<uint32_t>(n);
    slab.free = slab.n;
    slab.usable = malloc_usable_size(mem);
    held_bytes_ += slab.usable;
    blocks_held_ += n;
    advise_huge_pages(mem, bytes);
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t id = slab.first + i;
        base_[id] = static_cast<uint8_t*>(mem) + uint64_t(i) * stride_;
        refs_[id] = 0;
        sealed_[id] = 0;
        slab_of_[id] = s;
        free_.push_back(id);
        std::push_heap(free_.begin(), free_.end(), [this](uint32_t a, uint32_t b) { return before(a, b); });
    }
    return true;
}

bool BlockPool::reserve(uint64_t n, bool keep) {
    if (free_.size() < n && !grow(n - free_.size())) return false;
    if (keep) keep_blocks_ = std::max(keep_blocks_, blocks_held_);
    return true;
}

uint32_t BlockPool::take() {
    if (free_.empty()) std::abort(); // a caller skipped reserve(): a bug, not an out-of-memory condition
    std::pop_heap(free_.begin(), free_.end(), [this](uint32_t a, uint32_t b) { return before(a, b); });
    const uint32_t id = free_.back();
    free_.pop_back();
    refs_[id] = 1;
    --slabs_[slab_of_[id]].free;
    if (opt_.poison) poison(id);
    return id;
}

void BlockPool::heap_push(uint32_t id) {
    free_.push_back(id);
    std::push_heap(free_.begin(), free_.end(), [this](uint32_t a, uint32_t b) { return before(a, b); });
}

void BlockPool::drop(uint32_t id) {
    if (--refs_[id] != 0) return;
    if (sealed_[id]) protect(id, false);
    const uint32_t s = slab_of_[id];
    Slab& slab = slabs_[s];
    if (slab.draining) { // end_drain() returns it
        ++slab.free;
        return;
    }
    heap_push(id);
    // Return a wholly free slab only while the other slabs' free blocks could still serve as much again (a burst
    // right after a release finds blocks without a malloc), and never below a reservation that asked to be kept.
    if (++slab.free == slab.n && free_.size() - slab.n >= slab.n && blocks_held_ - slab.n >= keep_blocks_)
        release_slab(s);
}

bool BlockPool::begin_drain() {
    // Worth it once free blocks exceed 1/16 of the pool (the slab reserve alone is 1/64); afterwards about 1/64
    // stays free, so a compaction frees at least 3/64 of the pool and its cost (a scan of the block tables, and a
    // copy of each moved block) is spread over that many releases.
    const uint64_t small = std::min<uint64_t>(kSmallSlabBlocks, std::max<uint64_t>(1, kSmallSlabBytes / stride_));
    const uint64_t keep_free = std::max(blocks_held_ / kGrowthDivisor, small);
    if (free_.size() <= blocks_held_ / 16 + keep_free) return false;
    std::vector<uint32_t> order;
    for (uint32_t s = 0; s < slabs_.size(); ++s)
        if (slabs_[s].mem != nullptr && slabs_[s].free > 0) order.push_back(s);
    std::sort(order.begin(), order.end(), [this](uint32_t a, uint32_t b) {
        const uint64_t fa = uint64_t(slabs_[a].free) * slabs_[b].n, fb = uint64_t(slabs_[b].free) * slabs_[a].n;
        return fa != fb ? fa > fb : a > b; // the emptiest (by fraction) first: the fewest blocks to move
    });
    uint64_t free_left = free_.size(), held_left = blocks_held_;
    drained_.clear();
    for (uint32_t s : order) {
        const Slab& slab = slabs_[s];
        const uint64_t used = slab.n - slab.free;
        // after draining: its free blocks leave, its used blocks take free blocks elsewhere
        if (free_left < slab.free + used + keep_free || held_left - slab.n < keep_blocks_) continue;
        bool shared = false;
        for (uint32_t id = slab.first; id < slab.first + slab.n && !shared; ++id) shared = refs_[id] > 1;
        if (shared) continue; // every table holding it would need the new id: leave it
        free_left -= slab.free + used;
        held_left -= slab.n;
        drained_.push_back(s);
        if (free_left <= keep_free + blocks_held_ / 64) break;
    }
    if (drained_.empty()) return false;
    for (uint32_t s : drained_) slabs_[s].draining = true;
    free_.erase(std::remove_if(free_.begin(), free_.end(), [this](uint32_t id) { return slabs_[slab_of_[id]].draining; }),
                free_.end());
    std::make_heap(free_.begin(), free_.end(), [this](uint32_t a, uint32_t b) { return before(a, b); });
    return true;
}

void BlockPool::end_drain() {
    for (uint32_t s : drained_) {
        slabs_[s].draining = false;
        if (slabs_[s].free == slabs_[s].n) {
            release_slab(s);
        } else { // a block was not moved (cannot happen when the caller moved them all): keep the slab
            for (uint32_t id = slabs_[s].first; id < slabs_[s].first + slabs_[s].n; ++id)
                if (refs_[id] == 0) heap_push(id);
        }
    }
    drained_.clear();
}

void BlockPool::release_slab(uint32_t s) {
    Slab& slab = slabs_[s];
    const uint32_t lo = slab.first, hi = slab.first + slab.n;
    free_.erase(std::remove_if(free_.begin(), free_.end(), [&](uint32_t id) { return id >= lo && id < hi; }),
                free_.end());
    std::make_heap(free_.begin(), free_.end(), [this](uint32_t a, uint32_t b) { return before(a, b); });
    for (uint32_t id = lo; id < hi; ++id) base_[id] = nullptr;
    std::free(slab.mem);
    slab.mem = nullptr;
    slab.free = 0;
    held_bytes_ -= slab.usable;
    blocks_held_ -= slab.n;
    ++slabs_returned_;
}

void BlockPool::seal(uint32_t id) {
    if (opt_.seal && !sealed_[id]) protect(id, true);
}

void BlockPool::protect(uint32_t id, bool read_only) {
    // A failed mprotect (too many mappings) leaves the block writable: test mode loses one trap, nothing breaks.
    if (mprotect(base_[id], static_cast<size_t>(stride_), read_only ? PROT_READ : PROT_READ | PROT_WRITE) == 0)
        sealed_[id] = read_only ? 1 : 0;
}

void BlockPool::poison(uint32_t id) {
    uint8_t* p = base_[id];
    if (opt_.dtype > KVC_DTYPE_BF16) { // quantized: 0xff is a NaN fp8 code and a NaN f32 or f16 scale
        std::memset(p, 0xff, opt_.block_bytes);
        return;
    }
    const uint32_t es = opt_.dtype == KVC_DTYPE_F32 ? 4 : 2;
    for (uint64_t off = 0; off + es <= opt_.block_bytes; off += es) store_nan(opt_.dtype, p + off);
}

void BlockPool::shuffle_free(uint64_t seed) {
    SplitMix64 rng{seed}; // the same order on every platform
    // The free blocks are handed out in a random order: their ranks are a shuffled permutation of themselves.
    if (rank_.empty())
        for (uint32_t id = 0; id < base_.size(); ++id) rank_.push_back(id);
    std::vector<uint32_t> ids = free_;
    std::sort(ids.begin(), ids.end());
    std::vector<uint32_t> ranks;
    for (uint32_t id : ids) ranks.push_back(rank_[id]);
    for (size_t i = ranks.size(); i > 1; --i) std::swap(ranks[i - 1], ranks[rng.next() % i]);
    for (size_t i = 0; i < ids.size(); ++i) rank_[ids[i]] = ranks[i];
    std::make_heap(free_.begin(), free_.end(), [this](uint32_t a, uint32_t b) { return before(a, b); });
}

} // namespace kvc::opt
