#include "kvcheck/harness/report.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdlib>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace kvc::harness {

std::string dump_json(const nlohmann::json& j, int indent) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD"; // U+FFFD

// Length of the valid UTF-8 sequence starting at s[i] that XML 1.0 may carry, or 0.
std::size_t xml_char_length(const std::string& s, std::size_t i) {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return (c >= 0x20 || c == '\t' || c == '\n' || c == '\r') ? 1 : 0;
    std::size_t n = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07;
    else return 0;
    if (i + n > s.size()) return 0;
    for (std::size_t k = 1; k < n; ++k) {
        if ((b(i + k) & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (b(i + k) & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFFFE || cp == 0xFFFF) return 0;
    return n;
}

std::string text_of(const nlohmann::json& c, const char* key) {
    return c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : std::string();
}

// The body of a <failure> or <error>: what a CI page should show without opening the JSON.
std::string failure_body(const nlohmann::json& c) {
    std::ostringstream s;
    s << text_of(c, "verdict") << ": " << text_of(c, "reason") << "\n";
    if (c.contains("mismatch")) s << "first mismatch: " << text_of(c["mismatch"], "text") << "\n";
    if (c.contains("counterexample_text")) s << "counterexample:\n" << text_of(c, "counterexample_text");
    if (c.contains("replay_command")) s << "replay: " << text_of(c, "replay_command") << "\n";
    if (c.contains("implementation_output"))
        s << "the implementation wrote:\n" << text_of(c, "implementation_output") << "\n";
    return s.str();
}

} // namespace

std::string xml_escape(const std::string& s, bool attribute) {
    std::string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = xml_char_length(s, i);
        if (n == 0) {
            out += kReplacement;
            ++i;
            continue;
        }
        if (n > 1) {
            out.append(s, i, n);
            i += n;
            continue;
        }
        const char c = s[i++];
        switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += attribute ? "&quot;" : "\""; break;
        case '\'': out += attribute ? "&apos;" : "'"; break;
        case '\n': out += attribute ? "&#10;" : "\n"; break;
        case '\r': out += "&#13;"; break;
        case '\t': out += attribute ? "&#9;" : "\t"; break;
        default: out += c;
        }
    }
    return out;
}

std::string junit_from_report(const nlohmann::json& report) {
    struct Suite {
        std::string name, level; // level: "operation" or "model" (reports before levels: none)
        std::vector<const nlohmann::json*> cases;
        int failures = 0, errors = 0, skipped = 0;
    };
    std::vector<Suite> suites;
    const auto& impls = report.at("implementations");
    const bool several = impls.size() > 1;
    for (const auto& impl : impls) {
        const std::string label = impl.value("label", impl.value("name", std::string("implementation")));
        std::map<std::string, std::size_t> index; // property -> suite
        for (const auto& c : impl.at("cases")) {
            const std::string prop = text_of(c, "property");
            auto it = index.find(prop);
            if (it == index.end()) {
                it = index.emplace(prop, suites.size()).first;
                suites.push_back(
                    {several ? label + "." + prop : prop, c.value("level", std::string()), {}, 0, 0, 0});
            }
            Suite& s = suites[it->second];
            s.cases.push_back(&c);
            const std::string v = text_of(c, "verdict");
            if (v == "FAIL") ++s.failures;
            else if (v == "ERROR" || v == "CRASH" || v == "TIMEOUT") ++s.errors;
            else if (v == "NOT_SUPPORTED") ++s.skipped;
        }
    }
    int tests = 0, failures = 0, errors = 0, skipped = 0;
    for (const Suite& s : suites) {
        tests += static_cast<int>(s.cases.size());
        failures += s.failures;
        errors += s.errors;
        skipped += s.skipped;
    }
    const auto a = [](const std::string& x) { return xml_escape(x, true); };
    const auto t = [](const std::string& x) { return xml_escape(x, false); };
    const nlohmann::json& run = report.at("run");
    std::ostringstream x;
    x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    x << "<testsuites name=\"kvcheck\" tests=\"" << tests << "\" failures=\"" << failures << "\" errors=\"" << errors
      << "\" skipped=\"" << skipped << "\" time=\"0\">\n";
    for (const Suite& s : suites) {
        x << "  <testsuite name=\"" << a(s.name) << "\" tests=\"" << s.cases.size() << "\" failures=\""
          << s.failures << "\" errors=\"" << s.errors << "\" skipped=\"" << s.skipped << "\" time=\"0\">\n";
        x << "    <properties>\n";
        x << "      <property name=\"seed\" value=\"" << run.value("seed", uint64_t{0}) << "\"/>\n";
        x << "      <property name=\"profile\" value=\"" << a(run.value("profile", std::string())) << "\"/>\n";
        x << "      <property name=\"kvcheck_version\" value=\"" << a(report.value("suite_version", std::string()))
          << "\"/>\n";
        if (!s.level.empty()) x << "      <property name=\"level\" value=\"" << a(s.level) << "\"/>\n";
        x << "    </properties>\n";
        for (const nlohmann::json* cp : s.cases) {
            const nlohmann::json& c = *cp;
            const std::string v = text_of(c, "verdict");
            x << "    <testcase name=\"" << a(text_of(c, "id")) << "\" classname=\"" << a("kvcheck." + s.name)
              << "\" time=\"0\"";
            if (v == "PASS") {
                x << "/>\n";
                continue;
            }
            x << ">\n";
            if (v == "FAIL")
                x << "      <failure message=\"" << a(text_of(c, "reason")) << "\" type=\"FAIL\">" << t(failure_body(c))
                  << "</failure>\n";
            else if (v == "ERROR" || v == "CRASH" || v == "TIMEOUT")
                x << "      <error message=\"" << a(text_of(c, "reason")) << "\" type=\"" << a(v) << "\">"
                  << t(failure_body(c)) << "</error>\n";
            else if (v == "NOT_SUPPORTED")
                x << "      <skipped message=\"" << a(text_of(c, "reason")) << "\"/>\n";
            else { // QUALITY_WARNING: a pass, with the warning where CI shows test output
                std::string out = v + ": " + text_of(c, "reason") + "\n";
                if (c.contains("notes"))
                    for (const auto& n : c["notes"]) out += n.get<std::string>() + "\n";
                x << "      <system-out>" << t(out) << "</system-out>\n";
            }
            x << "    </testcase>\n";
        }
        x << "  </testsuite>\n";
    }
    x << "</testsuites>\n";
    return x.str();
}

