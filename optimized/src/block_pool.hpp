// The pool of K/V blocks: slabs from malloc, a free list, a reference count per block, and (test mode) sealing of
// full blocks with mprotect and NaN poisoning of fresh blocks.
//
// Why malloc and not mmap: the conformance harness watches heap growth (mallinfo2) and holds it against
// capacity_bytes + pool_bytes, so every byte of K/V storage comes from malloc and is reported (held_bytes()).
//
// Why slabs are returned: after a peak of live tokens the free blocks would otherwise stay held for good (a
// serving trace held 1.5x its live bytes on average). take() hands out the lowest free id, and ids ascend through
// the slabs, so new blocks fill the oldest slabs and the youngest drain; a slab whose every block is free goes back
// to malloc once the other slabs' free blocks could still serve as much (docs/kv_layout.md).
#pragma once

#include <cstdint>
#include <vector>

namespace kvc::opt {

// Asks for transparent huge pages on the 2 MiB-aligned middle of [p, p + bytes) (malloc's memory: the ends may share
// pages with other chunks). Advice only: failure is harmless. Call it before the pages are first touched.
void advise_huge_pages(void* p, uint64_t bytes);

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
    // malloc refuses. keep: the pool never shrinks below what it holds after this call (a server's reservation).
    bool reserve(uint64_t n, bool keep = false);
    // The free block with the lowest id, reference count 1 (reserve first: take() on an empty free list aborts).
    uint32_t take();
    void retain(uint32_t id) { ++refs_[id]; }
    // Drops one reference; at zero the block is unsealed and goes back to the free list, and its slab back to
    // malloc when the slab is wholly free and enough other free blocks remain.
    void drop(uint32_t id);
    // Seal mode: the block becomes read-only until it is freed. Otherwise nothing.
    void seal(uint32_t id);

    uint32_t refcount(uint32_t id) const { return refs_[id]; }
    bool sealed(uint32_t id) const { return sealed_[id] != 0; }
    uint8_t* base(uint32_t id) const { return base_[id]; }
    uint8_t* const* bases() const { return base_.data(); } // entries of returned slabs are NULL (never in a table)

    uint64_t block_bytes() const { return opt_.block_bytes; }
    uint64_t stride() const { return stride_; }                // bytes between blocks in a slab
    uint64_t blocks_total() const { return blocks_held_; }     // blocks in slabs still held
    uint64_t blocks_in_use() const { return blocks_held_ - free_.size(); }
    uint64_t held_bytes() const { return held_bytes_; }        // every byte malloc gave the slabs still held
    uint64_t slabs_returned() const { return slabs_returned_; } // tests and benchmarks: slabs given back so far

    // Compaction, when free blocks pile up in slabs that are not wholly free (the engine moves the blocks:
    // compact.cpp). begin_drain() picks the emptiest slabs whose blocks are all private (reference count <= 1) and
    // whose used blocks fit in the other slabs' free blocks, takes their free blocks off the free list, and returns
    // whether it picked any; the caller then moves every used block of a draining slab to take()'s block and
    // drops the old one; end_drain() returns the drained slabs to malloc.
    bool begin_drain();
    bool draining(uint32_t id) const { return slabs_[slab_of_[id]].draining; }
    void end_drain();

    // Benchmarks: reorders the free list (a deterministic shuffle), so that take() scatters blocks.
    void shuffle_free(uint64_t seed);

private:
    struct Slab {
        void* mem = nullptr;  // NULL once returned: its ids wait for a later slab of at most that many blocks
        uint32_t first = 0;   // block ids first .. first + n - 1
        uint32_t n = 0;
        uint32_t free = 0;    // of its blocks on the free list
        uint64_t usable = 0;  // malloc_usable_size(mem)
        bool draining = false; // between begin_drain() and end_drain(): its free blocks are off the free list
    };

    bool grow(uint64_t at_least);
    void release_slab(uint32_t s);
    void heap_push(uint32_t id);
    bool before(uint32_t a, uint32_t b) const; // heap order: true when b is handed out before a
    void advise_huge_pages(void* slab, uint64_t bytes) const;
    void poison(uint32_t id);
    void protect(uint32_t id, bool read_only);

    PoolOptions opt_;
    uint64_t stride_ = 0;
    uint64_t page_ = 4096;
    uint64_t held_bytes_ = 0;
    uint64_t blocks_held_ = 0;
    uint64_t keep_blocks_ = 0;    // reserve(n, keep = true) floor
    uint64_t slabs_returned_ = 0;
    std::vector<uint8_t*> base_;   // block id -> first byte (NULL: its slab was returned)
    std::vector<uint32_t> refs_;   // block id -> references (0: on the free list, or its slab returned)
    std::vector<uint8_t> sealed_;  // block id -> currently read-only
    std::vector<uint32_t> slab_of_; // block id -> index in slabs_
    std::vector<uint32_t> free_;   // min-heap of free ids (by rank_ after shuffle_free)
    std::vector<uint32_t> rank_;   // empty, or the shuffled order of every id (benchmarks)
    std::vector<Slab> slabs_;
    std::vector<uint32_t> drained_; // slabs picked by begin_drain()
};

} // namespace kvc::opt
