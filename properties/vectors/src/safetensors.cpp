#include "kvcheck/vectors/safetensors.hpp"

#include "kvcheck/harness/input_file.hpp"
#include "kvcheck/harness/report.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

namespace kvc::st {

namespace {

struct DTypeInfo {
    DType t;
    const char* name;
    std::size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},     {DType::I8, "I8", 1},       {DType::U16, "U16", 2},
    {DType::I16, "I16", 2},   {DType::F16, "F16", 2},   {DType::BF16, "BF16", 2},   {DType::U32, "U32", 4},
    {DType::I32, "I32", 4},   {DType::F32, "F32", 4},   {DType::U64, "U64", 8},     {DType::I64, "I64", 8},
    {DType::F64, "F64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1}};

const DTypeInfo& info(DType t) {
    for (const DTypeInfo& i : kDTypes)
        if (i.t == t) return i;
    return kDTypes[0];
}

// Element count times element size, or nullopt on overflow.
std::optional<uint64_t> byte_size(const std::vector<uint64_t>& shape, std::size_t element) {
    uint64_t n = element;
    for (uint64_t d : shape) {
        if (d != 0 && n > std::numeric_limits<uint64_t>::max() / d) return std::nullopt;
        n *= d;
    }
    return n;
}

// A non-negative integer of a JSON header, or a FormatError.
uint64_t as_u64(const nlohmann::json& j, const std::string& file, const std::string& what) {
    if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0))
        throw FormatError(file, what + " is not a non-negative integer");
    return j.get<uint64_t>();
}

struct Entry {
    std::string name;
    uint64_t begin, end;
    Tensor t;
};

} // namespace

std::string shape_text(const std::vector<uint64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}


const char* dtype_name(DType t) { return info(t).name; }
std::size_t dtype_size(DType t) { return info(t).size; }

std::optional<DType> dtype_from_name(const std::string& s) {
    for (const DTypeInfo& i : kDTypes)
        if (s == i.name) return i.t;
    return std::nullopt;
}

uint64_t Tensor::elements() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
}

const Tensor* File::find(const std::string& name) const {
    for (const auto& [n, t] : tensors)
        if (n == name) return &t;
    return nullptr;
}

Tensor& File::add(const std::string& name, DType dtype, std::vector<uint64_t> shape) {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data.assign(t.elements() * dtype_size(dtype), 0);
    tensors.emplace_back(name, std::move(t));
    return tensors.back().second;
}

File parse(const uint8_t* bytes, std::size_t n, const std::string& file) {
    if (n < 8)
        throw FormatError(file, "truncated: " + std::to_string(n) +
                                    " bytes, shorter than the 8-byte header length field");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];
    if (header_len > kMaxHeaderBytes)
        throw FormatError(file, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                                    std::to_string(kMaxHeaderBytes) + " bytes");
    if (header_len > n - 8)
        throw FormatError(file, "header length " + std::to_string(header_len) + " is larger than the file (" +
                                    std::to_string(n - 8) + " bytes after the length field): truncated header");
    if (header_len < 2 || bytes[8] != '{')
        throw FormatError(file, "the header does not start with a JSON object '{'");

    nlohmann::json header;
    try {
        // strict: a tensor named twice is refused; a number like 1e400 is an error, not an escaping exception
        header = harness::parse_json_strict(std::string(reinterpret_cast<const char*>(bytes) + 8, header_len));
    } catch (const harness::InputError& e) {
        throw FormatError(file, std::string("header: ") + e.what());
    }
    if (!header.is_object()) throw FormatError(file, "the header is not a JSON object");

    const uint8_t* data = bytes + 8 + header_len;
    const uint64_t data_len = n - 8 - header_len;
    File f;
    std::vector<Entry> entries;
    for (const auto& [name, value] : header.items()) {
        if (name == "__metadata__") {
            if (!value.is_object()) throw FormatError(file, "__metadata__ is not an object of strings");
            for (const auto& [k, v] : value.items()) {
                if (!v.is_string()) throw FormatError(file, "__metadata__ entry \"" + k + "\" is not a string");
                f.metadata[k] = v.get<std::string>();
            }
            continue;
        }
        const std::string where = "tensor \"" + name + "\"";
        if (!value.is_object()) throw FormatError(file, where + " is not an object");
        for (const char* key : {"dtype", "shape", "data_offsets"})
            if (!value.contains(key)) throw FormatError(file, where + " has no \"" + key + "\"");
        Entry e;
        e.name = name;
        if (!value["dtype"].is_string()) throw FormatError(file, where + ": dtype is not a string");
        const std::string dt = value["dtype"].get<std::string>();
        const auto dtype = dtype_from_name(dt);
        if (!dtype) throw FormatError(file, where + ": unknown dtype \"" + dt + "\"");
        e.t.dtype = *dtype;
        if (!value["shape"].is_array()) throw FormatError(file, where + ": shape is not an array");
        for (const auto& d : value["shape"]) e.t.shape.push_back(as_u64(d, file, where + ": a shape entry"));
        const auto& offs = value["data_offsets"];
        if (!offs.is_array() || offs.size() != 2)
            throw FormatError(file, where + ": data_offsets is not an array of two integers");
        e.begin = as_u64(offs[0], file, where + ": data_offsets[0]");
        e.end = as_u64(offs[1], file, where + ": data_offsets[1]");
        if (e.end < e.begin)
            throw FormatError(file, where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                                        std::to_string(e.end) + "] end before they begin");
        if (e.end > data_len)
            throw FormatError(file, where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                                        std::to_string(e.end) + "] out of range: the data buffer holds " +
                                        std::to_string(data_len) + " bytes");
        const auto need = byte_size(e.t.shape, dtype_size(e.t.dtype));
        if (!need || *need != e.end - e.begin)
            throw FormatError(file, where + ": data_offsets span " + std::to_string(e.end - e.begin) +
                                        " bytes, but dtype " + dt + " (" + std::to_string(dtype_size(e.t.dtype)) +
                                        " bytes) times shape " + shape_text(e.t.shape) + " needs " +
                                        (need ? std::to_string(*need) : std::string("more than 2^64")) + " bytes");
        entries.push_back(std::move(e));
    }

    // The tensors must tile the data buffer: sorted by offset, each starts where the previous ended.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at = 0;
    const Entry* prev = nullptr;
    for (const Entry& e : entries) {
        if (e.begin < at)
            throw FormatError(file, "tensors \"" + prev->name + "\" [" + std::to_string(prev->begin) + ", " +
                                        std::to_string(prev->end) + ") and \"" + e.name + "\" [" +
                                        std::to_string(e.begin) + ", " + std::to_string(e.end) +
                                        ") overlap in the data buffer");
        if (e.begin > at)
            throw FormatError(file, "bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) +
                                        ") of the data buffer belong to no tensor (a gap before \"" + e.name + "\")");
        at = e.end;
        prev = &e;
    }
    if (at != data_len)
        throw FormatError(file, "the tensors cover " + std::to_string(at) + " bytes but the data buffer holds " +
                                    std::to_string(data_len) + " bytes");
    for (Entry& e : entries) {
        e.t.data.assign(data + e.begin, data + e.end);
        f.tensors.emplace_back(e.name, std::move(e.t));
    }
    return f;
}

