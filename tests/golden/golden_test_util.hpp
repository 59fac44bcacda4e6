// Shared by the golden tests: where the committed files are, and reading them.
#pragma once

#include "kvcheck/golden/golden.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

namespace golden_test {

inline std::filesystem::path golden_dir() { return KVCHECK_GOLDEN_DIR; }

inline std::string read(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

inline void write(const std::filesystem::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << text;
}

// A scratch copy of the golden files, removed at the end of the test.
class ScratchDir {
public:
    explicit ScratchDir(const std::string& name)
        : path_(std::filesystem::temp_directory_path() / ("kvcheck-golden-" + name + "-" + std::to_string(::getpid()))) {
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
        for (const auto& f : kvc::golden::golden_files(golden_dir()))
            std::filesystem::copy_file(f, path_ / f.filename());
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

} // namespace golden_test
