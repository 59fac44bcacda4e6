#include "kvcheck/harness/input_file.hpp"

#include "kvcheck/strict_json.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

namespace kvc::harness {

namespace {

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

// The closing descriptor of read_bounded, whatever way it leaves.
struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

} // namespace

std::string read_bounded(const std::string& path, uint64_t limit) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it as not a regular file.
    Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
    if (f.fd < 0) throw InputError(sys_error("cannot be opened"));
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) throw InputError(sys_error("cannot be examined"));
    if (!S_ISREG(st.st_mode)) throw InputError("not a regular file (a directory, FIFO, socket or device)");
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size > limit)
        throw InputError(std::to_string(size) + " bytes, more than the limit of " + std::to_string(limit) + " bytes");
    std::string text;
    text.reserve(static_cast<std::size_t>(size));
    std::vector<char> buf(1 << 16);
    for (;;) {
        const ssize_t n = ::read(f.fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw InputError(sys_error("read error"));
        if (n == 0) break;
        text.append(buf.data(), static_cast<std::size_t>(n));
        if (text.size() > limit) // it grew while being read
            throw InputError("more than the limit of " + std::to_string(limit) + " bytes");
    }
    return text;
}

nlohmann::json parse_json_strict(const std::string& text) {
    using nlohmann::json;
    try {
        return json_strict::parse(text);
    } catch (const json_strict::Violation& v) {
        throw InputError(std::string(v.what()) + (v.pointer().empty() ? "" : " at " + v.pointer()));
    } catch (const json::exception& e) { // parse_error, and out_of_range for a number such as 1e400
        throw InputError(std::string("not valid JSON (") + e.what() + ")");
    }
}

nlohmann::json read_json_file(const std::string& path) {
    try {
        return parse_json_strict(read_bounded(path, kMaxJsonBytes));
    } catch (const InputError& e) {
        throw InputError(path + ": " + e.what());
    }
}

std::string confined_path(const std::string& root, const std::string& relative) {
    namespace fs = std::filesystem;
    const std::string quoted = "\"" + relative + "\"";
    if (relative.empty()) throw InputError("an empty path");
    const fs::path rel(relative);
    if (rel.is_absolute()) throw InputError(quoted + " is an absolute path; paths must lie inside " + root);
    for (const fs::path& part : rel)
        if (part == "..") throw InputError(quoted + " climbs out with \"..\"; paths must lie inside " + root);
    char buf[PATH_MAX];
    if (!::realpath(root.c_str(), buf)) throw InputError(sys_error(root + " cannot be resolved"));
    const std::string real_root = buf;
    const std::string joined = real_root + "/" + relative;
    if (!::realpath(joined.c_str(), buf)) throw InputError(sys_error(quoted + " cannot be opened"));
    const std::string real = buf;
    const std::string prefix = real_root == "/" ? "/" : real_root + "/";
    if (real.compare(0, prefix.size(), prefix) != 0 || real.size() == prefix.size())
        throw InputError(quoted + " leads out of " + root + " (through a symbolic link); paths must lie inside it");
    return real;
}

std::string printable(const std::string& s, bool keep_lines) {
    std::string out;
    out.reserve(s.size());
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if ((c < 0x20 || c == 0x7f) && !(keep_lines && (c == '\n' || c == '\t'))) {
            static const char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        } else {
            out += ch;
        }
    }
    return out;
}

} // namespace kvc::harness