namespace {

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

// The temporary of a destination: hidden, beside it (a rename within one directory is atomic), named after it so
// the next write of the same destination removes what a killed run left.
std::string temp_for(const std::string& path) {
    const std::filesystem::path p(path);
    return (p.parent_path() / ("." + p.filename().string() + ".kvcheck-tmp")).string();
}

std::string dir_of(const std::string& path) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    return parent.empty() ? "." : parent.string();
}

// Test hook (tests/cli/test_hostile_files.cpp): KVCHECK_TEST_REPORT_KILL_AT=N makes the process SIGKILL itself at
// step N (0, 1, ...) of write_files_atomically, to prove that a kill at any step leaves no half-written file and no
// old/new mixture.
void maybe_killed_at(int& step) {
    const char* at = std::getenv("KVCHECK_TEST_REPORT_KILL_AT");
    if (at && std::atoi(at) == step) std::raise(SIGKILL);
    ++step;
}

// Writes a complete temporary and (Flush::Now) flushes it to disk; "" or the error.
std::string write_temp(const std::string& tmp, const std::string& content, Flush flush) {
    ::unlink(tmp.c_str()); // a leftover of a killed run of ours; O_EXCL refuses anything that appears meanwhile
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) return sys_error("cannot create " + tmp);
    std::size_t done = 0;
    std::string err;
    while (done < content.size() && err.empty()) {
        const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) err = sys_error("cannot write " + tmp);
        else done += static_cast<std::size_t>(n);
    }
    if (err.empty() && flush == Flush::Now && ::fsync(fd) != 0) err = sys_error("cannot flush " + tmp);
    if (::close(fd) != 0 && err.empty()) err = sys_error("cannot write " + tmp);
    if (!err.empty()) ::unlink(tmp.c_str());
    return err;
}

void fsync_dir(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd); // best effort: the renames themselves are already atomic
    ::close(fd);
}

// "" when path is absent or a regular file (not a symbolic link); what it is otherwise.
std::string not_replaceable(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "" : sys_error(path);
    if (S_ISLNK(st.st_mode)) return path + ": is a symbolic link; kvcheck replaces only regular files";
    if (S_ISDIR(st.st_mode)) return path + ": is a directory";
    if (!S_ISREG(st.st_mode))
        return path + ": exists and is not a regular file (a FIFO, socket or device); kvcheck replaces only "
                      "regular files";
    return "";
}

} // namespace

