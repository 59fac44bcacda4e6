// Eviction (config.evict, with windows): a block whose every row no later query of its layer can see goes back to
// the pool, so an evicting stream holds its sinks' blocks, the blocks its window reaches and the partly filled last
// one, at any length. Positions stay absolute: the freed block's table entry stays in place as kDroppedBlock, and no
// kernel reaches it (the plans and the walks cover only keys some row sees; docs/engine.md, "Windows").
#include "engine_impl.hpp"

namespace kvc::opt {

void Engine::Impl::evict_dead(Stream& s, uint32_t layer) {
    const uint32_t w = window_of(layer);
    if (!evict || w == 0 || s.length < w) return;
    // The next query is at position length: it sees j iff j < n_sinks or length - j < w, so rows below
    // dead_end = length - w + 1 are dead from n_sinks on (and stay dead: later queries reach back even less).
    const uint64_t dead_end = uint64_t{s.length} - w + 1;
    for (uint64_t b = uint64_t{sink_blocks} + s.dropped; (b + 1) * block_size <= dead_end; ++b) {
        pool.drop(s.blocks[b]); // shared after fork: only this table's reference goes
        s.blocks[b] = kDroppedBlock;
        ++s.dropped;
    }
}

bool Engine::Impl::holds_dropped(const Stream& s, uint64_t pos, uint64_t n) const {
    if (s.dropped == 0 || n == 0) return false;
    const uint64_t first = pos / block_size, last = (pos + n - 1) / block_size;
    return first < uint64_t{sink_blocks} + s.dropped && last >= sink_blocks;
}

} // namespace kvc::opt