File read_file(const std::string& path) {
    // A regular file only (/dev/zero or a FIFO would be read forever), bounded; within it, the header's declared
    // sizes must tile the data exactly (parse), so nothing beyond the file's own size is ever allocated.
    std::string bytes;
    try {
        bytes = harness::read_bounded(path, harness::kMaxTensorFileBytes);
    } catch (const harness::InputError& e) {
        throw FormatError(path, e.what());
    }
    return parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

std::vector<uint8_t> serialize(const File& f) {
    nlohmann::json header = nlohmann::json::object();
    if (!f.metadata.empty()) header["__metadata__"] = f.metadata;
    uint64_t at = 0;
    for (const auto& [name, t] : f.tensors) {
        if (t.data.size() != t.elements() * dtype_size(t.dtype))
            throw std::logic_error("safetensors: tensor \"" + name + "\" holds " + std::to_string(t.data.size()) +
                                   " bytes for shape " + shape_text(t.shape));
        header[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape},
                        {"data_offsets", {at, at + t.data.size()}}};
        at += t.data.size();
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t len = text.size();
    std::vector<uint8_t> out(8 + len + at);
    for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
    std::memcpy(out.data() + 8, text.data(), len);
    size_t pos = 8 + len;
    for (const auto& nt : f.tensors) {
        if (!nt.second.data.empty()) std::memcpy(out.data() + pos, nt.second.data.data(), nt.second.data.size());
        pos += nt.second.data.size();
    }
    return out;
}

void write_bytes_atomically(const std::string& path, const std::string& bytes, bool flushed) {
    std::string error;
    if (!harness::write_file_atomically(path, bytes, error, flushed ? harness::Flush::Now : harness::Flush::Later))
        throw std::runtime_error(error);
}

void write_file(const std::string& path, const File& f, bool flushed) {
    const std::vector<uint8_t> b = serialize(f);
    write_bytes_atomically(path, std::string(b.begin(), b.end()), flushed);
}

std::vector<float> to_f32(const Tensor& t) {
    std::vector<float> v(t.data.size() / 4);
    if (!v.empty()) std::memcpy(v.data(), t.data.data(), v.size() * 4);
    return v;
}

void put_f32(Tensor& t, const float* values, std::size_t n) {
    t.data.resize(n * 4);
    if (n) std::memcpy(t.data.data(), values, n * 4);
}

void put_f64(Tensor& t, const double* values, std::size_t n) {
    t.data.resize(n * 8);
    if (n) std::memcpy(t.data.data(), values, n * 8);
}

} // namespace kvc::st
