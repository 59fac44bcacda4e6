#include "kvcheck/properties/mismatch.hpp"

#include "kvcheck/abi.hpp"

#include <sstream>

namespace kvc::prop {

std::string storage_error_clause(uint32_t cache_dtype, uint32_t rope, const Mismatch& first) {
    // a quantized key is off by codes far coarser than any rotation's error: that is the storage
    if (rope != KVC_ROPE_NONE && first.what == "k" && !dtype_is_quantized(cache_dtype))
        return std::string("; the keys read back differ from the appended keys rotated and rounded to ") +
               dtype_name(cache_dtype) + " by more than an f32 rotation (or the declared RoPE stage) may (first: " +
               first.describe() + "): the RoPE stage or the storage, not the attention arithmetic" +
               (first.consistent_with.empty() ? std::string() : "; they are consistent with " + first.consistent_with) +
               " (CACHE-CONTENT checks it)";
    return std::string("; the rows read back differ from the appended values ") +
           (dtype_is_quantized(cache_dtype) ? "quantized to " : "rounded to ") + dtype_name(cache_dtype) +
           " (first: " + first.describe() + "): a storage error, not arithmetic" +
           (first.consistent_with.empty() ? std::string() : "; they are consistent with " + first.consistent_with) +
           " (CACHE-CONTENT checks it)";
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
