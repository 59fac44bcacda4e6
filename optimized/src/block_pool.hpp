// The pool of K/V blocks: slabs from malloc, a free list, a reference count per block, and (test mode) sealing of
// full blocks with mprotect and NaN poisoning of fresh blocks.
//
// Why malloc and not mmap: the conformance harness watches heap growth (mallinfo2) and holds it against
// capacity_bytes + pool_bytes, so every byte of K/V storage comes from malloc and is reported (held_bytes()).
#pragma once

#include <cstdint>
#include <vector>

namespace kvc::opt {

struct PoolOptions {
    uint64_t block_bytes = 0; // K and V bytes of one block (both planes), padding excluded
    uint32_t dtype = 0;       // for the NaN pattern
    bool seal = false;        // blocks page-aligned and page-rounded; seal() makes one read-only
    bool poison = false;      // every block handed out by take() is NaN in every slot
    uint64_t max_blocks = 0;  // 0: no limit but malloc's (and block ids, which are 32-bit)
};

class BlockPool {
public:
    explicit BlockPool(const PoolOptions& opt);
    ~BlockPool(); // unseals and frees every slab
    BlockPool(const BlockPool&) = delete;
    BlockPool& operator=(const BlockPool&) = delete;

    // Makes n blocks available to take() without allocating; false, with nothing taken, when the block limit or
    // malloc refuses.
    bool reserve(uint64_t n);
    // A free block with reference count 1 (reserve first: take() on an empty free list aborts).
    uint32_t take();
    void retain(uint32_t id) { ++refs_[id]; }
    // Drops one reference; at zero the block is unsealed and goes back to the free list.
    void drop(uint32_t id);
    // Seal mode: the block becomes read-only until it is freed. Otherwise nothing.
    void seal(uint32_t id);

    uint32_t refcount(uint32_t id) const { return refs_[id]; }
    bool sealed(uint32_t id) const { return sealed_[id] != 0; }
    uint8_t* base(uint32_t id) const { return base_[id]; }
    uint8_t* const* bases() const { return base_.data(); }

    uint64_t block_bytes() const { return opt_.block_bytes; }
    uint64_t stride() const { return stride_; }             // bytes between blocks in a slab
    uint64_t blocks_total() const { return base_.size(); }
    uint64_t blocks_in_use() const { return base_.size() - free_.size(); }
    uint64_t held_bytes() const { return held_bytes_; }     // every byte malloc gave the slabs

    // Benchmarks: reorders the free list (a deterministic shuffle), so that take() scatters blocks.
    void shuffle_free(uint64_t seed);

private:
    bool grow(uint64_t at_least);
    void advise_huge_pages(void* slab, uint64_t bytes) const;
    void poison(uint32_t id);
    void protect(uint32_t id, bool read_only);

    PoolOptions opt_;
    uint64_t stride_ = 0;
    uint64_t page_ = 4096;
    uint64_t held_bytes_ = 0;
    std::vector<uint8_t*> base_;   // block id -> first byte
    std::vector<uint32_t> refs_;   // block id -> references (0: on the free list)
    std::vector<uint8_t> sealed_;  // block id -> currently read-only
    std::vector<uint32_t> free_;   // stack of free ids; the top is handed out next
    std::vector<void*> slabs_;
};

} // namespace kvc::opt
