// What every end-to-end test of the kvcheck binary needs, in one place: a fresh working directory per test, the
// binary run through the shell there with its exit status and output captured, and shell quoting.
// KVC_TEST_KVCHECK=PATH (environment) runs the tests against another kvcheck build, e.g. an older one, which is how
// the hostile-input tests were shown to fail before their fixes.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kvc::cli_test {

namespace fs = std::filesystem;

inline std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

inline std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

struct Outcome {
    int rc = -1; // the exit status, or 128 + the signal that ended kvcheck
    std::string out, err;
    std::string all() const { return out + err; }
};

// A fresh, empty directory under root, named prefix + the running test's name; tests can run in parallel.
inline fs::path fresh_test_dir(const fs::path& root, const std::string& prefix = "") {
    const fs::path dir = root / (prefix + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

// Runs `kvcheck ARGS` with dir as its working directory, after the environment assignments in env ("A=1 B=2 ").
// stdout and stderr go to files in dir and come back in the Outcome. validate and replay get a generous per-case
// timeout unless ARGS sets one, so that only the timeout tests depend on time.
inline Outcome run_kvcheck(const fs::path& dir, std::string args, const std::string& env = "") {
    const bool runs_cases = args.rfind("validate", 0) == 0 || args.rfind("replay", 0) == 0;
    if (runs_cases && args.find("--timeout") == std::string::npos) args += " --timeout 600";
    const char* other = std::getenv("KVC_TEST_KVCHECK");
    const std::string binary = other && *other ? other : KVC_CLI_BINARY;
    const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
    const std::string cmd = "cd " + quote(dir.string()) + " && " + env + quote(binary) + " " + args + " >" +
                            quote(out.string()) + " 2>" + quote(err.string());
    const int status = std::system(cmd.c_str());
    Outcome r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
}

} // namespace kvc::cli_test
