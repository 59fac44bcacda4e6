#include "kvcheck/properties/mismatch.hpp"

#include "kvcheck/abi.hpp"

#include <sstream>

namespace kvc::prop {

std::string storage_error_clause(uint32_t cache_dtype, const Mismatch& first) {
    return std::string("; the rows read back differ from the appended values ") +
           (dtype_is_quantized(cache_dtype) ? "quantized to " : "rounded to ") + dtype_name(cache_dtype) +
           " (first: " + first.describe() + "): a storage error, not arithmetic (CACHE-CONTENT checks it)";
}

std::string Mismatch::describe() const {
    std::ostringstream s;
    s.precision(9); // enough to tell two floats apart
    s << what;
    if (op >= 0) s << " at op " << op;
    if (seq >= 0) s << ", seq " << seq;
    if (layer >= 0) s << ", layer " << layer;
    if (pos >= 0) s << ", position " << pos;
    if (head >= 0) s << ", head " << head;
    if (dim >= 0) s << ", dim " << dim;
    s << ": expected " << expected << ", got " << actual;
    return s.str();
}

} // namespace kvc::prop
