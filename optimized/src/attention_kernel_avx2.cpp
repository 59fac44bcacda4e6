// The AVX2/FMA/F16C split kernel: the x86 kernel body (attention_kernel_x86.hpp) compiled for those extensions,
// function by function (KVC_TARGET_AVX2), so this file links into a portable binary; split_kernel() only hands it
// out after cpu_has_avx2_f16c(). Here too: the group path's 256-bit inner loops, the process-wide switches, and the
// dispatcher that picks AVX-512, AVX2 or portable.
#include "simd.hpp"
#define KVC_KERNEL_TARGET KVC_TARGET_AVX2
#define KVC_KERNEL_REGS 16
#define KVC_GROUP_VALUES_SCRATCH 1
#include "attention_kernel_x86.hpp"
#include "attention_kernel_quant_x86.hpp"

#include <atomic>

namespace kvc::opt {
namespace {

// The walk by default on this machine (docs/performance.md, "How the kernel walks the cache"; the measurements:
// docs/log/attention-kernel-notes.md): kDefaultWalk, except on AMD cores without AVX-512 (Zen 2 and Zen 3 here),
// which walk each head's whole run. Interleaving the heads in visits gains 23 % at 256-token blocks on Zen 4 (MHA, one
// thread); on Zen 3 whole runs take 0.85-0.88 of its time there (their hardware prefetcher streams a head's long
// run), on Zen 2 it makes no difference; at 16-token blocks the two are the same walk. The bits are the same either
// way. "AMD without AVX-512" stands for Zen 1-3: a Zen 4 guest whose hypervisor hides AVX-512 would get whole runs
// too (speed only).
// Intel cores visit each head 4 keys at a time (measured on the model 167 kind, attention_kernel_x86.hpp) and prime
// pages 8 KiB ahead (WalkPlan::prime_kib): there every decode from memory gains 3-10 % (MHA 7-10 % at 16-token blocks,
// 3 % at 256; GQA 8:1 6-7 %; the single sequences 4-9 %), 16 KiB ahead gains less and 4 KiB almost nothing
// (kvcheck_bench's A/B lines). AMD cores with AVX-512 (Zen 4) prime 8 KiB ahead too: in three runs there MHA at
// 16-token blocks takes 0.86-0.97 of the unprimed time, the single sequences 0.85-0.98, MHA at 256-token blocks
// 0.92-1.00, and GQA 8:1 0.99-1.03, within the noise of a run's repeated default (0.97-1.05). Unmeasured on Zen 2 and
// Zen 3: off there.
WalkPlan machine_walk() {
    WalkPlan w = kDefaultWalk;
    if (cpu_is_amd() && !cpu_has_avx512()) w.interleave_heads = false;
    if (cpu_is_intel()) {
        w.visit_keys = 4;
        w.spread_prefetch = true;
    }
    if (cpu_is_intel() || (cpu_is_amd() && cpu_has_avx512())) w.prime_kib = 8;
    return w;
}

std::atomic<WalkPlan> g_walk{machine_walk()}; // one word: a kernel call reads the whole plan at once
static_assert(std::atomic<WalkPlan>::is_always_lock_free, "the plan must fit one lock-free word (no libatomic)");
std::atomic<bool> g_group_path{true};

// The queries one by one (the pairs are the AVX-512 kernel's).
KVC_TARGET_AVX2 bool group_query_pairs() { return false; }

// rows 0-3 in 4 x 3 blocks (with the prefetches), then rows 4 .. R-1 over the same keys, now in L1 (KJ so that
// accumulators and K chunks fit the 16 registers).
template <uint32_t DT, int R>
KVC_TARGET_AVX2 void group_scores(const float (*qs)[kSimdMaxHeadDim], bool /*pairs*/, const uint8_t* kp, uint32_t run,
                                  uint64_t row_bytes, uint32_t d, __m256 scale, RowPrefetcher& pf,
                                  float (*sc)[kSplitKeys], uint32_t j0) {
    static_assert(R >= 4 && R <= kTileRows, "4 to 8 rows");
    const float* q[R];
    row_pointers(qs, q);
    score_run_kj<DT, 4, 3>(q, kp, run, row_bytes, d, scale, &pf, sc, j0);
    if constexpr (R > 4) {
        constexpr int R2 = R - 4, KJ2 = R2 == 4 ? 3 : 8 / R2; // 12, or 8 (6 for 3 rows) as score_run
        score_run_kj<DT, R2, KJ2>(q + 4, kp, run, row_bytes, d, scale, nullptr, sc + 4, j0);
    }
}

// Piece by piece (kPieceKeys V rows), so the keys still go through each element in order: the piece widened to f32
// once into the scratch, then all R rows x 1 chunk of 8 read it, each widened chunk loaded once for every row.
template <uint32_t DT, int R>
KVC_TARGET_AVX2 void group_values(const uint8_t* v, uint64_t row_bytes, uint32_t count, uint32_t d, uint32_t dq,
                                  float* wide, const float (*p)[kSplitKeys], uint32_t col, SoftmaxState* st,
                                  RowPrefetcher* pf, uint32_t v0) {
    const uint32_t full = d / 8;
    for (uint32_t i0 = 0; i0 < count; i0 += kPieceKeys) {
        const uint32_t cnt = std::min(kPieceKeys, count - i0);
        for (uint32_t i = 0; i < cnt; ++i) {
            pf->upto(v0 + i0 + i + 1);
            const uint8_t* row = v + (i0 + i) * row_bytes;
            float* out = wide + size_t(i) * dq;
            for (uint32_t c = 0; c < full; ++c) _mm256_store_ps(out + 8 * c, load8<DT>(row + 8 * c * elem_bytes<DT>()));
            if (d % 8) _mm256_store_ps(out + 8 * full, load_tail<DT>(row + 8 * full * elem_bytes<DT>(), d % 8));
        }
        const float* pr[R];
        for (int r = 0; r < R; ++r) pr[r] = p[r] + col + i0;
        accumulate_rows<KVC_DTYPE_F32, R, 1>(reinterpret_cast<const uint8_t*>(wide), uint64_t(dq) * sizeof(float),
                                             cnt, pr, st, d, nullptr, 0);
    }
}

KVC_TARGET_AVX2 __m256 exp_sum_row(float* row, uint32_t n8, float m) {
    return exp_sum_row8(row, 0, n8, _mm256_set1_ps(m), _mm256_setzero_ps());
}

} // namespace

SplitKernel split_kernel_avx2(uint32_t dtype, bool fp8_fused) {
    switch (dtype) {
    case KVC_DTYPE_FP8_E4M3: return fp8_fused ? split_rows<KVC_DTYPE_FP8_E4M3, 1> : split_kernel_quant(dtype);
    case KVC_DTYPE_FP8_E5M2: return fp8_fused ? split_rows<KVC_DTYPE_FP8_E5M2, 1> : split_kernel_quant(dtype);
    default: break;
    }
    if (const SplitKernel q = split_kernel_quant(dtype)) return q;
    switch (dtype) {
    case KVC_DTYPE_F16: return split_rows<KVC_DTYPE_F16, 1>;
    case KVC_DTYPE_BF16: return split_rows<KVC_DTYPE_BF16, 1>;
    default: return split_rows<KVC_DTYPE_F32, 1>;
    }
}

void set_avx2_walk(const WalkPlan& plan) { g_walk.store(plan, std::memory_order_relaxed); }
WalkPlan avx2_walk() { return g_walk.load(std::memory_order_relaxed); }

void set_avx2_group_path(bool on) { g_group_path.store(on, std::memory_order_relaxed); }
bool avx2_group_path() { return g_group_path.load(std::memory_order_relaxed); }

SplitKernel split_kernel(uint32_t dtype, bool simd, bool fp8_fused) {
    if (!simd || !cpu_has_avx2_f16c()) return split_kernel_scalar(dtype);
    return cpu_has_avx512() ? split_kernel_avx512(dtype, fp8_fused) : split_kernel_avx2(dtype, fp8_fused);
}

} // namespace kvc::opt
