// The one attention kernel: the exact softmax state of up to kTileRows query rows over one split of the keys of
// one KV head of one stream.
//
// Rows of a tile share the KV head (the query heads of one GQA group, and/or several query tokens), so each cached
// byte the kernel reads serves every row of the tile. Each row has its own visible keys: below its causal limit,
// and, with a sliding window, from its window's start on or below the sinks (RowTile). The split is the key range
// [k0, k0 + kSplitKeys), k0 a multiple of kSplitKeys; the kernel computes, for each row, the state over the split's
// keys the row sees (empty when there are none). Keys a row does not see are skipped, never multiplied by zero.
//
// The arithmetic of one row never depends on the other rows of its tile, on the tile size, or on which thread runs
// it: that, plus the fixed split and merge structure (attention.hpp), is the engine's determinism contract.
#pragma once

#include "kvcheck/optimized/kv_layout.h"
#include "kvcheck/optimized/softmax_state.hpp"

#include <cstdint>

namespace kvc::opt {

constexpr uint32_t kSplitKeys = 256;     // keys per split: a split's scores fit in a stack buffer
constexpr uint32_t kSegmentSplits = 4;   // splits per segment (the unit of work when a decode is spread out)
constexpr uint32_t kSegmentKeys = kSplitKeys * kSegmentSplits;
constexpr int kTileRows = 8;             // rows per kernel call: 8 accumulators fill the AVX2 register file
// The widest K or V row the engine takes (multi-head latent attention: K rows of 576 dims). Every kernel serves every
// shape up to it, V rows as wide as K rows or not (SplitArgs::v_layout); the x86 kernels' q blocks and V scratch on
// their stacks have rows of kSimdMaxHeadDim floats.
constexpr uint32_t kMaxHeadDim = 576;
constexpr uint32_t kSimdMaxHeadDim = kMaxHeadDim;
// Whether the x86 kernels serve K rows of head_dim and V rows of head_dim_v dims (else the engine runs the portable
// kernel): asked once per engine, and by the tests that check which kernel a shape gets.
constexpr bool simd_serves(uint32_t head_dim, uint32_t head_dim_v) {
    return head_dim <= kSimdMaxHeadDim && head_dim_v <= kSimdMaxHeadDim;
}

// head_dim rounded up to the SIMD width: q rows and state outputs are this long, zero-padded.
inline uint32_t padded_dim(uint32_t head_dim) { return (head_dim + 7u) & ~7u; }

struct RowTile {
    int n = 0;                      // rows in use, 1..kTileRows
    const float* q[kTileRows] = {}; // [padded_dim] each: rotated query, zero padding after head_dim
    uint32_t limit[kTileRows] = {}; // row r sees keys below limit[r] (causal: itself and everything before) ...
    uint32_t from[kTileRows] = {};  // ... that are at or after from[r] (its window's first key; 0: no window) ...
    uint32_t sinks = 0;             // ... or below sinks (attention sinks: visible in every windowed row)
};

struct SplitArgs {
    const kvc_kv_layout* layout; // geometry and block bases (of K; of V too when v_layout is null)
    const uint32_t* table;       // the stream's block table
    uint32_t kv_head;
    float scale;                 // softmax scale applied to q.k
    // fp8 caches: the scale of each KV head of the layer (indexed by KV head, not by kv_head - first); null for
    // other dtypes. int8 and q8_0 rows carry their own scales (kv_layout.h).
    const float* k_scales = nullptr;
    const float* v_scales = nullptr;
    // V rows of head_dim_v != head_dim: V's geometry (kvc_kv_layout_v, engine_impl.hpp); null: V rows are shaped
    // like K rows
    const kvc_kv_layout* v_layout = nullptr;
};

// Rows of one kernel call over all its heads: the scores of a split stay in a stack buffer of this many rows.
constexpr int kMaxCallRows = 16;
// KV heads one call may cover for tiles of `rows` rows.
inline uint32_t max_call_heads(int rows) { return static_cast<uint32_t>(kMaxCallRows / rows); }

// One call covers n_heads consecutive KV heads args.kv_head .. + n_heads - 1 (all heads of a block sit next to
// each other, so walking them together reads each block's planes in one sweep). tiles[h] is the tile of head
// args.kv_head + h: every tile has the same n, limits, windows and sinks, only q differs. states[h * kTileRows + r].o
// must point at padded_dim(V's head_dim) floats; the kernel writes m, l and o of every row 0..n-1 of every head.
// n_heads <= max_call_heads(n).
// A row's arithmetic is the same whatever n_heads is: the heads only interleave.
using SplitKernel = void (*)(const SplitArgs& args, uint32_t n_heads, const RowTile* tiles, uint32_t k0,
                             SoftmaxState* states);

// The kernel for a cache dtype when simd is allowed (quantized dtypes too: each K/V row is dequantized exactly,
// decode(code) * scale in f32 as the reference does, then used as an f32 row): AVX-512 where the CPU has AVX-512 F/DQ/VL/BW, else AVX2/FMA/F16C
// where it has those; portable otherwise. The two SIMD kernels give the same bits.
// fp8_fused: an fp8 cache whose scales fuse (fp8_scales_fuse, quantize.hpp) takes the x86 kernels' direct path, codes
// read in place and the scales applied per head; otherwise fp8 is dequantized exactly like int8 and q8_0.
SplitKernel split_kernel(uint32_t dtype, bool simd, bool fp8_fused = false);

// The three implementations (the dispatcher above picks one; tests may call any the CPU can run). The portable one
// always dequantizes exactly.
SplitKernel split_kernel_scalar(uint32_t dtype);
SplitKernel split_kernel_avx2(uint32_t dtype, bool fp8_fused = false);
SplitKernel split_kernel_avx512(uint32_t dtype, bool fp8_fused = false); // only where cpu_has_avx512()

// The x86 kernels' group path for tiles of several rows (on by default; in the AVX2 kernel: phase 1 in blocks of
// 4 rows x 3 keys, and f16/bf16 V rows widened once into an f32 scratch that every 4-row block of phase 4 reads).
// Off: in both kernels, the direct path for every tile (8 rows x 1 key, every block widening the cached rows
// itself). The bits are the same either way (widening is exact; every dot product and output element keeps its own
// accumulator and order). The switch exists for the benchmark's A/B and for the tests that check the paths agree.
// Process-wide: set it only while no kernel runs.
void set_avx2_group_path(bool on);
bool avx2_group_path();
// How the x86 kernels (AVX2 and AVX-512) walk a split (docs/performance.md, "How the kernel walks the cache"). None
// of it changes a bit of any result; it exists for the benchmark's A/B and the test that checks that. Process-wide:
// set it only while no kernel runs.
struct WalkPlan {
    uint16_t prefetch_rows = 16;  // rows per KV head fetched ahead of the row in use, along the block table
    bool prefetch_to_l2 = true;   // prefetcht1 (into L2); false: prefetcht0 (into L1), slower from memory
    bool interleave_heads = true; // tiles of 1-3 rows: visit each head for at most visit_keys keys at a time
    uint16_t visit_keys = 16;     // keys per visit where heads are interleaved (0 counts as 1); apart from
                                  // prefetch_rows: Intel cores visit 4 keys and still prefetch 16 rows ahead
    bool spread_prefetch = false; // the AVX-512 group path's V: each pass of a piece over the head dimension
                                  // prefetches its share of the rows ahead, instead of the first pass all of them
    uint8_t prime_kib = 0;        // KiB of each head's walk ahead of the row in use whose 4 KiB pages are primed
                                  // (their first two lines fetched, which starts the core's stream prefetcher on
                                  // them); 0: none
};
// The plan in use: at start, this machine's default (machine_walk, attention_kernel_avx2.cpp: interleave_heads off on
// AMD cores without AVX-512; visits of 4 keys and spread_prefetch on Intel cores; pages primed 8 KiB ahead on Intel
// cores and AMD cores with AVX-512).
void set_avx2_walk(const WalkPlan& plan);
WalkPlan avx2_walk();
// The AVX-512 kernel's own paths (on by default): the 512-bit group path for tiles of 4+ rows, and for tiles of 1-3
// rows the direct path with 32 registers. Off: that kernel runs the AVX2 kernel for every tile. Same bits either way;
// for the benchmark's A/B. Process-wide: set it only while no kernel runs.
void set_avx512_group_path(bool on);
bool avx512_group_path();
// The register layout of that 512-bit group path's score blocks (attention_kernel_avx512_scores.hpp): one key of two
// rows per register (on) or two keys of one row (off). At start: on for AMD family 25 (Zen 4), where it was measured
// faster; off elsewhere. Same bits either way; for the benchmark's A/B and the tests. Process-wide: set it only while
// no kernel runs.
void set_avx512_score_row_pairs(bool on);
bool avx512_score_row_pairs();
// How many times (since the process started) that group path began scoring a split of one KV head in each layout. The
// two layouts give the same bits, so a test cannot tell from the results which one ran; it reads these. Relaxed
// counts, one per split and head: not a measure of work.
struct ScoreLayoutSplits {
    uint64_t key_pairs = 0, row_pairs = 0;
};
ScoreLayoutSplits avx512_score_layout_splits();

} // namespace kvc::opt
