// Compaction: after releases leave free blocks scattered over many slabs, the blocks of the emptiest slabs move
// into free blocks of the others, so that whole slabs go back to malloc (block_pool.hpp, begin_drain). Besides
// append.cpp this is the only code that writes K/V bytes, and it writes only into free blocks: a moved block is
// copied whole (every slot, poison included) to a fresh block, sealed there if it was sealed, and the one table
// that holds it (only private blocks move) takes the new id. Outputs do not depend on where a block lives.
#include "engine_impl.hpp"

#include <cstring>

namespace kvc::opt {

void Engine::Impl::compact() {
    if (!pool.begin_drain()) return;
    for (auto& [id, sq] : seqs)
        for (Stream& s : sq.layers)
            for (uint32_t& b : s.blocks) {
                if (b == kDroppedBlock || !pool.draining(b)) continue;
                const uint32_t moved = pool.take(); // never in a draining slab: their free blocks are off the list
                std::memcpy(pool.base(moved), pool.base(b), pool.block_bytes());
                if (pool.sealed(b)) pool.seal(moved);
                pool.drop(b);
                b = moved;
            }
    pool.end_drain();
}

} // namespace kvc::opt
