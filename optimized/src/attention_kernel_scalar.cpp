// The portable split kernel: plain loops, for CPUs without AVX2/FMA/F16C. The phases and their order are those of
// the AVX2 kernel; only the order of the additions inside a dot product and a sum differs (both are fixed, so this
// kernel is as deterministic as the other, just not bitwise equal to it).
#include "attention_kernel.hpp"
#include "dtype_convert.hpp"
#include "quantize.hpp"

#include <algorithm>
#include <cmath>

namespace kvc::opt {
namespace {

constexpr bool is_quant_dtype(uint32_t dt) { return dt >= KVC_DTYPE_FP8_E4M3 && dt <= KVC_DTYPE_Q8_0; }

// One cached row -> f32: widened (f32, f16, bf16), or dequantized, decode(code) * scale in f32 (quantized dtypes;
// fp8_scale: the head's, fp8 only).
template <uint32_t DT>
void widen_row(const uint8_t* p, const kvc_kv_layout& L, float fp8_scale, float* row) {
    if constexpr (is_quant_dtype(DT)) {
        dequantize_row(p, QuantFormat{DT, L.head_dim, L.scale_bytes == 2}, fp8_scale, row);
    } else {
        for (uint32_t c = 0; c < L.head_dim; ++c) row[c] = load_elem(p + c * L.elem_bytes, DT);
    }
}

template <uint32_t DT>
void split_scalar(const SplitArgs& a, const RowTile& t, uint32_t k0, SoftmaxState* st) {
    const kvc_kv_layout& L = *a.layout;
    const uint32_t d = L.head_dim;
    uint32_t n[kTileRows] = {}; // visible keys of each row inside this split
    uint32_t n_max = 0;
    for (int r = 0; r < t.n; ++r) {
        n[r] = t.limit[r] > k0 ? std::min(t.limit[r] - k0, kSplitKeys) : 0;
        n_max = std::max(n_max, n[r]);
    }
    float sc[kTileRows][kSplitKeys];
    float row[kMaxHeadDim];

    // phase 1: scores s = (q . k) * scale, each K row widened once for all rows of the tile
    for (uint32_t j = 0; j < n_max; ++j) {
        const uint8_t* kp = kvc_kv_address(&L, a.table, k0 + j, KVC_PLANE_K, a.kv_head, 0);
        widen_row<DT>(kp, L, a.k_scales ? a.k_scales[a.kv_head] : 1.0f, row);
        for (int r = 0; r < t.n; ++r) {
            if (j >= n[r]) continue;
            float dot = 0.0f;
            for (uint32_t c = 0; c < d; ++c) dot += t.q[r][c] * row[c];
            sc[r][j] = dot * a.scale;
        }
    }
    // phase 2: the maximum of each row, and phase 3: p = exp(s - m) and its sum
    for (int r = 0; r < t.n; ++r) {
        SoftmaxState& s = st[r];
        s.m = -INFINITY;
        s.l = 0.0f;
        for (uint32_t c = 0; c < padded_dim(d); ++c) s.o[c] = 0.0f;
        if (n[r] == 0) continue; // empty split for this row: the empty state
        float m = sc[r][0];
        for (uint32_t j = 1; j < n[r]; ++j) m = std::max(m, sc[r][j]);
        float l = 0.0f;
        for (uint32_t j = 0; j < n[r]; ++j) {
            sc[r][j] = std::exp(sc[r][j] - m);
            l += sc[r][j];
        }
        s.m = m;
        s.l = l;
    }
    // phase 4: o = sum_j p_j v_j, each V row widened once for all rows of the tile
    for (uint32_t j = 0; j < n_max; ++j) {
        const uint8_t* vp = kvc_kv_address(&L, a.table, k0 + j, KVC_PLANE_V, a.kv_head, 0);
        widen_row<DT>(vp, L, a.v_scales ? a.v_scales[a.kv_head] : 1.0f, row);
        for (int r = 0; r < t.n; ++r) {
            if (j >= n[r]) continue;
            const float p = sc[r][j];
            float* o = st[r].o;
            for (uint32_t c = 0; c < d; ++c) o[c] += p * row[c];
        }
    }
}

template <uint32_t DT>
void split_scalar_heads(const SplitArgs& a, uint32_t n_heads, const RowTile* tiles, uint32_t k0, SoftmaxState* st) {
    for (uint32_t h = 0; h < n_heads; ++h) {
        SplitArgs one = a;
        one.kv_head = a.kv_head + h;
        split_scalar<DT>(one, tiles[h], k0, st + h * kTileRows);
    }
}

} // namespace

SplitKernel split_kernel_scalar(uint32_t dtype) {
    switch (dtype) {
    case KVC_DTYPE_F16: return split_scalar_heads<KVC_DTYPE_F16>;
    case KVC_DTYPE_BF16: return split_scalar_heads<KVC_DTYPE_BF16>;
    case KVC_DTYPE_FP8_E4M3: return split_scalar_heads<KVC_DTYPE_FP8_E4M3>;
    case KVC_DTYPE_FP8_E5M2: return split_scalar_heads<KVC_DTYPE_FP8_E5M2>;
    case KVC_DTYPE_INT8_TOKEN: return split_scalar_heads<KVC_DTYPE_INT8_TOKEN>;
    case KVC_DTYPE_Q8_0: return split_scalar_heads<KVC_DTYPE_Q8_0>;
    default: return split_scalar_heads<KVC_DTYPE_F32>;
    }
}

} // namespace kvc::opt
