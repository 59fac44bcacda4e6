// safetensors files, read and written without the Python package: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}} with an optional "__metadata__" object of strings, then the tensors'
// raw little-endian row-major bytes back to back. The reader checks what the reference reader checks and says, in
// every error, which file and what is wrong with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvc::st {

enum class DType { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2 };

const char* dtype_name(DType t);                          // "F32", "BF16", ...
std::optional<DType> dtype_from_name(const std::string& s); // nullopt for anything else
std::size_t dtype_size(DType t);                          // bytes per element
std::string shape_text(const std::vector<uint64_t>& shape); // "[2, 8, 64]"

// The header may not be larger than this (the reference reader's limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct Tensor {
    DType dtype = DType::F32;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> data; // element count * dtype_size bytes, little-endian, row-major
    uint64_t elements() const; // product of the shape (1 for a scalar)
};

struct File {
    std::map<std::string, std::string> metadata;
    std::vector<std::pair<std::string, Tensor>> tensors; // written in this order; read back in data order
    const Tensor* find(const std::string& name) const;   // nullptr when absent
    Tensor& add(const std::string& name, DType dtype, std::vector<uint64_t> shape); // zero-filled data
};

// A file that is not a well-formed safetensors file. what() is "<file>: <problem>".
class FormatError : public std::runtime_error {
public:
    FormatError(const std::string& file, const std::string& problem)
        : std::runtime_error(file + ": " + problem), file_(file), problem_(problem) {}
    const std::string& file() const { return file_; }
    const std::string& problem() const { return problem_; }

private:
    std::string file_, problem_;
};

// Parses bytes[0, n). `file` only names the source in errors. Throws FormatError.
File parse(const uint8_t* bytes, std::size_t n, const std::string& file);
// Reads and parses a file. Throws FormatError (also when it cannot be read).
File read_file(const std::string& path);

// The bytes of a file: the header is compact JSON, padded with spaces to a multiple of 8 bytes so the data starts
// aligned. Tensors are laid out in the order of File::tensors. Same File, same bytes.
std::vector<uint8_t> serialize(const File& f);
// Writes a file whole or not at all (a temporary next to it, then rename). Throws std::runtime_error naming path.
// flushed = false: not flushed to disk yet, for one of many files behind a commit mark whose writer flushes the
// filesystem once before writing the mark (harness::Flush::Later, harness::flush_filesystem).
void write_file(const std::string& path, const File& f, bool flushed = true);
void write_bytes_atomically(const std::string& path, const std::string& bytes, bool flushed = true); // any content

// Typed views. The caller checks dtype first; these copy element by element (little-endian host assumed, as the
// ABI does).
std::vector<float> to_f32(const Tensor& t); // F32 only
void put_f32(Tensor& t, const float* values, std::size_t n);
void put_f64(Tensor& t, const double* values, std::size_t n);

} // namespace kvc::st
