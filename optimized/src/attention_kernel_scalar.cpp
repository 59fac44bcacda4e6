// The portable split kernel: plain loops, for CPUs without AVX2/FMA/F16C. The phases and their order are those of
// the AVX2 kernel; only the order of the additions inside a dot product and a sum differs (both are fixed, so this
// kernel is as deterministic as the other, just not bitwise equal to it).
#include "attention_kernel.hpp"
#include "dtype_convert.hpp"
#include "quantize.hpp"
#include "split_view.hpp"

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
    const kvc_kv_layout& Lv = a.v_layout ? *a.v_layout : L; // V rows may be narrower or wider than K rows
    const uint32_t d = L.head_dim, dv = Lv.head_dim;
    const SplitView sv = split_view(t, t.n, k0); // the keys each row sees inside this split
    float sc[kTileRows][kSplitKeys];
    float row[kMaxHeadDim];
    // every stretch some row sees, key by key in key order
    const auto for_each_key = [&](auto&& body) {
        for (int g = 0; g < sv.n_ranges; ++g)
            for (uint32_t j = sv.first[g]; j < sv.last[g]; ++j) body(j);
    };

    // phase 1: scores s = (q . k) * scale, each K row widened once for all rows of the tile
    for_each_key([&](uint32_t j) {
        const uint8_t* kp = kvc_kv_address(&L, a.table, k0 + j, KVC_PLANE_K, a.kv_head, 0);
        widen_row<DT>(kp, L, a.k_scales ? a.k_scales[a.kv_head] : 1.0f, row);
        for (int r = 0; r < t.n; ++r) {
            if (!sv.sees(r, j)) continue;
            float dot = 0.0f;
            for (uint32_t c = 0; c < d; ++c) dot += t.q[r][c] * row[c];
            sc[r][j] = dot * a.scale;
        }
    });
    // phase 2: the maximum of each row, and phase 3: p = exp(s - m) and its sum, over the keys the row sees
    for (int r = 0; r < t.n; ++r) {
        SoftmaxState& s = st[r];
        s.m = -INFINITY;
        s.l = 0.0f;
        for (uint32_t c = 0; c < padded_dim(dv); ++c) s.o[c] = 0.0f;
        const uint32_t end = sv.row_end(r);
        if (end == 0) continue; // empty split for this row: the empty state
        uint32_t j0 = 0;
        while (!sv.sees(r, j0)) ++j0; // the row's first key here (it sees one: end > 0)
        float m = sc[r][j0];
        for (uint32_t j = j0 + 1; j < end; ++j)
            if (sv.sees(r, j)) m = std::max(m, sc[r][j]);
        float l = 0.0f;
        for (uint32_t j = 0; j < end; ++j) {
            if (!sv.sees(r, j)) continue;
            sc[r][j] = std::exp(sc[r][j] - m);
            l += sc[r][j];
        }
        s.m = m;
        s.l = l;
    }
    // phase 4: o = sum_j p_j v_j, each V row widened once for all rows of the tile
    for_each_key([&](uint32_t j) {
        const uint8_t* vp = kvc_kv_address(&Lv, a.table, k0 + j, KVC_PLANE_V, a.kv_head, 0);
        widen_row<DT>(vp, Lv, a.v_scales ? a.v_scales[a.kv_head] : 1.0f, row);
        for (int r = 0; r < t.n; ++r) {
            if (!sv.sees(r, j)) continue;
            const float p = sc[r][j];
            float* o = st[r].o;
            for (uint32_t c = 0; c < dv; ++c) o[c] += p * row[c];
        }
    });
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
