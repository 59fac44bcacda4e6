/*
 * The paged KV layout: one small struct and one addressing function, shared by host and device code.
 *
 * A cache is a pool of fixed-size blocks. A block holds block_size token slots of every KV head, K and V:
 *
 *   block = [ K plane | V plane ]            plane = [n_kv_heads][block_size][head_dim] elements
 *
 * A row (one token of one head) is its head_dim elements, then, for the quantized dtypes whose scales belong to the
 * row, those scales (scale_bytes): int8 per token keeps its one f32 or f16 scale after its head_dim int8 codes, q8_0
 * its head_dim / 32 f16 scales after its head_dim codes, as ggml's block_q8_0 keeps d beside its codes. A row is one
 * stride, so everything that walks, prefetches or copies rows carries the scales along with no second address.
 *
 * Each (sequence, layer) stream owns a block table: table[i] is the id of the block holding its positions
 * i*block_size .. (i+1)*block_size - 1. Head-major planes keep one head's rows of a block contiguous
 * (block_size * head_dim elements), which is what a decode kernel streams for one KV head.
 *
 * Plain C on purpose: no STL, fixed-width fields, every byte offset in 64 bits (a slot index times a row size
 * overflows 32 bits at a few million tokens). docs/kv_layout.md states the invariants.
 */
#ifndef KVCHECK_OPTIMIZED_KV_LAYOUT_H
#define KVCHECK_OPTIMIZED_KV_LAYOUT_H

#include <stdint.h>

#if defined(__CUDACC__)
#define KVC_HOST_DEVICE __host__ __device__
#else
#define KVC_HOST_DEVICE
#endif

#ifdef __cplusplus
#define KVC_LAYOUT_INLINE inline
#else
#define KVC_LAYOUT_INLINE static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum { KVC_PLANE_K = 0, KVC_PLANE_V = 1 };

typedef struct kvc_kv_layout {
    uint8_t* const* block_base; /* [blocks in the pool] block id -> first byte of that block */
    uint64_t plane_bytes;       /* one plane of a block: n_kv_heads * head_bytes; the V plane starts here */
    uint64_t head_bytes;        /* one head's rows in one plane: block_size * row_bytes */
    uint64_t row_bytes;         /* one token of one head: head_dim * elem_bytes + scale_bytes */
    uint32_t elem_bytes;        /* 4 (f32), 2 (f16, bf16) or 1 (the code of a quantized dtype) */
    uint32_t block_size;        /* token slots per block, >= 1, any value (not only powers of two) */
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t scale_bytes;       /* scales stored after a row's elements: 0, or 4 / 2 (INT8_TOKEN with an f32 / f16
                                   scale), 2 * head_dim / 32 (Q8_0); fp8's scales are the config's, not a row's */
} kvc_kv_layout;

/* The geometry of a layout whose rows carry scale_bytes of scales after their elements; block_base is filled by
   whoever owns the blocks. */
KVC_HOST_DEVICE KVC_LAYOUT_INLINE kvc_kv_layout kvc_kv_layout_make_scaled(uint32_t block_size, uint32_t n_kv_heads,
                                                                        uint32_t head_dim, uint32_t elem_bytes,
                                                                        uint32_t scale_bytes) {
    kvc_kv_layout l;
    l.block_base = 0;
    l.elem_bytes = elem_bytes;
    l.block_size = block_size;
    l.n_kv_heads = n_kv_heads;
    l.head_dim = head_dim;
    l.scale_bytes = scale_bytes;
    l.row_bytes = (uint64_t)head_dim * elem_bytes + scale_bytes;
    l.head_bytes = (uint64_t)block_size * l.row_bytes;
    l.plane_bytes = (uint64_t)n_kv_heads * l.head_bytes;
    return l;
}

/* The geometry of a layout without row scales (f32, f16, bf16, fp8). */
KVC_HOST_DEVICE KVC_LAYOUT_INLINE kvc_kv_layout kvc_kv_layout_make(uint32_t block_size, uint32_t n_kv_heads,
                                                                 uint32_t head_dim, uint32_t elem_bytes) {
    return kvc_kv_layout_make_scaled(block_size, n_kv_heads, head_dim, elem_bytes, 0);
}

/* The geometry of the V rows of a block whose V rows have head_dim_v dims (ABI 1.2, multi-head latent attention) and
   whose K rows are k's: rows, heads and the plane are head_dim_v wide, but plane_bytes stays K's, so that
   kvc_kv_address(&v, ..., KVC_PLANE_V, ...) finds the V plane right after the K plane. Such a block is
   kvc_kv_block_bytes_kv(k, v) bytes. When head_dim_v == k->head_dim this is *k itself. */
KVC_HOST_DEVICE KVC_LAYOUT_INLINE kvc_kv_layout kvc_kv_layout_make_v(const kvc_kv_layout* k, uint32_t head_dim_v,
                                                                   uint32_t scale_bytes_v) {
    kvc_kv_layout v = kvc_kv_layout_make_scaled(k->block_size, k->n_kv_heads, head_dim_v, k->elem_bytes, scale_bytes_v);
    v.block_base = k->block_base;
    v.plane_bytes = k->plane_bytes;
    return v;
}

/* Bytes of K and V storage in one block whose K rows are k's and V rows v's (kvc_kv_layout_make_v). */
KVC_HOST_DEVICE KVC_LAYOUT_INLINE uint64_t kvc_kv_block_bytes_kv(const kvc_kv_layout* k, const kvc_kv_layout* v) {
    return k->plane_bytes + (uint64_t)k->n_kv_heads * v->head_bytes;
}

/* Bytes of K and V storage in one block (both planes), padding excluded. */
KVC_HOST_DEVICE KVC_LAYOUT_INLINE uint64_t kvc_kv_block_bytes(const kvc_kv_layout* l) { return 2u * l->plane_bytes; }

/* Byte offset, inside its block, of element `dim` of head `head` in slot `slot` of plane `plane`
   (KVC_PLANE_K or KVC_PLANE_V). */
KVC_HOST_DEVICE KVC_LAYOUT_INLINE uint64_t kvc_kv_block_offset(const kvc_kv_layout* l, uint64_t slot, uint32_t plane,
                                                             uint32_t head, uint32_t dim) {
    return (uint64_t)plane * l->plane_bytes + (uint64_t)head * l->head_bytes + slot * l->row_bytes +
           (uint64_t)dim * l->elem_bytes;
}

/* Byte offset, inside a row, of its first scale (scale_bytes of them follow the elements). */
KVC_HOST_DEVICE KVC_LAYOUT_INLINE uint64_t kvc_kv_scale_offset(const kvc_kv_layout* l) {
    return (uint64_t)l->head_dim * l->elem_bytes;
}

/* THE addressing function: the byte address of element `dim` of head `head` of token `pos` in plane `plane` of
   the stream whose block table is `table`. Everything that touches the cache goes through here, or through the
   strides it is made of when it walks the rows of one block. */
KVC_HOST_DEVICE KVC_LAYOUT_INLINE uint8_t* kvc_kv_address(const kvc_kv_layout* l, const uint32_t* table, uint64_t pos,
                                                        uint32_t plane, uint32_t head, uint32_t dim) {
    const uint64_t block = pos / l->block_size;
    return l->block_base[table[block]] + kvc_kv_block_offset(l, pos - block * l->block_size, plane, head, dim);
}

#ifdef __cplusplus
}
#endif

#endif /* KVCHECK_OPTIMIZED_KV_LAYOUT_H */
