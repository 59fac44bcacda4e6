// Fuzz target: a safetensors file (vectors' inputs and expected outputs, an implementation's results) through
// st::parse: header length, JSON header, dtypes, shapes, data offsets, overlaps, truncation. Contract
// (safetensors.hpp): bad input throws st::FormatError only; an accepted file serializes to bytes that parse to
// the same tensors.
#include "kvcheck/vectors/safetensors.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace kvc::st;
    File f;
    try {
        f = parse(data, size, "fuzz.safetensors");
    } catch (const FormatError&) {
        return 0;
    }
    for (const auto& [name, t] : f.tensors) {
        if (t.data.size() != t.elements() * dtype_size(t.dtype)) std::abort(); // parse let a size mismatch through
        if (t.dtype == DType::F32) (void)to_f32(t);
    }
    const std::vector<uint8_t> bytes = serialize(f);
    const File again = parse(bytes.data(), bytes.size(), "fuzz.reserialized"); // must not throw
    if (again.tensors.size() != f.tensors.size() || again.metadata != f.metadata) std::abort();
    for (const auto& [name, t] : f.tensors) {
        const Tensor* u = again.find(name);
        if (!u || u->dtype != t.dtype || u->shape != t.shape || u->data != t.data) std::abort();
    }
    return 0;
}
