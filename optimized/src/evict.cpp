// Eviction (config.evict, with windows): a block whose every row no later query of its layer can see goes back to
// the pool, so an evicting stream holds its sinks' blocks, the blocks its window reaches and the partly filled last
// one, at any length. Positions stay absolute: the freed block's table entry stays in place as kDroppedBlock, and no
// kernel reaches it (the plans and the walks cover only keys some row sees; docs/engine.md, "Windows").
#include "engine_impl.hpp"

namespace kvc::opt {

// The rule (which blocks are dead) is window_rule.hpp's, shared with the CUDA engine.
void Engine::Impl::evict_dead(Stream& s, uint32_t layer) {
    if (!evict) return;
    // shared after fork: only this table's reference goes
    evict_dead_blocks(s.blocks.data(), &s.dropped, s.length, window_of(layer), block_size, sink_blocks,
                      [this](uint32_t id) { pool.drop(id); });
}

bool Engine::Impl::holds_dropped(const Stream& s, uint64_t pos, uint64_t n) const {
    return range_holds_dropped(pos, n, block_size, sink_blocks, s.dropped);
}

} // namespace kvc::opt
