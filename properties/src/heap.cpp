#include "kvcheck/properties/heap.hpp"

#include <malloc.h>

namespace kvc::prop {

int64_t heap_in_use() {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

} // namespace kvc::prop
