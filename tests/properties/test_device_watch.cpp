// NO-Q and MEMORY for DEVICE caches (issue 9, "the harness, for any GPU cache"): the allocator watch reads device
// memory through the CUDA runtime loaded at run time (properties/src/device_watch.cpp). Without a GPU, ctest points
// KVCHECK_CUDART at a fake runtime (tests/doubles/fake_cudart.c: a counter behind cudaMemGetInfo, 2 MiB pages, a
// 512 MiB context) and fake DEVICE caches allocate through it (tests/doubles/fake_device_cache.c).
#include "doubles.hpp"
#include "kvcheck/properties/device_watch.hpp"

#include <cstdlib>
#include <string>

namespace {

using namespace kvc::prop;
using kvc::testing::expect_caught_only_by;
using kvc::testing::first_failure;
using kvc::testing::load_implementation;

const char* fake_runtime() {
    const char* p = std::getenv("KVCHECK_CUDART");
    return p != nullptr && *p != '\0' ? p : nullptr;
}

// Sets an environment variable for one scope (the watch reads KVCHECK_CUDART at every session).
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old, had_ = true;
        setenv(name, value, 1);
    }
    ~ScopedEnv() {
        if (had_)
            setenv(name_, old_.c_str(), 1);
        else
            unsetenv(name_);
    }

private:
    const char* name_;
    std::string old_;
    bool had_ = false;
};

class DeviceWatchTest : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_NE(fake_runtime(), nullptr) << "run through ctest: it sets KVCHECK_CUDART to the fake CUDA runtime";
    }
};

// First in this file on purpose: the fake charges its 512 MiB context to the first runtime call of the process. The
// watch reads before create(), so the context never counts as the cache's (it would exceed the 256 MiB a constant
// workspace may take and fail create).
TEST_F(DeviceWatchTest, AnHonestDeviceCachePassesNoQAndMemory) {
    const Target t = load_implementation("double-fake_device_honest");
    ASSERT_EQ(t.caps.memory_space, KVC_MEMORY_DEVICE);
    for (const char* id : {"NO-Q", "MEMORY", "EQUIV", "CACHE-CONTENT"}) {
        int passed = 0;
        const auto r = first_failure(t, id, 30, &passed);
        EXPECT_FALSE(r.has_value()) << id << ": " << (r ? r->reason : "");
        EXPECT_GT(passed, 0) << id;
    }
    // the verdict says what was watched
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    const CaseResult r = run_case(t, *find_property("NO-Q"), s, 3);
    ASSERT_EQ(r.verdict, Verdict::Pass) << r.reason;
    bool named = false;
    for (const std::string& n : r.notes) named = named || n.find("device memory (") != std::string::npos;
    EXPECT_TRUE(named) << "no note names the device-memory watch";
}

TEST_F(DeviceWatchTest, TheWatchReadsTheRuntimeNamedByKvcheckCudart) {
    std::string why;
    const auto w = DeviceWatch::open(&why);
    ASSERT_NE(w, nullptr) << why;
    EXPECT_EQ(w->library(), fake_runtime());
    EXPECT_GE(w->used(), int64_t{512} << 20); // the fake's context, at least
}

// Queries kept in device memory, never read again: invisible to the outputs, caught by the device watch.
TEST_F(DeviceWatchTest, AQueryKeeperInDeviceMemoryFailsNoQ) {
    expect_caught_only_by("fake_device_q_keeper", "NO-Q", {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY"});
    const auto r = first_failure(load_implementation("double-fake_device_q_keeper"), "NO-Q", 60);
    ASSERT_TRUE(r.has_value());
    EXPECT_NE(r->reason.find("device memory in use grew"), std::string::npos) << r->reason;
    EXPECT_NE(r->reason.find("hidden storage"), std::string::npos) << r->reason;
}

// Device blocks allocated as tokens arrive and reported nowhere: MEMORY (which watches device memory for DEVICE
// caches) and NO-Q both fail.
TEST_F(DeviceWatchTest, DeviceMemoryBeyondTheReportFailsMemoryAndNoQ) {
    expect_caught_only_by("fake_device_misreport", "MEMORY", {"EQUIV", "CACHE-CONTENT", "APPEND-ONLY"});
    const Target t = load_implementation("double-fake_device_misreport");
    const auto r = first_failure(t, "NO-Q", 60);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->failed_property, "NO-Q");
    EXPECT_NE(r->reason.find("device memory in use grew"), std::string::npos) << r->reason;
}

// What a check of the property returns when the watch cannot run: the reason, never a silent pass.
void expect_not_run(const char* double_name, const char* id, const std::string& words) {
    const Target t = load_implementation(std::string("double-") + double_name);
    const Property& p = *find_property(id);
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    s.cases = 6;
    for (int i = 0; i < s.cases; ++i) {
        const Case c = generate_case(p, s, i, &t.caps);
        const Outcome o = p.check(t, c);
        EXPECT_NE(o.not_run.find(words), std::string::npos) << id << "/" << i << ": not_run = '" << o.not_run << "'";
        bool noted = false;
        for (const std::string& n : o.notes) noted = noted || n.find(words) != std::string::npos;
        EXPECT_TRUE(noted) << id << "/" << i << ": the reason is not in the notes";
    }
}

TEST_F(DeviceWatchTest, WithoutARuntimeTheAllocatorHalfIsNotRunAndSaysWhy) {
    ScopedEnv env("KVCHECK_CUDART", "/nonexistent/libcudart.so.13");
    for (const char* id : {"NO-Q", "MEMORY"}) expect_not_run("fake_device_q_keeper", id, "cannot be loaded");
}

TEST_F(DeviceWatchTest, WithoutADeviceTheAllocatorHalfIsNotRunAndSaysWhy) {
    ScopedEnv env("FAKE_CUDA_NO_DEVICE", "1");
    for (const char* id : {"NO-Q", "MEMORY"})
        expect_not_run("fake_device_honest", id, "no CUDA-capable device is detected (100)");
}

// The verdict of such a case (runner.cpp turns Outcome::not_run into NOT_SUPPORTED with its reason): not a PASS.
TEST_F(DeviceWatchTest, WithoutARuntimeTheCaseIsNotSupportedNotPassed) {
    ScopedEnv env("KVCHECK_CUDART", "/nonexistent/libcudart.so.13");
    const Target t = load_implementation("double-fake_device_honest");
    RunSettings s;
    s.seed = kvc::testing::kDoublesSeed;
    for (const char* id : {"NO-Q", "MEMORY"}) {
        const CaseResult r = run_case(t, *find_property(id), s, 1);
        EXPECT_EQ(r.verdict, Verdict::NotSupported) << id << ": " << verdict_name(r.verdict) << " " << r.reason;
        EXPECT_NE(r.reason.find("device-memory watch could not run"), std::string::npos) << r.reason;
    }
}

// Properties that watch nothing are judged as usual without a runtime.
TEST_F(DeviceWatchTest, WithoutARuntimeOtherPropertiesStillRun) {
    ScopedEnv env("KVCHECK_CUDART", "/nonexistent/libcudart.so.13");
    const Target t = load_implementation("double-fake_device_honest");
    int passed = 0;
    EXPECT_FALSE(first_failure(t, "EQUIV", 6, &passed).has_value());
    EXPECT_GT(passed, 0);
}

} // namespace
