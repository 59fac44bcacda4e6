#include "kvcheck/model/model_target.hpp"

#include <dlfcn.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

namespace kvc::model {
namespace {

// The members ABI 1.0 requires, and the feature each optional one is declared by.
bool has_member(const kvcm_model_api* api, size_t offset, size_t size, const void* value) {
    return api->struct_size >= offset + size && value != nullptr;
}

} // namespace

ModelTarget ModelTarget::checked(const kvcm_model_api* api, std::shared_ptr<void> handle) {
    if (api == nullptr) throw TargetError("the model entry returned NULL (it does not serve model ABI 1.0)");
    if (api->struct_size < offsetof(kvcm_model_api, get_caps) || api->abi_major != KVCM_ABI_VERSION_MAJOR)
        throw TargetError("model table of ABI " + std::to_string(api->abi_major) + "." +
                          std::to_string(api->abi_minor) + ": the harness speaks " +
                          std::to_string(KVCM_ABI_VERSION_MAJOR) + ".x");
    if (api->name == nullptr || api->version == nullptr) throw TargetError("model table: name or version is NULL");
    const std::string name = api->name;
#define KVCM_REQUIRE(m)                                                                                          \
    if (!has_member(api, offsetof(kvcm_model_api, m), sizeof api->m, reinterpret_cast<const void*>(api->m)))     \
        throw TargetError("model table \"" + name + "\": required member " #m " is missing");
    KVCM_REQUIRE(get_caps)
    KVCM_REQUIRE(create)
    KVCM_REQUIRE(destroy)
    KVCM_REQUIRE(last_error)
    KVCM_REQUIRE(forward)
    KVCM_REQUIRE(memory)
#undef KVCM_REQUIRE
    ModelTarget t;
    t.api_ = api;
    t.handle_ = std::move(handle);
    t.name_ = name;
    t.caps_.struct_size = sizeof t.caps_;
    api->get_caps(&t.caps_);
    if (t.caps_.struct_size < sizeof(kvcm_caps))
        throw TargetError("model table \"" + name + "\": get_caps filled a struct_size below ABI 1.0");
    const struct {
        uint32_t feature;
        bool present;
        const char* member;
    } optional[] = {
        {KVCM_FEATURE_READ_KV, KVCM_API_HAS(api, read_kv), "read_kv"},
        {KVCM_FEATURE_FORK, KVCM_API_HAS(api, fork), "fork"},
        {KVCM_FEATURE_RELEASE, KVCM_API_HAS(api, release), "release"},
        {KVCM_FEATURE_KV_PROJECTIONS, KVCM_API_HAS(api, kv_projections), "kv_projections"},
    };
    for (const auto& o : optional)
        if (t.has(o.feature) && !o.present)
            throw TargetError("model table \"" + name + "\": declares the feature of " + o.member +
                              " but leaves the member NULL");
    if (t.caps_.weight_formats == 0) throw TargetError("model table \"" + name + "\": accepts no weight format");
    if ((t.caps_.cache_dtypes & (1u << KVC_DTYPE_F32)) == 0)
        throw TargetError("model table \"" + name + "\": the properties of model ABI 1.0 need an f32 cache");
    if (!t.has(KVCM_FEATURE_TIED) && !t.has(KVCM_FEATURE_UNTIED))
        throw TargetError("model table \"" + name + "\": supports neither a tied nor a separate classifier");
    return t;
}

ModelTarget ModelTarget::from_entry(kvcm_entry_fn entry) {
    return checked(entry(KVCM_ABI_VERSION_MAJOR, KVCM_ABI_VERSION_MINOR), nullptr);
}

ModelTarget ModelTarget::from_library(const std::string& path) {
    // RTLD_NODELETE, as properties/src/target.cpp: threads the library keeps must not run unmapped code
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h == nullptr) {
        const char* e = dlerror();
        throw TargetError("cannot load " + path + ": " + (e ? e : "unknown error"));
    }
    std::shared_ptr<void> handle(h, [](void* p) { dlclose(p); });
    void* sym = dlsym(h, KVCM_ENTRY_SYMBOL);
    if (sym == nullptr) throw TargetError(path + " does not export " KVCM_ENTRY_SYMBOL);
    kvcm_entry_fn entry = nullptr;
    static_assert(sizeof entry == sizeof sym, "function and object pointers differ in size");
    std::memcpy(&entry, &sym, sizeof entry);
    return checked(entry(KVCM_ABI_VERSION_MAJOR, KVCM_ABI_VERSION_MINOR), std::move(handle));
}

bool ModelTarget::library_exports_model_entry(const std::string& path) {
    // its constructors run here too, and may start threads: never unmapped (RTLD_NODELETE)
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h == nullptr) return false;
    const bool found = dlsym(h, KVCM_ENTRY_SYMBOL) != nullptr;
    dlclose(h);
    return found;
}

