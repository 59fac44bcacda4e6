// Bytes the process holds from malloc right now (glibc's mallinfo2: in-use chunks of every arena plus mmapped
// chunks). The NO-Q property reads it around every call to find storage an implementation did not report.
#pragma once

#include <cstdint>

namespace kvc::prop {

int64_t heap_in_use();

} // namespace kvc::prop