namespace {

bool write_all_atomically(const std::vector<std::pair<std::string, std::string>>& files, std::string& error,
                          Flush flush) {
    int step = 0;
    std::vector<std::string> temps;
    const auto discard = [&] {
        for (const std::string& t : temps) ::unlink(t.c_str());
    };
    for (const auto& f : files)
        if (std::string why = not_replaceable(f.first); !why.empty()) {
            error = why;
            return false;
        }
    // phase 1: every temporary, complete and on disk; on any failure remove them all and touch no destination
    for (const auto& [path, content] : files) {
        maybe_killed_at(step);
        const std::string tmp = temp_for(path);
        if (std::string err = write_temp(tmp, content, flush); !err.empty()) {
            error = err;
            discard();
            return false;
        }
        temps.push_back(tmp);
    }
    maybe_killed_at(step);
    // phase 2: the first file is the commit mark. With several files it is removed first and renamed last, so
    // whenever it exists the others beside it are of the same run: a kill in between leaves the pair without its
    // first file (never a new JSON beside an old XML). A reader trusts the others only when the first is there.
    if (files.size() > 1 && ::unlink(files[0].first.c_str()) != 0 && errno != ENOENT) {
        error = sys_error("cannot replace " + files[0].first);
        discard();
        return false;
    }
    for (std::size_t k = 1; k <= files.size(); ++k) {
        const std::size_t i = k % files.size(); // 1, 2, ..., then 0 last
        maybe_killed_at(step);
        if (::rename(temps[i].c_str(), files[i].first.c_str()) != 0) {
            error = sys_error("cannot rename " + temps[i] + " to " + files[i].first);
            discard();
            return false;
        }
        temps[i].clear(); // renamed: nothing to discard
    }
    maybe_killed_at(step);
    if (flush == Flush::Now)
        for (const auto& f : files) fsync_dir(dir_of(f.first));
    return true;
}

} // namespace

bool write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files, std::string& error) {
    return write_all_atomically(files, error, Flush::Now);
}

bool write_file_atomically(const std::string& path, const std::string& content, std::string& error, Flush flush) {
    return write_all_atomically({{path, content}}, error, flush);
}

bool flush_filesystem(const std::string& dir, std::string& error) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        error = sys_error("cannot open " + dir);
        return false;
    }
    const bool ok = ::syncfs(fd) == 0;
    if (!ok) error = sys_error("cannot flush the files written to " + dir);
    ::close(fd);
    return ok;
}

bool can_create_file(const std::string& path, std::string& error) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path p(path);
    if (p.filename().empty() || p.filename() == "." || p.filename() == "..") {
        error = path + ": names a directory, not a file";
        return false;
    }
    if (std::string why = not_replaceable(path); !why.empty()) { // a FIFO, device or symlink is never replaced
        error = why;
        return false;
    }
    // The rule of golden regen: a file its owner protected is not replaced, even by one who may (root)
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && ((st.st_mode & S_IWUSR) == 0 || access(path.c_str(), W_OK) != 0)) {
        error = path + ": is read-only; kvcheck does not replace a protected file (make it writable first)";
        return false;
    }
    // write_temp() removes a file left where the temporary goes, but not a directory, which would otherwise fail the
    // write only after the whole run
    if (const std::string tmp = temp_for(path); ::lstat(tmp.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        error = path + ": " + tmp + " is a directory in the way of the temporary kvcheck writes first (remove it)";
        return false;
    }
    const fs::path dir = dir_of(path);
    if (!fs::is_directory(dir, ec)) {
        error = path + ": directory " + dir.string() + " does not exist";
        return false;
    }
    if (access(dir.c_str(), W_OK | X_OK) != 0) {
        error = path + ": directory " + dir.string() + " is not writable";
        return false;
    }
    return true;
}

bool same_file(const std::string& a, const std::string& b) {
    // identity, not spelling: ./a.json, a.json and dir/../a.json are one file; so are two hard links
    struct stat sa {}, sb {};
    if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    const auto name = [](const std::string& path) {
        char buf[PATH_MAX];
        const std::filesystem::path p(path);
        const std::string dir = dir_of(path);
        const std::string parent = ::realpath(dir.c_str(), buf) ? std::string(buf) : dir;
        return parent + "/" + p.filename().string();
    };
    return name(a) == name(b);
}

bool check_output_files(const std::vector<std::pair<std::string, std::string>>& outputs, std::string& error) {
    for (const auto& [option, path] : outputs)
        if (!path.empty() && !can_create_file(path, error)) {
            error = option + " " + error;
            return false;
        }
    for (std::size_t i = 0; i < outputs.size(); ++i)
        for (std::size_t j = i + 1; j < outputs.size(); ++j)
            if (!outputs[i].second.empty() && !outputs[j].second.empty() &&
                same_file(outputs[i].second, outputs[j].second)) {
                error = outputs[i].first + " " + outputs[i].second + " and " + outputs[j].first + " " +
                        outputs[j].second + " are the same file";
                return false;
            }
    return true;
}

bool can_create_directory(const std::string& path, std::string& error) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path p = path.empty() ? fs::path(".") : fs::path(path);
    // the directory itself when it exists, else its nearest existing ancestor (create_directories makes the rest)
    while (!fs::exists(fs::symlink_status(p, ec)) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
    if (!fs::exists(fs::symlink_status(p, ec))) p = ".";
    if (!fs::is_directory(p, ec)) {
        error = path + ": " + p.string() + " exists and is not a directory";
        return false;
    }
    if (access(p.c_str(), W_OK | X_OK) != 0) {
        error = path + ": " + p.string() + " is not writable";
        return false;
    }
    return true;
}

} // namespace kvc::harness
