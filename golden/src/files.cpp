#include "files.hpp"

#include "kvcheck/golden/golden.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvc::golden {
namespace {

const std::string kTempSuffix = ".regen.tmp";

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

std::filesystem::path temp_for(const std::filesystem::path& target) {
    return target.parent_path() / ("." + target.filename().string() + kTempSuffix);
}

// Test hook (tests/golden/test_regen_atomic.cpp): KVCHECK_TEST_REGEN_KILL_AT=N makes this process SIGKILL itself
// at step N of write_set (0, 1, ...), to prove that a kill at any step leaves the set readable and recoverable.
void maybe_killed_at(int& step) {
    const char* at = std::getenv("KVCHECK_TEST_REGEN_KILL_AT");
    if (at && std::atoi(at) == step) std::raise(SIGKILL);
    ++step;
}

std::string write_all(int fd, const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return sys_error("write");
        done += static_cast<size_t>(n);
    }
    return ::fsync(fd) == 0 ? "" : sys_error("fsync");
}

std::string fsync_dir(const std::filesystem::path& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return sys_error("open " + dir.string());
    const bool ok = ::fsync(fd) == 0;
    const std::string err = ok ? "" : sys_error("fsync " + dir.string());
    ::close(fd);
    return err;
}

} // namespace

std::string read_file(const std::filesystem::path& path, std::string& text) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below as not a regular file.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return sys_error("cannot open the file");
    struct stat st{};
    std::string err;
    if (::fstat(fd, &st) != 0) err = sys_error("cannot stat the file");
    else if (!S_ISREG(st.st_mode)) err = "not a regular file";
    else if (static_cast<unsigned long long>(st.st_size) > kMaxGoldenBytes) err = "larger than 16 MiB: not a golden file";
    text.clear();
    char buf[65536];
    while (err.empty()) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) err = sys_error("cannot read the file");
        if (n <= 0) break;
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > kMaxGoldenBytes) err = "larger than 16 MiB: not a golden file"; // it grew while read
    }
    ::close(fd);
    return err;
}

std::string replace_refusal(const std::filesystem::path& path) {
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0) return sys_error("cannot stat the file");
    if (S_ISLNK(st.st_mode)) return "is a symbolic link: regen replaces only regular files (edit the link's target)";
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    if ((st.st_mode & S_IWUSR) == 0 || ::access(path.c_str(), W_OK) != 0)
        return "read-only: regen does not replace a protected file (make it writable first)";
    return "";
}

std::string write_set(const std::filesystem::path& dir, const std::vector<Rewrite>& rewrites) {
    int step = 0;
    std::vector<std::filesystem::path> temps;
    auto abandon = [&temps](const std::string& why) {
        for (const auto& t : temps) ::unlink(t.c_str());
        return why;
    };
    for (const Rewrite& r : rewrites) {
        maybe_killed_at(step);
        struct stat st{};
        const mode_t mode = ::stat(r.target.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
        const auto tmp = temp_for(r.target);
        ::unlink(tmp.c_str()); // a leftover of ours; O_EXCL below refuses anything that appears meanwhile
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd < 0) return abandon(sys_error("cannot create " + tmp.filename().string()));
        temps.push_back(tmp);
        const std::string err = write_all(fd, r.text);
        if (::close(fd) != 0 && err.empty()) return abandon(sys_error("cannot write " + tmp.filename().string()));
        if (!err.empty()) return abandon("cannot write " + tmp.filename().string() + ": " + err);
    }
    maybe_killed_at(step);
    if (std::string err = fsync_dir(dir); !err.empty()) return abandon(err);
    for (size_t i = 0; i < rewrites.size(); ++i) {
        maybe_killed_at(step);
        if (::rename(temps[i].c_str(), rewrites[i].target.c_str()) != 0) {
            // Some files are new already: the set is mixed (verify reports them stale), never torn.
            return abandon(sys_error("cannot rename " + temps[i].filename().string()) +
                           " (the files before it were rewritten: run regen again)");
        }
    }
    maybe_killed_at(step);
    return fsync_dir(dir);
}

std::vector<std::string> remove_leftover_temporaries(const std::filesystem::path& dir) {
    std::vector<std::string> removed;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        const bool ours = name.size() > kTempSuffix.size() + 1 && name[0] == '.' &&
                          name.compare(name.size() - kTempSuffix.size(), kTempSuffix.size(), kTempSuffix) == 0;
        if (ours && e.is_regular_file(ec) && !e.is_symlink(ec) && ::unlink(e.path().c_str()) == 0)
            removed.push_back(name);
    }
    std::sort(removed.begin(), removed.end());
    return removed;
}

std::vector<std::filesystem::path> golden_files(const std::filesystem::path& dir) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
        throw std::runtime_error("golden directory not found: " + dir.string());
    // Everything named *.json but directories: a symlink, FIFO or device named like a golden file is reported by
    // verify and refused by regen, not skipped in silence.
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        std::error_code type_ec;
        if (e.path().extension() == ".json" && !e.is_directory(type_ec)) files.push_back(e.path());
    }
    if (ec) throw std::runtime_error("cannot list golden directory " + dir.string() + ": " + ec.message());
    if (files.empty()) throw std::runtime_error("no golden files (*.json) in " + dir.string());
    std::sort(files.begin(), files.end());
    return files;
}

} // namespace kvc::golden
