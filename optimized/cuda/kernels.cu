// The CUDA engine's kernels, in named phases. Every piece of arithmetic that is not launch geometry comes from the
// shared host+device headers (dtype_math.hpp, rope_math.hpp, softmax_state.hpp, kv_layout.h), which the CPU unit
// test checks against the reference; what is here is who computes what, and in which fixed order.
//
// Determinism (docs/cuda-engine.md): a row's output is
//   normalize( fold over segments of 1024 keys ( fold over the segment's splits of 256 keys ( state of the split )))
// with splits and segments cut at absolute key positions, both folds left to right from the empty state, and each
// row's arithmetic done by code paths that do not depend on the other rows of its tile, on the tile's size, or on
// whether a segment was computed by its own CUDA block (spread decode) or in a loop (prefill). The sources are
// compiled with --fmad=false, so no expression is contracted differently in two kernels.
#include "kernels.hpp"

#include "kvcheck/optimized/dtype_math.hpp"
#include "kvcheck/optimized/quant_math.hpp"
#include "kvcheck/optimized/rope_math.hpp"
#include "kvcheck/optimized/softmax_state.hpp"

namespace kvc::cuda {
namespace {

using kvc::opt::MergeScales;
using kvc::opt::merge_apply;
using kvc::opt::merge_max;
using kvc::opt::merge_scales;
using kvc::opt::normalize_elem;
namespace m = kvc::opt::math;

constexpr uint32_t kStageBatch = 4; // loads each thread has in flight while staging K or V rows

// The fp8 scale of a KV head's rows in the call's layer (1 for other dtypes, which do not use it).
__device__ float fp8_scale_of(const Geometry& g, uint32_t plane, uint32_t kv_head) {
    const float* s = plane == KVC_PLANE_K ? g.k_scales : g.v_scales;
    return s ? s[kv_head] : 1.0f;
}

// append of a quantized dtype, in phases: the K row rotated and the V row into shared memory; the scales (int8: one
// per row, q8_0: one per 32 values; absmax is exact in any order); the codes, one thread per element; the scales'
// bytes after the codes. Every value is quant_math.hpp's, step for step what its serial quantize_row (the host test's
// subject) computes, so the stored bytes are the reference's.
__device__ void append_quantized(const Geometry& g, const uint32_t* table, uint64_t pos, uint32_t h, const float* ks,
                                 const float* vs, float (*row_s)[kMaxHeadDim], float (*scale_s)[kMaxHeadDim / m::kQ8Block]) {
    const uint32_t d = g.head_dim, nb = d / m::kQ8Block;
    const bool f16 = g.f16_scale != 0;
    if (g.rope != m::kRopeNone) {
        for (uint32_t j = threadIdx.x; j < d / 2; j += blockDim.x) {
            uint32_t a, b;
            m::rope_pair(g.rope, d, j, &a, &b);
            double cs, sn;
            m::rope_cos_sin(pos, g.inv_freq[j], &cs, &sn);
            float xa = ks[a], xb = ks[b];
            m::rope_rotate(&xa, &xb, cs, sn);
            row_s[0][a] = xa;
            row_s[0][b] = xb;
        }
    } else {
        for (uint32_t x = threadIdx.x; x < d; x += blockDim.x) row_s[0][x] = ks[x];
    }
    for (uint32_t x = threadIdx.x; x < d; x += blockDim.x) row_s[1][x] = vs[x];
    __syncthreads();
    if (g.dtype == m::kDtypeInt8Token) {
        if (threadIdx.x < 2) scale_s[threadIdx.x][0] = m::int8_scale(m::absmax(row_s[threadIdx.x], d), f16);
    } else if (g.dtype == m::kDtypeQ8_0) {
        for (uint32_t x = threadIdx.x; x < 2 * nb; x += blockDim.x)
            scale_s[x / nb][x % nb] = m::q8_0_d(m::absmax(row_s[x / nb] + (x % nb) * m::kQ8Block, m::kQ8Block));
    }
    __syncthreads();
    for (uint32_t x = threadIdx.x; x < 2 * d; x += blockDim.x) {
        const uint32_t p = x / d, i = x % d; // plane, element
        const float value = row_s[p][i];
        uint8_t code;
        if (m::is_fp8(g.dtype)) code = m::fp8_code(value, fp8_scale_of(g, p, h), g.dtype);
        else if (g.dtype == m::kDtypeInt8Token) code = static_cast<uint8_t>(m::int8_code(value, scale_s[p][0]));
        else code = static_cast<uint8_t>(m::q8_0_code(value, m::q8_0_id(scale_s[p][i / m::kQ8Block])));
        *kvc_kv_address(&g.layout, table, pos, p, h, i) = code;
    }
    const uint64_t at = kvc_kv_scale_offset(&g.layout);
    if (g.dtype == m::kDtypeInt8Token && threadIdx.x < 2)
        m::put_int8_scale(kvc_kv_address(&g.layout, table, pos, threadIdx.x, h, 0) + at, scale_s[threadIdx.x][0], f16);
    if (g.dtype == m::kDtypeQ8_0)
        for (uint32_t x = threadIdx.x; x < 2 * nb; x += blockDim.x)
            m::put_f16(kvc_kv_address(&g.layout, table, pos, x / nb, h, 0) + at + 2 * (x % nb), scale_s[x / nb][x % nb]);
}

// ---- append: scatter + RoPE + dtype conversion (or quantization), one CUDA block per (new token, KV head) ----
__global__ void append_kernel(Geometry g, const CallDesc* calls, const uint32_t* token_call, const uint32_t* tables,
                              const float* k, const float* v) {
    __shared__ float row_s[2][kMaxHeadDim];                   // quantized: the K (rotated) and V rows
    __shared__ float scale_s[2][kMaxHeadDim / m::kQ8Block]; // quantized: their scales
    const uint32_t i = blockIdx.x, h = blockIdx.y, d = g.head_dim;
    const CallDesc c = calls[token_call[i]];
    const uint64_t pos = static_cast<uint64_t>(c.len_before) + (i - c.token_base);
    const uint32_t* table = tables + c.table_offset;
    const float* ks = k + (static_cast<uint64_t>(i) * g.n_kv_heads + h) * d;
    const float* vs = v + (static_cast<uint64_t>(i) * g.n_kv_heads + h) * d;
    if (m::is_quantized(g.dtype)) {
        append_quantized(g, table, pos, h, ks, vs, row_s, scale_s);
        return;
    }
    if (g.rope != m::kRopeNone) {
        for (uint32_t j = threadIdx.x; j < d / 2; j += blockDim.x) {
            uint32_t a, b;
            m::rope_pair(g.rope, d, j, &a, &b);
            double cs, sn;
            m::rope_cos_sin(pos, g.inv_freq[j], &cs, &sn);
            float xa = ks[a], xb = ks[b];
            m::rope_rotate(&xa, &xb, cs, sn);
            m::store_elem(xa, g.dtype, kvc_kv_address(&g.layout, table, pos, KVC_PLANE_K, h, a));
            m::store_elem(xb, g.dtype, kvc_kv_address(&g.layout, table, pos, KVC_PLANE_K, h, b));
        }
    } else {
        for (uint32_t x = threadIdx.x; x < d; x += blockDim.x)
            m::store_elem(ks[x], g.dtype, kvc_kv_address(&g.layout, table, pos, KVC_PLANE_K, h, x));
    }
    for (uint32_t x = threadIdx.x; x < d; x += blockDim.x)
        m::store_elem(vs[x], g.dtype, kvc_kv_address(&g.layout, table, pos, KVC_PLANE_V, h, x));
}

// ---- attention ----

// The online-softmax states a block keeps in shared memory: l and m per row, o per (row, dim).
struct RowStates {
    float* m; // [kTileRows]
    float* l; // [kTileRows]
    float* o; // [kTileRows][head_dim]
};

__device__ void clear_states(RowStates s, uint32_t n_rows, uint32_t d) {
    for (uint32_t x = threadIdx.x; x < n_rows * d; x += blockDim.x) s.o[x] = 0.0f;
    if (threadIdx.x < n_rows) {
        s.m[threadIdx.x] = -INFINITY;
        s.l[threadIdx.x] = 0.0f;
    }
}

// phase merge: into := into ∪ from, row by row (state_merge, with o spread over the threads).
__device__ void merge_states(RowStates into, RowStates from, uint32_t n_rows, uint32_t d, MergeScales* scales) {
    __syncthreads();
    if (threadIdx.x < n_rows) scales[threadIdx.x] = merge_scales(into.m[threadIdx.x], from.m[threadIdx.x]);
    __syncthreads();
    for (uint32_t x = threadIdx.x; x < n_rows * d; x += blockDim.x)
        into.o[x] = merge_apply(scales[x / d], into.o[x], from.o[x]);
    if (threadIdx.x < n_rows) {
        const uint32_t r = threadIdx.x;
        into.l[r] = merge_apply(scales[r], into.l[r], from.l[r]);
        into.m[r] = merge_max(scales[r], into.m[r], from.m[r]);
    }
    __syncthreads();
}

// Widens one 16-byte piece of a cached row (4 f32 or 8 16-bit elements, in address order) to f32
// (dtype_math.hpp's widen_words, which the host test checks against load_elem).
__device__ void widen_piece(uint4 piece, uint32_t dtype, float* out) {
    const uint32_t w[4] = {piece.x, piece.y, piece.z, piece.w};
    m::widen_words(w, dtype, out);
}

// Units 0 .. total - 1 of a staging, kStageBatch per thread at a time: every load of a batch is issued before any
// of them is stored (load(x) returns unit x, store(x, value) puts it in place).
template <typename Load, typename Store>
__device__ void in_batches(uint32_t total, Load load, Store store) {
    for (uint32_t first = 0; first < total; first += kStageBatch * blockDim.x) {
        decltype(load(0u)) unit[kStageBatch];
#pragma unroll
        for (uint32_t b = 0; b < kStageBatch; ++b) {
            const uint32_t x = first + b * blockDim.x + threadIdx.x;
            unit[b] = {};
            if (x < total) unit[b] = load(x);
        }
#pragma unroll
        for (uint32_t b = 0; b < kStageBatch; ++b) {
            const uint32_t x = first + b * blockDim.x + threadIdx.x;
            if (x < total) store(x, unit[b]);
        }
    }
}

// phase load (K or V rows): keys key0 .. key0 + n - 1 of one KV head, widened (or dequantized: each code times its
// scale, rounded once in f32, quant_math.hpp; never a dequantized copy in global memory) to f32, into rows of
// stride d + 1 (the
// stride keeps the score phase, where the 32 lanes of a warp read 32 different keys, free of bank conflicts).
// Every thread issues all its loads of a batch before it converts and stores any of them (in_batches). Loading one
// row at a time per warp waited for memory once per row and held decode to 0.05 of the device's copy bandwidth
// (docs/gpu.md). Rows that start on 16 bytes are read in 16-byte pieces, others element by element (consecutive
// lanes, consecutive elements). Either way the same values land in the same places: only the loads differ.
__device__ void stage_rows(const Geometry& g, const uint32_t* table, uint32_t plane, uint32_t kv_head, uint64_t key0,
                           uint32_t n, float* dst) {
    const uint32_t d = g.head_dim, stride = d + 1;
    const auto at = [&](uint32_t j, uint32_t dim) { // element dim of key key0 + j
        return kvc_kv_address(&g.layout, table, key0 + j, plane, kv_head, dim);
    };
    if (g.wide_rows) {
        const uint32_t per_piece = 16 / g.layout.elem_bytes, pieces = d / per_piece;
        const bool fp8 = m::is_fp8(g.dtype);
        const float fp8_scale = fp8 ? fp8_scale_of(g, plane, kv_head) : 1.0f;
        in_batches(
            n * pieces,
            [&](uint32_t x) { return __ldg(reinterpret_cast<const uint4*>(at(x / pieces, (x % pieces) * per_piece))); },
            [&](uint32_t x, uint4 piece) {
                float* out = dst + (x / pieces) * stride + (x % pieces) * per_piece;
                if (fp8) { // 16 codes
                    const uint32_t w[4] = {piece.x, piece.y, piece.z, piece.w};
                    m::widen_fp8_words(w, g.dtype, fp8_scale, out);
                } else {
                    widen_piece(piece, g.dtype, out);
                }
            });
    } else if (m::is_quantized(g.dtype)) { // codes; int8 / q8_0 scales read from the row's end
        const float fp8_scale = fp8_scale_of(g, plane, kv_head);
        const bool f16 = g.f16_scale != 0;
        in_batches(
            n * d,
            [&](uint32_t x) { return m::dequantize_elem(at(x / d, 0), g.dtype, d, f16, fp8_scale, x % d); },
            [&](uint32_t x, float value) { dst[(x / d) * stride + x % d] = value; });
    } else {
        in_batches(
            n * d, [&](uint32_t x) { return m::load_elem(at(x / d, x % d), g.dtype); },
            [&](uint32_t x, float value) { dst[(x / d) * stride + x % d] = value; });
    }
}

__device__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// A fixed butterfly: every lane ends with the same sum, made in the same order whatever the row or the tile.
__device__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x = x + __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// The exact state of every row of the tile over the split [k0, k0 + nk) (nk <= kSplitKeys), into `split`.
__device__ void split_state(const Geometry& g, const uint32_t* table, uint32_t kv_head, const float* q_s,
                            const uint32_t* limit, uint32_t n_rows, uint32_t k0, uint32_t nk, float* kv_s, float* p_s,
                            RowStates split) {
    const uint32_t d = g.head_dim, warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    // phase scores: s = (q . k) * scale; one staged K row serves every row of the tile (the GQA group)
    for (uint32_t c0 = 0; c0 < nk; c0 += kChunkKeys) {
        const uint32_t nc = min(kChunkKeys, nk - c0);
        __syncthreads();
        stage_rows(g, table, KVC_PLANE_K, kv_head, static_cast<uint64_t>(k0) + c0, nc, kv_s);
        __syncthreads();
        for (uint32_t x = threadIdx.x; x < n_rows * kChunkKeys; x += blockDim.x) {
            const uint32_t r = x / kChunkKeys, j = x % kChunkKeys;
            if (j >= nc || k0 + c0 + j >= limit[r]) continue; // past the row's causal limit: never computed
            const float* qr = q_s + r * d;
            const float* kr = kv_s + j * (d + 1);
            float dot = 0.0f;
            for (uint32_t c = 0; c < d; ++c) dot = dot + qr[c] * kr[c];
            p_s[r * kSplitKeys + c0 + j] = dot * g.scale;
        }
    }
    __syncthreads();
    // phase online softmax: the row's max, p = exp(s - max) and their sum; one warp per row
    for (uint32_t r = warp; r < n_rows; r += warps) {
        const uint32_t n = limit[r] > k0 ? min(limit[r] - k0, nk) : 0;
        if (n == 0) { // the split lies past the row's causal limit: the empty state
            if (lane == 0) {
                split.m[r] = -INFINITY;
                split.l[r] = 0.0f;
            }
            continue;
        }
        float* pr = p_s + r * kSplitKeys;
        float mx = -INFINITY;
        for (uint32_t j = lane; j < n; j += 32) mx = fmaxf(mx, pr[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (uint32_t j = lane; j < n; j += 32) {
            const float p = expf(pr[j] - mx);
            pr[j] = p;
            sum = sum + p;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            split.m[r] = mx;
            split.l[r] = sum;
        }
    }
    // phase accumulate: o = sum_j p_j v_j in key order; keys past a row's limit are skipped, never multiplied by 0
    for (uint32_t x = threadIdx.x; x < n_rows * d; x += blockDim.x) split.o[x] = 0.0f;
    for (uint32_t c0 = 0; c0 < nk; c0 += kChunkKeys) {
        const uint32_t nc = min(kChunkKeys, nk - c0);
        __syncthreads();
        stage_rows(g, table, KVC_PLANE_V, kv_head, static_cast<uint64_t>(k0) + c0, nc, kv_s);
        __syncthreads();
        for (uint32_t x = threadIdx.x; x < n_rows * d; x += blockDim.x) {
            const uint32_t r = x / d, c = x % d;
            const uint32_t lim = limit[r] > k0 + c0 ? min(limit[r] - (k0 + c0), nc) : 0;
            const float* pr = p_s + r * kSplitKeys + c0;
            float acc = split.o[x];
            for (uint32_t j = 0; j < lim; ++j) acc = acc + pr[j] * kv_s[j * (d + 1) + c];
            split.o[x] = acc;
        }
    }
    __syncthreads();
}

// One work item: a tile of rows of one (stream, KV head) over segments [seg_begin, seg_end).
__global__ void __launch_bounds__(kThreads) attend_kernel(Geometry g, const CallDesc* calls, const uint32_t* tables,
                                                          const float* q, float* out, const WorkItem* items,
                                                          uint32_t rows_cap, float* pm, float* pl, float* po) {
    extern __shared__ float smem[];
    __shared__ uint32_t limit[kTileRows];
    __shared__ float st[6][kTileRows];
    __shared__ MergeScales scales[kTileRows];
    const WorkItem w = items[blockIdx.x];
    const CallDesc c = calls[w.call];
    const uint32_t d = g.head_dim, R = w.n_rows, G = g.group;
    const uint32_t* table = tables + c.table_offset;
    // the dynamic shared memory, sized for rows_cap (>= R) rows (attention_shared_bytes)
    float* q_s = smem;                                  // [rows_cap][d]
    float* kv_s = q_s + rows_cap * d;                   // [kChunkKeys][d + 1]
    float* p_s = kv_s + kChunkKeys * (d + 1);           // [rows_cap][kSplitKeys]
    const RowStates split{st[0], st[1], p_s + rows_cap * kSplitKeys};
    const RowStates seg{st[2], st[3], split.o + rows_cap * d};
    const RowStates tot{st[4], st[5], seg.o + rows_cap * d};

    // phase load: the tile's queries, rotated by their positions
    for (uint32_t x = threadIdx.x; x < R * d; x += blockDim.x) {
        const uint32_t r = x / d, row = w.row0 + r, t = row / G, h = w.kv_head * G + row % G;
        q_s[x] = q[((static_cast<uint64_t>(c.token_base) + t) * g.n_q_heads + h) * d + x % d];
    }
    if (threadIdx.x < R) limit[threadIdx.x] = c.len_before + (w.row0 + threadIdx.x) / G + 1; // its own key included
    __syncthreads();
    if (g.rope != m::kRopeNone)
        for (uint32_t x = threadIdx.x; x < R * (d / 2); x += blockDim.x) {
            const uint32_t r = x / (d / 2), j = x % (d / 2);
            uint32_t a, b;
            m::rope_pair(g.rope, d, j, &a, &b);
            double cs, sn;
            m::rope_cos_sin(static_cast<uint64_t>(limit[r]) - 1, g.inv_freq[j], &cs, &sn);
            m::rope_rotate(q_s + r * d + a, q_s + r * d + b, cs, sn);
        }
    clear_states(tot, R, d);
    const uint32_t max_limit = c.len_before + (w.row0 + R - 1) / G + 1; // rows are token-major: the last sees most

    for (uint32_t sg = w.seg_begin; sg < w.seg_end; ++sg) {
        __syncthreads();
        clear_states(seg, R, d);
        for (uint32_t sp = 0; sp < kSegmentSplits; ++sp) {
            const uint32_t k0 = (sg * kSegmentSplits + sp) * kSplitKeys;
            if (k0 >= max_limit) break; // every row's state of this split is empty: merging it is an exact no-op
            split_state(g, table, w.kv_head, q_s, limit, R, k0, min(kSplitKeys, max_limit - k0), kv_s, p_s, split);
            merge_states(seg, split, R, d, scales);
        }
        merge_states(tot, seg, R, d, scales);
    }

    // phase store
    for (uint32_t x = threadIdx.x; x < R * d; x += blockDim.x) {
        const uint32_t r = x / d, row = w.row0 + r, t = row / G, h = w.kv_head * G + row % G;
        if (w.final)
            out[((static_cast<uint64_t>(c.token_base) + t) * g.n_q_heads + h) * d + x % d] =
                normalize_elem(tot.m[r], tot.l[r], tot.o[x]);
        else
            po[(static_cast<uint64_t>(w.partial) + r) * d + x % d] = tot.o[x];
    }
    if (!w.final && threadIdx.x < R) {
        pm[w.partial + threadIdx.x] = tot.m[threadIdx.x];
        pl[w.partial + threadIdx.x] = tot.l[threadIdx.x];
    }
}

// phase merge (spread tiles): fold the segment states of each row in segment order, normalize, store. Every thread
// folds m and l itself (the same operations in the same order as the in-kernel fold) next to its own o elements.
__global__ void merge_kernel(Geometry g, const CallDesc* calls, float* out, const MergeItem* merges, const float* pm,
                             const float* pl, const float* po) {
    const MergeItem mi = merges[blockIdx.x];
    const CallDesc c = calls[mi.call];
    const uint32_t d = g.head_dim, R = mi.n_rows, G = g.group;
    for (uint32_t x = threadIdx.x; x < R * d; x += blockDim.x) {
        const uint32_t r = x / d, row = mi.row0 + r, t = row / G, h = mi.kv_head * G + row % G;
        float mm = -INFINITY, l = 0.0f, o = 0.0f;
        for (uint32_t i = 0; i < mi.n_segments; ++i) {
            const uint64_t p = static_cast<uint64_t>(mi.first_partial) + static_cast<uint64_t>(i) * R + r;
            const MergeScales s = merge_scales(mm, pm[p]);
            o = merge_apply(s, o, po[p * d + x % d]);
            l = merge_apply(s, l, pl[p]);
            mm = merge_max(s, mm, pm[p]);
        }
        out[((static_cast<uint64_t>(c.token_base) + t) * g.n_q_heads + h) * d + x % d] = normalize_elem(mm, l, o);
    }
}

// ---- read_kv, read_kv_scales: bytes [from, from + bytes) of rows as stored, one CUDA block per (row, KV head) ----
__global__ void gather_kernel(Geometry g, const uint32_t* table, uint32_t pos, uint32_t from, uint32_t bytes,
                              uint8_t* k_out, uint8_t* v_out) {
    const uint32_t i = blockIdx.x, h = blockIdx.y;
    const uint64_t dst = (static_cast<uint64_t>(i) * g.n_kv_heads + h) * bytes;
    const uint8_t* ks = kvc_kv_address(&g.layout, table, static_cast<uint64_t>(pos) + i, KVC_PLANE_K, h, 0) + from;
    const uint8_t* vs = kvc_kv_address(&g.layout, table, static_cast<uint64_t>(pos) + i, KVC_PLANE_V, h, 0) + from;
    for (uint32_t x = threadIdx.x; x < bytes; x += blockDim.x) {
        k_out[dst + x] = ks[x];
        v_out[dst + x] = vs[x];
    }
}

uint32_t threads_for(uint32_t d) { return d >= 128 ? 128u : d >= 64 ? 64u : 32u; }

} // namespace

uint64_t attention_shared_bytes(uint32_t head_dim, uint32_t rows_cap) {
    const uint64_t d = head_dim, r = rows_cap;
    return sizeof(float) * (r * d + kChunkKeys * (d + 1) + r * kSplitKeys + 3 * r * d);
}

cudaError_t prepare_attention(uint32_t head_dim) {
    return cudaFuncSetAttribute(attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(attention_shared_bytes(head_dim, kTileRows)));
}

cudaError_t launch_append(const Geometry& g, const CallDesc* calls, const uint32_t* token_call, uint32_t total,
                          const uint32_t* tables, const float* k, const float* v, cudaStream_t s) {
    if (total == 0) return cudaSuccess;
    append_kernel<<<dim3(total, g.n_kv_heads), threads_for(g.head_dim), 0, s>>>(g, calls, token_call, tables, k, v);
    return cudaGetLastError();
}

cudaError_t launch_attention(const Geometry& g, const CallDesc* calls, const uint32_t* tables, const float* q,
                             float* out, const WorkItem* items, uint32_t n_items, uint32_t rows_cap,
                             const MergeItem* merges, uint32_t n_merge, float* partial_m, float* partial_l,
                             float* partial_o, cudaStream_t s) {
    if (n_items > 0) {
        if (rows_cap == 0 || rows_cap > kTileRows) return cudaErrorInvalidValue;
        attend_kernel<<<n_items, kThreads, attention_shared_bytes(g.head_dim, rows_cap), s>>>(
            g, calls, tables, q, out, items, rows_cap, partial_m, partial_l, partial_o);
        if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    if (n_merge > 0) {
        merge_kernel<<<n_merge, kThreads, 0, s>>>(g, calls, out, merges, partial_m, partial_l, partial_o);
        if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t launch_gather(const Geometry& g, const uint32_t* table, uint32_t pos, uint32_t n, uint32_t from,
                          uint32_t bytes, uint8_t* k_out, uint8_t* v_out, cudaStream_t s) {
    if (n == 0 || bytes == 0) return cudaSuccess;
    gather_kernel<<<dim3(n, g.n_kv_heads), threads_for(g.head_dim), 0, s>>>(g, table, pos, from, bytes, k_out, v_out);
    return cudaGetLastError();
}

} // namespace kvc::cuda

namespace kvc::cuda {
cudaError_t kernels_loadable() {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, attend_kernel);
}
} // namespace kvc::cuda
