// The append path: the only code that writes into the cache, and only at a stream's end. Past blocks are never
// written: a full block is sealed (test mode) the moment its last slot is filled, and a block shared after fork is
// copied before this stream writes into it (copy-on-write).
#include "dtype_convert.hpp"
#include "engine_impl.hpp"

#include <cstring>

namespace kvc::opt {

uint64_t Engine::Impl::blocks_needed(const Stream& s, uint32_t n) const {
    if (n == 0) return 0;
    const uint64_t have = s.blocks.size(), need = (static_cast<uint64_t>(s.length) + n + block_size - 1) / block_size;
    const bool copy_last = s.length % block_size != 0 && pool.refcount(s.blocks.back()) > 1;
    return need - have + (copy_last ? 1 : 0);
}

void Engine::Impl::reserve_table(Stream& s, uint32_t n) const {
    s.blocks.reserve((static_cast<uint64_t>(s.length) + n + block_size - 1) / block_size);
}

void Engine::Impl::write(const Pending& p) {
    Stream& s = *p.stream;
    const uint32_t B = block_size, H = cfg.n_kv_heads, d = cfg.head_dim, dv = head_dim_v;
    const uint64_t fill = s.length % B;

    // phase 1: copy-on-write. The last block is partly filled and another stream shares it: copy the filled
    // slots of every head of both planes into a private block, and write there.
    if (p.n > 0 && fill != 0 && pool.refcount(s.blocks.back()) > 1) {
        const uint32_t shared = s.blocks.back(), own = pool.take();
        for (uint32_t plane = 0; plane < 2; ++plane) {
            const kvc_kv_layout& g = plane == 0 ? geometry : geometry_v;
            for (uint32_t h = 0; h < H; ++h) {
                const uint64_t off = kvc_kv_block_offset(&g, 0, plane, h, 0);
                std::memcpy(pool.base(own) + off, pool.base(shared) + off, fill * g.row_bytes);
            }
        }
        pool.drop(shared);
        s.blocks.back() = own;
    }
    // phase 2: new blocks for the positions past the last one
    const uint64_t need = (static_cast<uint64_t>(s.length) + p.n + B - 1) / B;
    while (s.blocks.size() < need) s.blocks.push_back(pool.take());

    // phase 3: scatter each new row (K rotated by its position) into its slot, sealing blocks as they fill (the
    // address is kvc_kv_address's, split into block and slot).
    alignas(32) float row[kMaxHeadDim];
    double cs[kMaxHeadDim];
    uint64_t block = s.length / B;
    uint32_t slot = static_cast<uint32_t>(s.length % B);
    for (uint32_t i = 0; i < p.n; ++i) {
        const uint64_t pos = static_cast<uint64_t>(s.length) + i;
        if (rope.enabled()) rope.angles(pos, cs);
        uint8_t* base = pool.base(s.blocks[block]);
        for (uint32_t h = 0; h < H; ++h) {
            const float* k = p.k + (static_cast<uint64_t>(i) * H + h) * d;
            const float* v = p.v + (static_cast<uint64_t>(i) * H + h) * dv;
            if (rope.enabled()) {
                std::memcpy(row, k, d * sizeof(float));
                rope.apply(row, cs);
                k = row;
            }
            uint8_t* dst = base + kvc_kv_block_offset(&geometry, slot, KVC_PLANE_K, h, 0);
            uint8_t* dst_v = base + kvc_kv_block_offset(&geometry_v, slot, KVC_PLANE_V, h, 0);
            if (quantized) { // codes and scales of the rotated row: attention reads the row as stored
                const float ks = k_scales.empty() ? 1.0f : k_scales[p.layer * H + h];
                const float vs = v_scales.empty() ? 1.0f : v_scales[p.layer * H + h];
                quantize_row(k, quant, ks, dst);
                quantize_row(v, quant_v, vs, dst_v);
                continue;
            }
            store_row(k, cfg.cache_dtype, dst, d, simd);
            store_row(v, cfg.cache_dtype, dst_v, dv, simd);
        }
        if (++slot == B) { // full: nothing may write here again
            pool.seal(s.blocks[block]);
            slot = 0;
            ++block;
        }
    }
    s.length += p.n;
}

} // namespace kvc::opt
