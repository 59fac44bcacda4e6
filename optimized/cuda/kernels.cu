// The CUDA engine's kernels, in named phases. Every piece of arithmetic that is not launch geometry comes from the
// shared host+device headers (dtype_math.hpp, rope_math.hpp, softmax_state.hpp, kv_layout.h), which the CPU unit
// test checks against the reference; what is here is who computes what, and in which fixed order.
//
// Determinism (docs/cuda-engine.md): a row's output is
//   normalize( fold over segments of 1024 keys ( fold over the segment's splits of 256 keys ( state of the split )))
// with splits and segments cut at absolute key positions, both folds left to right from the empty state, and each
// row's arithmetic done by code paths that do not depend on the other rows of its tile, on the tile's size, or on
// whether a segment was computed by its own CUDA block (spread decode) or in a loop (prefill). The sources are
// compiled with --fmad=false, so no expression is contracted differently in two kernels. With a window a row folds
// only the keys it sees (window_rule.hpp); a split or chunk that no row of the tile sees is skipped, which changes
// no row's arithmetic: that row's state of it would be empty, and an empty state merges as an exact no-op.
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

__device__ const kvc_kv_layout* layout_of(const Geometry& g, uint32_t plane) {
    return plane == KVC_PLANE_K ? &g.layout : &g.layout_v;
}

// A head of q or K rotated by its absolute position pos: the pairs of its RoPE range [rope_begin, rope_begin +
// rope_dims) turned as a head of rope_dims dims, every other dim as given; put(dim, value) receives each element once.
template <typename Put>
__device__ void rotate_head(const Geometry& g, uint64_t pos, const float* x, Put put) {
    const uint32_t d = g.head_dim;
    if (g.rope == m::kRopeNone) {
        for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) put(i, x[i]);
        return;
    }
    const uint32_t b0 = g.rope_begin, rd = g.rope_dims;
    for (uint32_t j = threadIdx.x; j < rd / 2; j += blockDim.x) {
        uint32_t a, b;
        m::rope_pair(g.rope, rd, j, &a, &b);
        a += b0;
        b += b0;
        double cs, sn;
        m::rope_cos_sin(pos, g.inv_freq[j], &cs, &sn);
        float xa = x[a], xb = x[b];
        m::rope_rotate(&xa, &xb, cs, sn);
        put(a, xa);
        put(b, xb);
    }
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
        if (i < b0 || i >= b0 + rd) put(i, x[i]);
}

