// The x86 kernels' group path (part of attention_kernel_x86.hpp): the hooks each including file defines for its
// registers, and the query block they read.
#pragma once

#ifndef KVC_KERNEL_TARGET
#error "include attention_kernel_x86.hpp, which defines the target, not attention_kernel_x86_group.hpp on its own"
#endif

#include "attention_kernel.hpp"
#include "attention_kernel_x86_walk.hpp"
#include "simd.hpp"

#include "kvcheck/optimized/softmax_state.hpp"

#include <immintrin.h>

#include <cstdint>

namespace kvc::opt {
namespace {

// The group path: tiles of 4 or more rows in phase 1; f16/bf16 tiles of 5 or more in phase 4.
// Why (measured on Zen 3, docs/log/performance-log.md): on the direct path a GQA tile of 8 rows spends half its time in phase
// 1, whose 8 accumulators (8 rows x 1 key) leave no slack over the FMA latency (16 dependent FMAs per key at d = 128),
// and phase 4 widens every V row twice (once per half of the tile). The group path replaces both loops with the two
// hooks below, which each kernel defines for its registers (attention_kernel_avx2.cpp: 4 x 3 score blocks, V widened
// once into an L1 scratch; attention_kernel_avx512.cpp: two accumulators per zmm, V straight from the cache). The bits
// are those of the direct path: widening is exact, and each dot product and each output element keeps its own
// accumulator and the order of its operations; only which of them share a loop changes.
constexpr uint32_t kPieceKeys = 16;

// The group path's inner loops, defined by the including file for its instruction set (same bits either way).
// Phase 1 for R >= 4 rows over one block run: scores of keys j0 .. j0 + run - 1 into sc[r][j0 ..]. The rows' queries
// are copies (group_queries, in the layout `pairs` says) from one base q, so that a register block addresses all of
// them from one register: with a pointer per row, 8 rows and 4 keys ran out of general registers (measured).
template <uint32_t DT, int R>
KVC_KERNEL_TARGET void group_scores(const float (*q)[kSimdMaxHeadDim], bool pairs, const uint8_t* kp, uint32_t run,
                                    uint64_t row_bytes, uint32_t d, __m256 scale, RowPrefetcher& pf,
                                    float (*sc)[kSplitKeys], uint32_t j0);
// Which layout group_scores takes its queries in (group_queries), asked once per split: rows one by one (false), or
// in interleaved pairs (true: the AVX-512 kernel's score blocks of row pairs, on the machines where they are faster).
KVC_KERNEL_TARGET bool group_query_pairs();
// The rows of one tile into group_scores' query block `out` (dq floats per row, zero-padded like the tile's):
//  - one by one: row r at out[r];
//  - in pairs: rows 2p and 2p + 1 together in out[2p] .. out[2p + 1] (2 kSimdMaxHeadDim floats read as one array), chunk
//    c of 8 floats of row 2p at 16c and of row 2p + 1 at 16c + 8; the odd row of an odd R is zeros.
// The block's rows: R one by one, R rounded up to even in pairs.
template <int R>
constexpr int group_query_rows(bool pairs) {
    return pairs ? (R + 1) / 2 * 2 : R;
}
template <int R>
KVC_KERNEL_TARGET inline void group_queries(const RowTile& t, uint32_t dq, bool pairs, float (*out)[kSimdMaxHeadDim]) {
    const uint32_t step = pairs ? 16 : 8; // floats from one chunk of a row to its next
    for (int r = 0; r < group_query_rows<R>(pairs); ++r) {
        float* row = pairs ? out[r & ~1] + 8 * (r & 1) : out[r];
        for (uint32_t c = 0; c < dq; c += 8)
            _mm256_store_ps(row + c / 8 * step, r < R ? _mm256_loadu_ps(t.q[r] + c) : _mm256_setzero_ps());
    }
}
// Those rows as one pointer each, for the loops that take them so (dots, score_run_kj).
template <int R>
inline void row_pointers(const float (*q)[kSimdMaxHeadDim], const float* (&out)[R]) {
    for (int r = 0; r < R; ++r) out[r] = q[r];
}
// Phase 4 of the group path for count V rows of one block run that all R rows see: o[r] += sum over keys i < count
// of p[r][col + i] * v_i, every output element taking its keys in key order (p: the rows' probabilities, one row of
// the split's score buffer each); `wide` is an L1 scratch of kPieceKeys x dq floats where KVC_GROUP_VALUES_SCRATCH
// is 1 (else null); prefetching
// trickles along (row v0 + i).
template <uint32_t DT, int R>
KVC_KERNEL_TARGET void group_values(const uint8_t* v, uint64_t row_bytes, uint32_t count, uint32_t d, uint32_t dq,
                                    float* wide, const float (*p)[kSplitKeys], uint32_t col, SoftmaxState* st,
                                    RowPrefetcher* pf, uint32_t v0);



} // namespace
} // namespace kvc::opt