Model::Model(const ModelTarget& target, const kvcm_model_desc& desc, uint32_t format, const std::string& weights,
             const std::string& path)
    : target_(target), desc_(desc) {
    kvcm_weights w{};
    w.struct_size = sizeof w;
    w.format = format;
    if (path.empty()) {
        w.data = weights.data();
        w.size = weights.size();
    } else {
        w.path = path.c_str();
    }
    const kvc_status s = target_.api()->create(&desc_, &w, &model_);
    if (s != KVC_OK || model_ == nullptr) {
        const char* m = target_.api()->last_error(nullptr);
        throw CallError(s == KVC_OK ? KVC_ERR_INTERNAL : s, std::string("create: ") + (m ? m : "(no message)"));
    }
}

Model::~Model() {
    if (model_ != nullptr) target_.api()->destroy(model_);
}

void Model::fail(kvc_status s, const std::string& call) {
    const char* m = target_.api()->last_error(model_);
    throw CallError(s, call + ": " + (m ? m : "(no message)"));
}

std::vector<float> Model::forward(uint32_t seq, const std::vector<int>& tokens) {
    const size_t rows = target_.has(KVCM_FEATURE_ALL_LOGITS) ? tokens.size() : 1;
    std::vector<float> logits(rows * desc_.vocab_size, std::numeric_limits<float>::quiet_NaN());
    const std::vector<int32_t> t(tokens.begin(), tokens.end());
    const kvc_status s = target_.api()->forward(model_, seq, static_cast<uint32_t>(t.size()), t.data(), logits.data());
    if (s != KVC_OK) fail(s, "forward(seq " + std::to_string(seq) + ", " + std::to_string(t.size()) + " tokens)");
    return logits;
}

void Model::read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<float>& k,
                    std::vector<float>& v) {
    const size_t count = static_cast<size_t>(n) * desc_.n_kv_heads * desc_.head_dim;
    k.assign(count, std::numeric_limits<float>::quiet_NaN());
    v.assign(count, std::numeric_limits<float>::quiet_NaN());
    const kvc_status s = target_.api()->read_kv(model_, seq, layer, pos, n, k.data(), v.data());
    if (s != KVC_OK) fail(s, "read_kv(seq " + std::to_string(seq) + ", layer " + std::to_string(layer) + ")");
}

kvc_status Model::try_read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n) {
    std::vector<float> k(static_cast<size_t>(n + 1) * desc_.n_kv_heads * desc_.head_dim), v(k.size());
    return target_.api()->read_kv(model_, seq, layer, pos, n, k.data(), v.data());
}

void Model::fork(uint32_t parent, uint32_t child) {
    const kvc_status s = target_.api()->fork(model_, parent, child);
    if (s != KVC_OK) fail(s, "fork(" + std::to_string(parent) + " -> " + std::to_string(child) + ")");
}

void Model::release(uint32_t seq) {
    const kvc_status s = try_release(seq);
    if (s != KVC_OK) fail(s, "release(" + std::to_string(seq) + ")");
}

kvc_status Model::try_release(uint32_t seq) { return target_.api()->release(model_, seq); }

kvcm_memory Model::memory() {
    kvcm_memory m{};
    m.struct_size = sizeof m;
    const kvc_status s = target_.api()->memory(model_, &m);
    if (s != KVC_OK) fail(s, "memory");
    return m;
}

uint64_t Model::kv_projections() {
    uint64_t n = 0;
    const kvc_status s = target_.api()->kv_projections(model_, &n);
    if (s != KVC_OK) fail(s, "kv_projections");
    return n;
}

} // namespace kvc::model