// append of a quantized dtype, in phases: the K row rotated and the V row into shared memory; the scales (int8: one
// per row, q8_0: one per 32 values; absmax is exact in any order); the codes, one thread per element; the scales'
// bytes after the codes. Every value is quant_math.hpp's, step for step what its serial quantize_row (the host test's
// subject) computes, so the stored bytes are the reference's. K rows have head_dim elements, V rows head_dim_v.
__device__ void append_quantized(const Geometry& g, const uint32_t* table, uint64_t pos, uint32_t h, const float* ks,
                                 const float* vs, float (*row_s)[kMaxHeadDim], float (*scale_s)[kMaxHeadDim / m::kQ8Block]) {
    const uint32_t dim[2] = {g.head_dim, g.head_dim_v};
    const uint32_t nb[2] = {dim[0] / m::kQ8Block, dim[1] / m::kQ8Block};
    const bool f16 = g.f16_scale != 0;
    rotate_head(g, pos, ks, [&](uint32_t i, float value) { row_s[0][i] = value; });
    for (uint32_t x = threadIdx.x; x < dim[1]; x += blockDim.x) row_s[1][x] = vs[x];
    __syncthreads();
    if (g.dtype == m::kDtypeInt8Token) {
        if (threadIdx.x < 2)
            scale_s[threadIdx.x][0] = m::int8_scale(m::absmax(row_s[threadIdx.x], dim[threadIdx.x]), f16);
    } else if (g.dtype == m::kDtypeQ8_0) {
        for (uint32_t x = threadIdx.x; x < nb[0] + nb[1]; x += blockDim.x) {
            const uint32_t p = x < nb[0] ? 0 : 1, blk = x - p * nb[0];
            scale_s[p][blk] = m::q8_0_d(m::absmax(row_s[p] + blk * m::kQ8Block, m::kQ8Block));
        }
    }
    __syncthreads();
    for (uint32_t x = threadIdx.x; x < dim[0] + dim[1]; x += blockDim.x) {
        const uint32_t p = x < dim[0] ? 0 : 1, i = x - p * dim[0]; // plane, element
        const float value = row_s[p][i];
        uint8_t code;
        if (m::is_fp8(g.dtype)) code = m::fp8_code(value, fp8_scale_of(g, p, h), g.dtype);
        else if (g.dtype == m::kDtypeInt8Token) code = static_cast<uint8_t>(m::int8_code(value, scale_s[p][0]));
        else code = static_cast<uint8_t>(m::q8_0_code(value, m::q8_0_id(scale_s[p][i / m::kQ8Block])));
        *kvc_kv_address(layout_of(g, p), table, pos, p, h, i) = code;
    }
    if (g.dtype == m::kDtypeInt8Token && threadIdx.x < 2) {
        const kvc_kv_layout* l = layout_of(g, threadIdx.x);
        m::put_int8_scale(kvc_kv_address(l, table, pos, threadIdx.x, h, 0) + kvc_kv_scale_offset(l),
                          scale_s[threadIdx.x][0], f16);
    }
    if (g.dtype == m::kDtypeQ8_0)
        for (uint32_t x = threadIdx.x; x < nb[0] + nb[1]; x += blockDim.x) {
            const uint32_t p = x < nb[0] ? 0 : 1, blk = x - p * nb[0];
            const kvc_kv_layout* l = layout_of(g, p);
            m::put_f16(kvc_kv_address(l, table, pos, p, h, 0) + kvc_kv_scale_offset(l) + 2 * blk, scale_s[p][blk]);
        }
}

// ---- append: scatter + RoPE + dtype conversion (or quantization), one CUDA block per (new token, KV head) ----
__global__ void append_kernel(Geometry g, const CallDesc* calls, const uint32_t* token_call, const uint32_t* tables,
                              const float* k, const float* v) {
    __shared__ float row_s[2][kMaxHeadDim];                   // quantized: the K (rotated) and V rows
    __shared__ float scale_s[2][kMaxHeadDim / m::kQ8Block]; // quantized: their scales
    const uint32_t i = blockIdx.x, h = blockIdx.y, dk = g.head_dim, dv = g.head_dim_v;
    const CallDesc c = calls[token_call[i]];
    const uint64_t pos = static_cast<uint64_t>(c.len_before) + (i - c.token_base); // absolute: RoPE's position
    const uint32_t* table = tables + c.table_offset;
    const float* ks = k + (static_cast<uint64_t>(i) * g.n_kv_heads + h) * dk;
    const float* vs = v + (static_cast<uint64_t>(i) * g.n_kv_heads + h) * dv;
    if (m::is_quantized(g.dtype)) {
        append_quantized(g, table, pos, h, ks, vs, row_s, scale_s);
        return;
    }
    rotate_head(g, pos, ks, [&](uint32_t x, float value) {
        m::store_elem(value, g.dtype, kvc_kv_address(&g.layout, table, pos, KVC_PLANE_K, h, x));
    });
    for (uint32_t x = threadIdx.x; x < dv; x += blockDim.x)
        m::store_elem(vs[x], g.dtype, kvc_kv_address(&g.layout_v, table, pos, KVC_PLANE_V, h, x));
}

// ---- attention ----

