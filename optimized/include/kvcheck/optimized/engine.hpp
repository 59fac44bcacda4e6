// The paged CPU KV-cache engine as a C++ class. The ABI table (cpu_engine.h) is a thin wrapper over it; tests and
// benchmarks use the class directly for what the ABI does not offer: options (sealing, poisoning, a block limit,
// threads, SIMD on/off), append without attention, and a look at where a token lives.
//
// Every method that can fail returns a kvc_status and leaves a message in last_error(); a failed call changes
// nothing. Methods never throw.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/optimized/kv_layout.h"

#include <cstdint>
#include <memory>
#include <string>

namespace kvc::opt {

struct EngineOptions {
    bool seal_full_blocks = false; // mprotect every full block read-only (blocks page-aligned, page-rounded)
    bool poison_unused = false;    // every slot of a fresh block holds NaN until it is written
    uint64_t max_blocks = 0;       // 0: limited by malloc only; otherwise appends beyond it are OUT_OF_MEMORY
    unsigned threads = 0;          // 0: every core; 1: the calling thread only
    bool simd = true;              // false: the portable kernels even where AVX2/F16C exist
    bool group_heads = true;       // false: a decode walks one KV head per kernel call (same bits; benchmarks A/B)
};

class Engine {
public:
    static constexpr uint32_t kDefaultBlockSize = 16;

    // A new engine for config, or nullptr with the reason in *error.
    static std::unique_ptr<Engine> create(const kvc_config& config, const EngineOptions& options, kvc_status* status,
                                          std::string* error);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // The ABI operations (same contracts as include/kvcheck/abi.h).
    kvc_status append_attend(uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                             const float* v, float* out);
    kvc_status append_attend_batch(uint32_t layer, const kvc_batch* batch);
    kvc_status read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out);
    // ABI 1.2: the scales of rows pos .. pos+n-1 of a quantized cache (abi.h read_kv_scales); UNSUPPORTED otherwise.
    kvc_status read_kv_scales(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out);
    kvc_status seq_length(uint32_t seq, uint32_t layer, uint32_t* length);
    kvc_status memory(kvc_memory* out);
    kvc_status fork(uint32_t parent, uint32_t child);
    kvc_status release(uint32_t seq);
    const char* last_error() const;

    // Append without attention (RoPE still applied to k): filling a cache for benchmarks and tests.
    kvc_status append(uint32_t seq, uint32_t layer, uint32_t n_new, const float* k, const float* v);

    // Makes n free blocks available ahead of need and keeps them (free slabs are not returned below what the pool
    // holds after this call), and (benchmarks) shuffles the free list so that later appends scatter their blocks.
    kvc_status reserve_blocks(uint64_t n);
    void shuffle_free_blocks(uint64_t seed);
    // Threads later calls may use (EngineOptions::threads); results do not depend on it.
    void set_threads(unsigned threads);
    // EngineOptions::group_heads for later calls; results do not depend on it.
    void set_group_heads(bool on);

    // Where token pos of (seq, layer) lives: the first byte of its row for kv head `head` in plane KVC_PLANE_K or
    // KVC_PLANE_V; pos may reach past the length up to the end of the last block (to inspect poisoned slots).
    // nullptr when there is no such slot.
    const uint8_t* slot_address(uint32_t seq, uint32_t layer, uint64_t pos, uint32_t plane, uint32_t head) const;
    // The layout's geometry (block_base is not filled: block addresses move as the pool grows).
    kvc_kv_layout geometry() const;
    // V rows' geometry: geometry() when head_dim_v == head_dim, else rows of head_dim_v dims whose plane starts
    // geometry().plane_bytes into a block (kvc_kv_layout_v, optimized/src/engine_impl.hpp).
    kvc_kv_layout geometry_v() const;
    uint32_t block_size() const;
    bool uses_simd() const; // the AVX2/F16C kernels are in use
    const kvc_config& config() const;

    struct Impl; // the state (src/engine_impl.hpp)

private:
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

} // namespace kvc::opt
