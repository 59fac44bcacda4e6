#include "report.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace kvc::cli {

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
        std::string name;
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
                suites.push_back({several ? label + "." + prop : prop, {}, 0, 0, 0});
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

bool write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files, std::string& error) {
    // phase 1: every temporary file, complete; on any failure remove them all and touch no destination
    std::vector<std::string> written;
    const auto discard = [&] {
        for (const std::string& t : written) std::remove(t.c_str());
    };
    for (const auto& [path, content] : files) {
        const std::string tmp = path + ".tmp";
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f) {
            error = "cannot create " + tmp + ": " + std::strerror(errno);
            discard();
            return false;
        }
        written.push_back(tmp);
        f.write(content.data(), static_cast<std::streamsize>(content.size()));
        f.close();
        if (!f) {
            error = "cannot write " + tmp;
            discard();
            return false;
        }
    }
    // phase 2: renames (within one directory each, so each is atomic)
    for (size_t i = 0; i < files.size(); ++i)
        if (std::rename(written[i].c_str(), files[i].first.c_str()) != 0) {
            error = "cannot rename " + written[i] + " to " + files[i].first + ": " + std::strerror(errno);
            for (size_t j = i; j < written.size(); ++j) std::remove(written[j].c_str());
            return false;
        }
    return true;
}

bool write_file_atomically(const std::string& path, const std::string& content, std::string& error) {
    return write_files_atomically({{path, content}}, error);
}

bool can_create_file(const std::string& path, std::string& error) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path p(path);
    if (p.filename().empty()) {
        error = path + ": names a directory, not a file";
        return false;
    }
    if (fs::is_directory(p, ec)) {
        error = path + ": is a directory";
        return false;
    }
    const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    if (!fs::is_directory(dir, ec)) {
        error = path + ": directory " + dir.string() + " does not exist";
        return false;
    }
    if (access(dir.c_str(), W_OK) != 0) {
        error = path + ": directory " + dir.string() + " is not writable";
        return false;
    }
    return true;
}

} // namespace kvc::cli