// The online-softmax states a block keeps in shared memory: l and m per row, o per (row, dim).
struct RowStates {
    float* m; // [kTileRows]
    float* l; // [kTileRows]
    float* o; // [kTileRows][head_dim_v]
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
// stride d + 1 (d: the plane's head size; the stride keeps the score phase, where the 32 lanes of a warp read 32
// different keys, free of bank conflicts). Keys in [skip_begin, skip_end) are no row's (past the sinks, before the
// tile's windows): they are not read (with eviction their blocks are gone) and their staged rows are never used.
// Every thread issues all its loads of a batch before it converts and stores any of them (in_batches). Loading one
// row at a time per warp waited for memory once per row and held decode to 0.05 of the device's copy bandwidth
// (docs/gpu.md). Rows that start on 16 bytes are read in 16-byte pieces, others element by element (consecutive
// lanes, consecutive elements). Either way the same values land in the same places: only the loads differ.
__device__ void stage_rows(const Geometry& g, const uint32_t* table, uint32_t plane, uint32_t kv_head, uint64_t key0,
                           uint32_t n, uint64_t skip_begin, uint64_t skip_end, float* dst) {
    const kvc_kv_layout* l = layout_of(g, plane);
    const uint32_t d = l->head_dim, stride = d + 1;
    const auto at = [&](uint32_t j, uint32_t dim) { // element dim of key key0 + j
        return kvc_kv_address(l, table, key0 + j, plane, kv_head, dim);
    };
    const auto skipped = [&](uint32_t j) { return key0 + j >= skip_begin && key0 + j < skip_end; };
    if (g.wide_rows) {
        const uint32_t per_piece = 16 / l->elem_bytes, pieces = d / per_piece;
        const bool fp8 = m::is_fp8(g.dtype);
        const float fp8_scale = fp8 ? fp8_scale_of(g, plane, kv_head) : 1.0f;
        in_batches(
            n * pieces,
            [&](uint32_t x) {
                if (skipped(x / pieces)) return uint4{};
                return __ldg(reinterpret_cast<const uint4*>(at(x / pieces, (x % pieces) * per_piece)));
            },
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
            [&](uint32_t x) {
                return skipped(x / d) ? 0.0f : m::dequantize_elem(at(x / d, 0), g.dtype, d, f16, fp8_scale, x % d);
            },
            [&](uint32_t x, float value) { dst[(x / d) * stride + x % d] = value; });
    } else {
        in_batches(
            n * d, [&](uint32_t x) { return skipped(x / d) ? 0.0f : m::load_elem(at(x / d, x % d), g.dtype); },
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

// What a tile's rows see (window_rule.hpp), in shared memory: row r is the query at position limit[r] - 1 and sees
// the keys below limit[r] that are sinks (below sinks_end) or at or past lo[r], the start of its own window (0
// without one). The tile's rows are consecutive tokens: no row sees [skip_begin, skip_end).
struct TileView {
    const uint32_t* limit; // [kTileRows]
    const uint32_t* lo;    // [kTileRows]
    uint32_t sinks_end;    // S with a window, else 0 (every key below lo[r] = 0 is seen anyway)
    uint32_t window, n_sinks;
    uint64_t first, last;  // the positions of the tile's first and last queries
    uint64_t skip_begin, skip_end;

    __device__ bool seen(uint32_t r, uint64_t key) const {
        return kvc::opt::key_visible(limit[r] - 1u, key, window, n_sinks);
    }
    __device__ bool tile_sees(uint64_t a, uint64_t b) const {
        return kvc::cuda::tile_sees(a, b, first, last, window, n_sinks);
    }
};

// The exact state of every row of the tile over the split [k0, k0 + nk) (nk <= kSplitKeys), into `split`. Only the
// keys a row sees enter its state; chunks no row sees are neither loaded nor scored.
__device__ void split_state(const Geometry& g, const uint32_t* table, uint32_t kv_head, const float* q_s,
                            const TileView& tv, uint32_t n_rows, uint32_t k0, uint32_t nk, float* kv_s, float* p_s,
                            RowStates split) {
    const uint32_t dk = g.head_dim, dv = g.head_dim_v, warp = threadIdx.x / 32, lane = threadIdx.x % 32,
                   warps = blockDim.x / 32;
    // phase scores: s = (q . k) * scale; one staged K row serves every row of the tile (the GQA group)
    for (uint32_t c0 = 0; c0 < nk; c0 += kChunkKeys) {
        const uint32_t nc = min(kChunkKeys, nk - c0);
        if (!tv.tile_sees(k0 + c0, k0 + c0 + nc)) continue; // the same for every thread: no barrier is skipped by some
        __syncthreads();
        stage_rows(g, table, KVC_PLANE_K, kv_head, static_cast<uint64_t>(k0) + c0, nc, tv.skip_begin, tv.skip_end,
                   kv_s);
        __syncthreads();
        for (uint32_t x = threadIdx.x; x < n_rows * kChunkKeys; x += blockDim.x) {
            const uint32_t r = x / kChunkKeys, j = x % kChunkKeys;
            if (j >= nc || !tv.seen(r, k0 + c0 + j)) continue; // a key the row does not see: never computed
            const float* qr = q_s + r * dk;
            const float* kr = kv_s + j * (dk + 1);
            float dot = 0.0f;
            for (uint32_t c = 0; c < dk; ++c) dot = dot + qr[c] * kr[c];
            p_s[r * kSplitKeys + c0 + j] = dot * g.scale;
        }
    }
    __syncthreads();
    // phase online softmax: the row's max over the keys it sees, p = exp(s - max) (0 for the others) and their sum;
    // one warp per row
    for (uint32_t r = warp; r < n_rows; r += warps) {
        const uint32_t n = tv.limit[r] > k0 ? min(tv.limit[r] - k0, nk) : 0;
        const uint64_t i = tv.limit[r] - 1u;
        if (n == 0 || !kvc::opt::range_seen(k0, k0 + n, i, i, tv.window, tv.n_sinks)) { // the empty state
            if (lane == 0) {
                split.m[r] = -INFINITY;
                split.l[r] = 0.0f;
            }
            continue;
        }
        float* pr = p_s + r * kSplitKeys;
        float mx = -INFINITY;
        for (uint32_t j = lane; j < n; j += 32)
            if (tv.seen(r, k0 + j)) mx = fmaxf(mx, pr[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (uint32_t j = lane; j < n; j += 32) {
            if (!tv.seen(r, k0 + j)) {
                pr[j] = 0.0f;
                continue;
            }
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
    // phase accumulate: o = sum_j p_j v_j in key order over the keys the row sees, the sinks then its window; other
    // keys are skipped, never multiplied by 0
    for (uint32_t x = threadIdx.x; x < n_rows * dv; x += blockDim.x) split.o[x] = 0.0f;
    for (uint32_t c0 = 0; c0 < nk; c0 += kChunkKeys) {
        const uint32_t nc = min(kChunkKeys, nk - c0);
        if (!tv.tile_sees(k0 + c0, k0 + c0 + nc)) continue;
        __syncthreads();
        stage_rows(g, table, KVC_PLANE_V, kv_head, static_cast<uint64_t>(k0) + c0, nc, tv.skip_begin, tv.skip_end,
                   kv_s);
        __syncthreads();
        const uint32_t base = k0 + c0;
        for (uint32_t x = threadIdx.x; x < n_rows * dv; x += blockDim.x) {
            const uint32_t r = x / dv, c = x % dv;
            const uint32_t lim = tv.limit[r] > base ? min(tv.limit[r] - base, nc) : 0;
            const uint32_t sinks = tv.sinks_end > base ? min(tv.sinks_end - base, lim) : 0; // [0, sinks): sinks
            const uint32_t from = max(sinks, tv.lo[r] > base ? min(tv.lo[r] - base, lim) : 0u); // [from, lim): window
            const float* pr = p_s + r * kSplitKeys + c0;
            float acc = split.o[x];
            for (uint32_t j = 0; j < sinks; ++j) acc = acc + pr[j] * kv_s[j * (dv + 1) + c];
            for (uint32_t j = from; j < lim; ++j) acc = acc + pr[j] * kv_s[j * (dv + 1) + c];
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
    __shared__ uint32_t lo[kTileRows];
    __shared__ float st[6][kTileRows];
    __shared__ MergeScales scales[kTileRows];
    const WorkItem w = items[blockIdx.x];
    const CallDesc c = calls[w.call];
    const uint32_t dk = g.head_dim, dv = g.head_dim_v, R = w.n_rows, G = g.group;
    const uint32_t* table = tables + c.table_offset;
    // the dynamic shared memory, sized for rows_cap (>= R) rows (attention_shared_bytes)
    float* q_s = smem;                                              // [rows_cap][dk]
    float* kv_s = q_s + rows_cap * dk;                              // [kChunkKeys][max(dk, dv) + 1]
    float* p_s = kv_s + kChunkKeys * (max(dk, dv) + 1);             // [rows_cap][kSplitKeys]
    const RowStates split{st[0], st[1], p_s + rows_cap * kSplitKeys};
    const RowStates seg{st[2], st[3], split.o + rows_cap * dv};
    const RowStates tot{st[4], st[5], seg.o + rows_cap * dv};

    // phase load: the tile's queries, rotated by their absolute positions; what each row sees
    for (uint32_t x = threadIdx.x; x < R * dk; x += blockDim.x) {
        const uint32_t r = x / dk, row = w.row0 + r, t = row / G, h = w.kv_head * G + row % G;
        q_s[x] = q[((static_cast<uint64_t>(c.token_base) + t) * g.n_q_heads + h) * dk + x % dk];
    }
    if (threadIdx.x < R) {
        const uint64_t i = static_cast<uint64_t>(c.len_before) + (w.row0 + threadIdx.x) / G; // its own key included
        limit[threadIdx.x] = static_cast<uint32_t>(i + 1);
        lo[threadIdx.x] = static_cast<uint32_t>(kvc::opt::window_begin(i, g.window));
    }
    __syncthreads();
    if (g.rope != m::kRopeNone) {
        const uint32_t half = g.rope_dims / 2;
        for (uint32_t x = threadIdx.x; x < R * half; x += blockDim.x) {
            const uint32_t r = x / half, j = x % half;
            uint32_t a, b;
            m::rope_pair(g.rope, g.rope_dims, j, &a, &b);
            double cs, sn;
            m::rope_cos_sin(static_cast<uint64_t>(limit[r]) - 1, g.inv_freq[j], &cs, &sn);
            m::rope_rotate(q_s + r * dk + g.rope_begin + a, q_s + r * dk + g.rope_begin + b, cs, sn);
        }
    }
    clear_states(tot, R, dv);
    TileView tv;
    tv.limit = limit;
    tv.lo = lo;
    tv.window = g.window;
    tv.n_sinks = g.n_sinks;
    tv.first = static_cast<uint64_t>(c.len_before) + w.row0 / G;
    tv.last = static_cast<uint64_t>(c.len_before) + (w.row0 + R - 1) / G; // rows are token-major: the last sees most
    tv.sinks_end = g.window == 0 ? 0u : g.n_sinks;
    tv.skip_begin = tv.sinks_end;
    tv.skip_end = kvc::opt::window_begin(tv.first, g.window); // empty when it is not past the sinks
    const uint32_t max_limit = static_cast<uint32_t>(tv.last + 1);

    for (uint32_t sg = w.seg_begin; sg < w.seg_end; ++sg) {
        __syncthreads();
        clear_states(seg, R, dv);
        for (uint32_t sp = 0; sp < kSegmentSplits; ++sp) {
            const uint32_t k0 = (sg * kSegmentSplits + sp) * kSplitKeys;
            if (k0 >= max_limit) break; // every row's state of this split is empty: merging it is an exact no-op
            const uint32_t nk = min(kSplitKeys, max_limit - k0);
            if (!tv.tile_sees(k0, k0 + nk)) continue; // no row sees it (outside every window): the same no-op
            split_state(g, table, w.kv_head, q_s, tv, R, k0, nk, kv_s, p_s, split);
            merge_states(seg, split, R, dv, scales);
        }
        merge_states(tot, seg, R, dv, scales);
    }

    // phase store
    for (uint32_t x = threadIdx.x; x < R * dv; x += blockDim.x) {
        const uint32_t r = x / dv, row = w.row0 + r, t = row / G, h = w.kv_head * G + row % G;
        if (w.final)
            out[((static_cast<uint64_t>(c.token_base) + t) * g.n_q_heads + h) * dv + x % dv] =
                normalize_elem(tot.m[r], tot.l[r], tot.o[x]);
        else
            po[(static_cast<uint64_t>(w.partial) + r) * dv + x % dv] = tot.o[x];
    }
    if (!w.final && threadIdx.x < R) {
        pm[w.partial + threadIdx.x] = tot.m[threadIdx.x];
        pl[w.partial + threadIdx.x] = tot.l[threadIdx.x];
    }
}

// phase merge (spread tiles): fold the segment states of each row in segment order, normalize, store. Every thread
// folds m and l itself (the same operations in the same order as the in-kernel fold) next to its own o elements.
// Segments no row of the tile sees have no partial: their state is empty and folding it is an exact no-op.
__global__ void merge_kernel(Geometry g, const CallDesc* calls, float* out, const MergeItem* merges, const float* pm,
                             const float* pl, const float* po) {
    const MergeItem mi = merges[blockIdx.x];
    const CallDesc c = calls[mi.call];
    const uint32_t d = g.head_dim_v, R = mi.n_rows, G = g.group;
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

// ---- read_kv, read_kv_scales: byte ranges of rows as stored, one CUDA block per (row, KV head) ----
__global__ void gather_kernel(Geometry g, const uint32_t* table, uint32_t pos, RowBytes rb, uint8_t* k_out,
                              uint8_t* v_out) {
    const uint32_t i = blockIdx.x, h = blockIdx.y;
    const uint64_t row = static_cast<uint64_t>(i) * g.n_kv_heads + h;
    const uint8_t* ks = kvc_kv_address(&g.layout, table, static_cast<uint64_t>(pos) + i, KVC_PLANE_K, h, 0) + rb.from;
    const uint8_t* vs =
        kvc_kv_address(&g.layout_v, table, static_cast<uint64_t>(pos) + i, KVC_PLANE_V, h, 0) + rb.from_v;
    for (uint32_t x = threadIdx.x; x < rb.bytes; x += blockDim.x) k_out[row * rb.bytes + x] = ks[x];
    for (uint32_t x = threadIdx.x; x < rb.bytes_v; x += blockDim.x) v_out[row * rb.bytes_v + x] = vs[x];
}

uint32_t threads_for(uint32_t d) { return d >= 128 ? 128u : d >= 64 ? 64u : 32u; }

} // namespace

cudaError_t prepare_attention() {
    return cudaFuncSetAttribute(attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(attention_shared_bytes_max()));
}

cudaError_t launch_append(const Geometry& g, const CallDesc* calls, const uint32_t* token_call, uint32_t total,
                          const uint32_t* tables, const float* k, const float* v, cudaStream_t s) {
    if (total == 0) return cudaSuccess;
    append_kernel<<<dim3(total, g.n_kv_heads), threads_for(max(g.head_dim, g.head_dim_v)), 0, s>>>(g, calls, token_call,
                                                                                                 tables, k, v);
    return cudaGetLastError();
}

cudaError_t launch_attention(const Geometry& g, const CallDesc* calls, const uint32_t* tables, const float* q,
                             float* out, const WorkItem* items, uint32_t n_items, uint32_t rows_cap,
                             const MergeItem* merges, uint32_t n_merge, float* partial_m, float* partial_l,
                             float* partial_o, cudaStream_t s) {
    if (n_items > 0) {
        if (rows_cap == 0 || rows_cap > tile_rows(g.head_dim, g.head_dim_v)) return cudaErrorInvalidValue;
        attend_kernel<<<n_items, kThreads, attention_shared_bytes(g.head_dim, g.head_dim_v, rows_cap), s>>>(
            g, calls, tables, q, out, items, rows_cap, partial_m, partial_l, partial_o);
        if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    if (n_merge > 0) {
        merge_kernel<<<n_merge, kThreads, 0, s>>>(g, calls, out, merges, partial_m, partial_l, partial_o);
        if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t launch_gather(const Geometry& g, const uint32_t* table, uint32_t pos, uint32_t n, RowBytes rb,
                          uint8_t* k_out, uint8_t* v_out, cudaStream_t s) {
    if (n == 0 || (rb.bytes == 0 && rb.bytes_v == 0)) return cudaSuccess;
    gather_kernel<<<dim3(n, g.n_kv_heads), threads_for(max(g.head_dim, g.head_dim_v)), 0, s>>>(g, table, pos, rb,
                                                                                             k_out, v_out);
    return cudaGetLastError();
}

} // namespace kvc::cuda

namespace kvc::cuda {
cudaError_t kernels_loadable() {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, attend_kernel);
}
} // namespace kvc::cuda
