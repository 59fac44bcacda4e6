#include "block_pool.hpp"

#include "dtype_convert.hpp"

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

// Large slabs ask for transparent huge pages: a decode walks one head's rows block by block, a new 4 KiB page
// every run, and TLB misses on those pages were what kept the prefetches from running ahead. Only the 2 MiB-aligned
// middle of the slab is advised (it is malloc's memory; the ends may share pages with other chunks). Never in seal
// mode, where mprotect works on single pages.
void advise_huge_pages_impl(void* slab, uint64_t bytes) {
    constexpr uintptr_t kHuge = uintptr_t(2) << 20;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(slab) + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(slab) + bytes) & ~(kHuge - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE); // advice: failure is harmless
}

} // namespace

void BlockPool::advise_huge_pages(void* slab, uint64_t bytes) const {
    if (!opt_.seal) advise_huge_pages_impl(slab, bytes);
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
    for (void* s : slabs_) std::free(s);
}

bool BlockPool::grow(uint64_t at_least) {
    uint64_t n = std::max<uint64_t>(at_least, base_.size() / kGrowthDivisor);
    n = std::max<uint64_t>(n, std::min<uint64_t>(kSmallSlabBlocks, std::max<uint64_t>(1, kSmallSlabBytes / stride_)));
    const uint64_t limit = std::min<uint64_t>(opt_.max_blocks ? opt_.max_blocks : kMaxBlockIds, kMaxBlockIds);
    if (base_.size() + at_least > limit) return false;
    n = std::min<uint64_t>(n, limit - base_.size());
    const uint64_t bytes = n * stride_;
    if (bytes / stride_ != n) return false;
    void* slab = nullptr;
    if (posix_memalign(&slab, opt_.seal ? page_ : 64, static_cast<size_t>(bytes)) != 0 || slab == nullptr)
        return false;
    try {
        const size_t total = base_.size() + n;
        base_.reserve(total);
        refs_.reserve(total);
        sealed_.reserve(total);
        free_.reserve(free_.size() + n);
        slabs_.reserve(slabs_.size() + 1);
    } catch (...) {
        std::free(slab);
        return false;
    }
    slabs_.push_back(slab);
    held_bytes_ += malloc_usable_size(slab);
    advise_huge_pages(slab, bytes);
    const auto first = static_cast<uint32_t>(base_.size());
    for (uint64_t i = 0; i < n; ++i) {
        base_.push_back(static_cast<uint8_t*>(slab) + i * stride_);
        refs_.push_back(0);
        sealed_.push_back(0);
    }
    // Lowest id on top: a fresh slab is handed out in address order, so one sequence's blocks are contiguous.
    for (uint64_t i = n; i-- > 0;) free_.push_back(first + static_cast<uint32_t>(i));
    return true;
}

bool BlockPool::reserve(uint64_t n) {
    if (free_.size() >= n) return true;
    return grow(n - free_.size());
}

uint32_t BlockPool::take() {
    if (free_.empty()) std::abort(); // a caller skipped reserve(): a bug, not an out-of-memory condition
    const uint32_t id = free_.back();
    free_.pop_back();
    refs_[id] = 1;
    if (opt_.poison) poison(id);
    return id;
}

void BlockPool::drop(uint32_t id) {
    if (--refs_[id] != 0) return;
    if (sealed_[id]) protect(id, false);
    free_.push_back(id);
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
    const uint32_t es = opt_.dtype == KVC_DTYPE_F32 ? 4 : 2;
    uint8_t* p = base_[id];
    for (uint64_t off = 0; off + es <= opt_.block_bytes; off += es) store_nan(opt_.dtype, p + off);
}

void BlockPool::shuffle_free(uint64_t seed) {
    uint64_t s = seed;
    auto next = [&s] { // splitmix64: the same order on every platform
        s += 0x9e3779b97f4a7c15ull;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    };
    for (size_t i = free_.size(); i > 1; --i) std::swap(free_[i - 1], free_[next() % i]);
}

} // namespace kvc::opt
