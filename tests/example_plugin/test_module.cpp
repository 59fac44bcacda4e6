// The loadable module, used the way a harness uses a third party's plugin: dlopen, dlsym(KVC_ENTRY_SYMBOL), and
// nothing else. Also checks that the module exports only that symbol.
#include "rig.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#ifndef KVC_EXAMPLE_MODULE_PATH
#error "KVC_EXAMPLE_MODULE_PATH must name the built module (tests/example_plugin/CMakeLists.txt sets it)"
#endif

namespace kvc_example_test {
namespace {

class Module : public ::testing::Test {
protected:
    void SetUp() override {
        handle_ = dlopen(KVC_EXAMPLE_MODULE_PATH, RTLD_NOW | RTLD_LOCAL);
        ASSERT_NE(handle_, nullptr) << "dlopen(" << KVC_EXAMPLE_MODULE_PATH << "): " << dlerror();
    }
    void TearDown() override {
        if (handle_) dlclose(handle_);
    }
    kvc_entry_fn entry() { return reinterpret_cast<kvc_entry_fn>(dlsym(handle_, KVC_ENTRY_SYMBOL)); }

    void* handle_ = nullptr;
};

TEST_F(Module, ExportsTheEntrySymbol) {
    const kvc_entry_fn fn = entry();
    ASSERT_NE(fn, nullptr) << KVC_ENTRY_SYMBOL << " not found: " << dlerror();
    EXPECT_EQ(fn(KVC_ABI_VERSION_MAJOR + 1, 0), nullptr);
    const kvc_plugin_api* api = fn(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    ASSERT_NE(api, nullptr);
    EXPECT_STREQ(api->name, "example-c");
    EXPECT_EQ(api->struct_size, sizeof(kvc_plugin_api));
}

// Hidden visibility: the implementation's own names stay inside the module.
TEST_F(Module, ExportsNothingElse) {
    for (const char* name : {"kvc_example_entry", "kvc_example_f32_to_f16", "kvc_example_f16_to_f32",
                             "kvc_example_f32_to_bf16", "kvc_example_bf16_to_f32"})
        EXPECT_EQ(dlsym(handle_, name), nullptr) << name << " is exported";
}

// The module works end to end: the same checks as the statically linked plugin, through the loaded table.
TEST_F(Module, PassesASmokeRunThroughTheLoadedTable) {
    const kvc_entry_fn fn = entry();
    ASSERT_NE(fn, nullptr);
    const kvc_plugin_api* api = fn(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    ASSERT_NE(api, nullptr);
    EXPECT_NE(api, example_api()); // really the module's copy, not the one linked into this test
    Shape s;
    s.dtype = KVC_DTYPE_BF16;
    s.rope = KVC_ROPE_GPTJ;
    {
        Rig rig(s, 41, api);
        rig.append_and_check(0, 0, 6);
        rig.append_and_check(0, 0, 1);
        rig.append_and_check(0, 0, 3);
        rig.cache().fork(0, 1);
        rig.model().fork(0, 1);
        rig.append_and_check(1, 0, 2);
        rig.check_readback(0, 0);
        rig.check_readback(1, 0);
        rig.check_memory();
    }
    kvc_config bad = s.config();
    bad.n_q_heads = 3;
    kvc_cache* cache = nullptr;
    EXPECT_EQ(api->create(&bad, &cache), KVC_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(api->last_error(nullptr)).find("multiple"), std::string::npos);
}

} // namespace
} // namespace kvc_example_test
