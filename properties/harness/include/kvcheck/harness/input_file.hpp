// Reading files that come from outside (vectors, results, caps declarations, safetensors): one bounded reader, one
// strict JSON parser and one confinement check, so that no reader can be made to block on a FIFO, read /dev/zero
// until memory runs out, take a key given twice, let a number like 1e400 escape as an exception, or open a file
// outside the directory it was told to read. docs/bad-input.md lists what each refusal says.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace kvc::harness {

// The largest JSON document any reader accepts (manifests, results, caps): far above what export writes (a
// manifest of 1000 cases is a few MiB) and far below what would hurt.
constexpr uint64_t kMaxJsonBytes = uint64_t{64} << 20;
// The largest safetensors file: its real bound is the header's declared sizes, which must tile the file exactly.
constexpr uint64_t kMaxTensorFileBytes = uint64_t{16} << 30;

// A file that cannot be read as asked. what() names no file: the caller prefixes the path it knows.
class InputError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The whole content of `path`, which must be a regular file (a FIFO, device or directory is refused without
// blocking: it is opened O_NONBLOCK and checked with fstat) of at most `limit` bytes. Throws InputError.
std::string read_bounded(const std::string& path, uint64_t limit);

// JSON text through the strict, linear reader (kvcheck/strict_json.hpp): a key given twice, nesting deeper than 128
// levels or more than about 4 million values is refused, as is every parser error (syntax, a number out of range
// such as 1e400); each becomes InputError. Time and memory are linear in the text.
nlohmann::json parse_json_strict(const std::string& text);

// read_bounded(path, kMaxJsonBytes) + parse_json_strict; errors are "PATH: problem".
nlohmann::json read_json_file(const std::string& path);

// `relative`, named by a manifest, resolved inside `root`: it must be a relative path without ".." components,
// and what it resolves to (symbolic links followed) must lie inside root's real path. Returns the resolved path,
// or throws InputError saying why (naming `relative`, never anything read from the file).
std::string confined_path(const std::string& root, const std::string& relative);

// An integer JSON value that fits T, or nullopt (a float, a string, a value out of T's range).
template <typename T>
std::optional<T> integer_of(const nlohmann::json& j) {
    if (j.is_number_unsigned()) {
        const uint64_t u = j.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
        return static_cast<T>(u);
    }
    if (j.is_number_integer()) {
        const int64_t i = j.get<int64_t>();
        if constexpr (std::is_unsigned_v<T>) {
            if (i < 0) return std::nullopt;
            return static_cast<T>(i);
        } else {
            if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
                i > static_cast<int64_t>(std::numeric_limits<T>::max()))
                return std::nullopt;
            return static_cast<T>(i);
        }
    }
    return std::nullopt;
}

// Text from outside (an implementation's name or error, a file's field, a message quoting either) made safe for a
// terminal and for reports: control characters (and DEL) become \xNN, so a name cannot clear the screen or retitle
// the window. Newlines and tabs are kept when keep_lines.
std::string printable(const std::string& s, bool keep_lines = false);

} // namespace kvc::harness
