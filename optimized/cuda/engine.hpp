// kvc::cuda::Engine: the CUDA engine behind the ABI. The host keeps the bookkeeping (one block table per
// (sequence, layer) stream, reference counts, the free list); the device keeps K/V in one arena of blocks and runs
// the kernels (kernels.cu). docs/cuda-engine.md.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/optimized/abi_checks.hpp"
#include "kvcheck/optimized/kv_layout.h"
#include "kernels.hpp" // Geometry

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvc::cuda {

// The probe: "" when a CUDA device is usable by this build, else why not (names the CUDA error).
std::string unavailable_reason();
// Whether unavailable_reason() has run in this process (and so CUDA was initialized here).
bool probed_in_this_process();

class Engine {
public:
    static std::unique_ptr<Engine> create(const kvc_config& c, kvc_status* status, std::string* error);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    kvc_status append_attend_batch(uint32_t layer, uint32_t n_seqs, const uint32_t* seq_ids, const uint32_t* offsets,
                                   const float* q, const float* k, const float* v, float* out);
    kvc_status read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out);
    // ABI 1.2: the scales of rows pos .. pos+n-1 of a quantized cache (abi.h read_kv_scales); UNSUPPORTED otherwise.
    kvc_status read_kv_scales(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out);
    kvc_status seq_length(uint32_t seq, uint32_t layer, uint32_t* length);
    kvc_status memory(kvc_memory* out);
    kvc_status fork(uint32_t parent, uint32_t child);
    kvc_status release(uint32_t seq);
    const char* last_error() const { return error_; }
    kvc_status fail(kvc_status s, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
    kvc_status fail(const opt::Refusal& r) { return fail(r.status, "%s", r.message); }

    static constexpr uint64_t kWorkspaceBytes = 8ull << 20; // fixed per-call scratch, allocated by create

private:
    Engine() = default;

    // |blocks| == ceil(length / B). With eviction blocks[sink_blocks_ .. sink_blocks_ + dropped - 1] are
    // opt::kDroppedBlock (freed; positions stay absolute), no other.
    struct Stream {
        std::vector<uint32_t> blocks;
        uint32_t length = 0;
        uint32_t dropped = 0; // blocks freed by eviction, right after the sinks' blocks
    };
    struct Sequence {
        std::vector<Stream> layers;
    };
    // Device memory of one call: the fixed workspace when it fits, else a transient allocation freed by the call.
    struct Scratch {
        uint8_t* base = nullptr;
        bool owned = false;
        ~Scratch();
    };

    const Stream* find(uint32_t seq, uint32_t layer) const;
    opt::CacheView view() const; // what the shared argument checks (abi_checks.hpp) read of this engine
    uint64_t blocks_needed(const Stream& s, uint32_t n) const;
    bool reserve_blocks(uint64_t n);    // grows the arena so that n more blocks can be taken
    uint32_t take_block();
    void drop_block(uint32_t id);
    uint32_t window_of(uint32_t layer) const { return windows_.empty() ? 0 : windows_[layer]; }
    // Evicting caches: frees the blocks of s whose every row no later query of the layer sees (window_rule.hpp, the
    // CPU engine's rule), after the sinks' blocks. Cannot fail.
    void evict_dead(Stream& s, uint32_t layer);
    kvc_status get_scratch(uint64_t bytes, Scratch& s, const char* op);
    kvc_status cuda_fail(cudaError_t e, const char* op, const char* what);
    // what the kernels read of this engine in a call of `layer` (the layout on the device, the config, the layer's
    // fp8 scales)
    Geometry device_geometry(uint32_t layer) const;
    // a byte range of each row pos .. pos + n - 1, K and V, packed (read_kv, read_kv_scales)
    kvc_status gather(const char* op, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, RowBytes rb,
                      void* k_out, void* v_out);
    // KVC_ERR_EVICTED when rows pos .. pos + n - 1 of the stream include a freed one, else KVC_OK
    kvc_status check_evicted(const char* op, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n);

    kvc_config cfg_{};
    uint32_t block_size_ = 0, elem_bytes_ = 0, group_ = 1;
    bool quantized_ = false, f16_scale_ = false; // a quantized dtype (quant_math.hpp); INT8_TOKEN: f16 scales
    // fp8: the scale of each (layer, KV head), [n_layers][n_kv_heads] (1 under KVC_SCALE_NONE, the layer's under
    // KVC_SCALE_TENSOR), copied at create: on the host for read_kv_scales, on the device (fp8_scales_: K's then
    // V's) for the kernels. Empty / nullptr for other dtypes.
    std::vector<float> k_scales_, v_scales_;
    float* fp8_scales_ = nullptr;
    uint64_t max_tokens_ = 0;
    kvc_kv_layout geometry_{};   // K rows; V rows too when head_dim_v == head_dim
    kvc_kv_layout geometry_v_{}; // V rows (kvc_kv_layout_make_v)
    uint32_t head_dim_v_ = 0;    // the config's head_dim_v, or head_dim when that is 0
    uint64_t block_bytes_ = 0;   // K and V planes of one block (kvc_kv_block_bytes_kv)
    // Windows (ABI 1.2): W of each layer (empty: no window anywhere; the config's array is the harness's, copied at
    // create), the sinks, eviction, and the leading blocks that hold sinks (never freed).
    std::vector<uint32_t> windows_;
    uint32_t n_sinks_ = 0, sink_blocks_ = 0;
    bool evict_ = false;
    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    // the arena: [arena_blocks_ blocks][arena_blocks_ block addresses (the layout's block_base)]
    uint8_t* arena_ = nullptr;
    uint64_t arena_blocks_ = 0;
    uint64_t arena_bytes_ = 0;
    std::vector<uint32_t> refcount_; // [arena_blocks_]
    std::set<uint32_t> free_;        // free block ids; the lowest is taken first
    uint64_t in_use_ = 0;
    uint8_t* workspace_ = nullptr; // kWorkspaceBytes
    double* inv_freq_ = nullptr;   // [rope_dims / 2] on the device, when RoPE is on
    uint32_t rope_dims_ = 0;       // rotated dims: the config's rope_dims, or head_dim when that is 0
    std::unordered_map<uint32_t, Sequence> seqs_;
    char error_[512] = "no error";
};

} // namespace kvc::cuda
