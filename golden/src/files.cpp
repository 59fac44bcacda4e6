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

// The commit record of a set: written (whole, by rename) after every temporary is durable and before the first rename;
// removed after the last. While it exists the set is decided to be the new one; the temporary it travels as ends in
// kTempSuffix, so an uncommitted one is removed with the other leftovers.
constexpr size_t kMaxJournalBytes = 1u << 20;

// Test hook (tests/golden/test_regen_safety.cpp): KVCHECK_TEST_REGEN_KILL_AT=N makes this process SIGKILL itself
// at step N of write_set (0, 1, ...), to prove that a kill at any step leaves the set all old or all new.
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

namespace {

// Writes text to dir/name through a temporary of ours, fsynced, renamed, directory fsynced.
std::string write_file_durably(const std::filesystem::path& dir, const std::string& name, const std::string& text) {
    const auto path = dir / name;
    const auto tmp = temp_for(path);
    ::unlink(tmp.c_str());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return sys_error("cannot create " + tmp.filename().string());
    std::string err = write_all(fd, text);
    if (::close(fd) != 0 && err.empty()) err = sys_error("close");
    if (err.empty() && ::rename(tmp.c_str(), path.c_str()) != 0) err = sys_error("rename");
    if (!err.empty()) {
        ::unlink(tmp.c_str());
        return "cannot write " + name + ": " + err;
    }
    return fsync_dir(dir);
}

// A target name as write_set records it: a plain golden file name in the directory itself.
bool plain_json_name(const std::string& name) {
    return name.size() > 5 && name[0] != '.' && name.find('/') == std::string::npos &&
           name.find('\0') == std::string::npos && name.compare(name.size() - 5, 5, ".json") == 0;
}

} // namespace

std::string write_set(const std::filesystem::path& dir, const std::vector<Rewrite>& rewrites) {
    int step = 0;
    std::vector<std::filesystem::path> temps;
    auto abandon = [&temps](const std::string& why) {
        for (const auto& t : temps) ::unlink(t.c_str());
        return why;
    };
    std::string journal;
    for (const Rewrite& r : rewrites) {
        if (r.target.parent_path() != dir || !plain_json_name(r.target.filename().string()))
            return abandon("internal: " + r.target.string() + " is not a golden file of " + dir.string());
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
        journal += r.target.filename().string() + "\n";
    }
    maybe_killed_at(step);
    if (std::string err = fsync_dir(dir); !err.empty()) return abandon(err);
    // The commit point: once the journal is in place the set is the new one, and an interrupted rename loop is
    // finished by the next regen (finish_interrupted); before it, the temporaries are only leftovers.
    if (std::string err = write_file_durably(dir, kJournalName, journal); !err.empty()) return abandon(err);
    for (size_t i = 0; i < rewrites.size(); ++i) {
        maybe_killed_at(step);
        if (::rename(temps[i].c_str(), rewrites[i].target.c_str()) != 0) {
            // The journal stays: the next regen finishes these renames or says why it cannot.
            return sys_error("cannot rename " + temps[i].filename().string()) +
                   " (the set is committed but not complete: run regen again to finish it)";
        }
    }
    maybe_killed_at(step);
    if (std::string err = fsync_dir(dir); !err.empty()) return err;
    maybe_killed_at(step);
    if (::unlink((dir / kJournalName).c_str()) != 0) return sys_error(std::string("cannot remove ") + kJournalName);
    return fsync_dir(dir);
}

std::string finish_interrupted(const std::filesystem::path& dir, std::vector<std::string>& finished) {
    finished.clear();
    const auto journal_path = dir / kJournalName;
    struct stat st{};
    if (::lstat(journal_path.c_str(), &st) != 0) {
        if (errno != ENOENT) return sys_error("cannot stat " + std::string(kJournalName));
        remove_leftover_temporaries(dir); // an uncommitted set: its temporaries are dropped, the old set stays
        return "";
    }
    const std::string refuse = std::string("an interrupted golden regen left ") + kJournalName + " in " +
                               dir.string() + ", and it ";
    if (!S_ISREG(st.st_mode) || static_cast<unsigned long long>(st.st_size) > kMaxJournalBytes)
        return refuse + "is not a regular file of at most 1 MiB: remove it by hand and run regen again";
    std::string text;
    if (std::string why = read_file(journal_path, text); !why.empty()) return refuse + "cannot be read: " + why;
    std::vector<std::string> names;
    size_t at = 0;
    while (at < text.size()) {
        const size_t nl = text.find('\n', at);
        if (nl == std::string::npos) return refuse + "is truncated: remove it by hand and run regen again";
        names.push_back(text.substr(at, nl - at));
        at = nl + 1;
    }
    for (const auto& name : names) {
        if (!plain_json_name(name))
            return refuse + "names \"" + name + "\", not a golden file: remove it by hand and run regen again";
        const auto target = dir / name;
        const auto tmp = temp_for(target);
        struct stat t{};
        if (::lstat(tmp.c_str(), &t) == 0) {
            if (!S_ISREG(t.st_mode))
                return refuse + "cannot be finished: " + tmp.filename().string() + " is not a regular file";
            if (::rename(tmp.c_str(), target.c_str()) != 0)
                return refuse + "cannot be finished: " + sys_error("rename " + tmp.filename().string());
            finished.push_back(name);
        } else if (::lstat(target.c_str(), &t) != 0) {
            return refuse + "names " + name + ", which is neither there nor staged: restore the set (git) and "
                   "remove the journal by hand";
        } // else: renamed before the interruption
    }
    if (std::string err = fsync_dir(dir); !err.empty()) return err;
    if (::unlink(journal_path.c_str()) != 0) return sys_error("cannot remove " + std::string(kJournalName));
    remove_leftover_temporaries(dir);
    return fsync_dir(dir);
}

bool interrupted_regen(const std::filesystem::path& dir) {
    struct stat st{};
    return ::lstat((dir / kJournalName).c_str(), &st) == 0;
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
        throw std::runtime_error(std::filesystem::exists(dir, ec)
                                     ? "the golden directory " + dir.string() + " is not a directory"
                                     : "golden directory not found: " + dir.string());
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
