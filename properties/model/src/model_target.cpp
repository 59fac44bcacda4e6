#include "kvcheck/model/model_target.hpp"

#include "lent.hpp" // properties/src: the operation level's lent buffers, one facility for both levels

#include <dlfcn.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>

namespace kvc::model {
namespace {

using prop::Lent;
using prop::LentCall;

struct Lending {
    const Lent* buffer;
    const void* input; // what the payload must still equal (const inputs); nullptr for outputs
};

// Throws LentViolation when the call did anything outside what it was lent: here, or (a served plugin, through the
// pipe proxy's model table) in the copies kvcheck serve-plugin lent it, which its reply reports (lent.hpp).
void check_lent(const char* call, std::initializer_list<Lending> lent) {
    const auto fail = [](const std::string& what) {
        throw LentViolation(what + ": an implementation may write only into the output buffers it is lent, "
                                   "within their size");
    };
    for (const Lending& l : lent) {
        std::size_t bytes = 0;
        const std::string what = l.buffer->violation(call, l.input, &bytes);
        if (!what.empty()) fail(what);
    }
    if (const prop::FarViolationSource far = prop::far_violation_source()) {
        const prop::FarViolation* v = nullptr;
        if (far(&v) > 0) fail(v[0].what);
    }
}

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
    kvcm_caps init{};
    init.struct_size = sizeof init;
    Lent caps("kvcm_caps", sizeof init, &init);
    {
        const LentCall naming("get_caps");
        api->get_caps(caps.as<kvcm_caps>());
    }
    std::size_t scribbled = 0;
    if (const std::string what = caps.violation("get_caps", nullptr, &scribbled); !what.empty())
        throw TargetMisbehaved("model table \"" + name + "\": " + what);
    std::memcpy(&t.caps_, caps.data(), sizeof t.caps_);
    if (t.caps_.struct_size < KVCM_CAPS_SIZE_1_0)
        throw TargetError("model table \"" + name + "\": get_caps filled a struct_size below ABI 1.0");
    if (t.caps_.struct_size < sizeof(kvcm_caps)) // an older table: what it does not know about is "not fixed"
        std::memset(reinterpret_cast<char*>(&t.caps_) + t.caps_.struct_size, 0,
                    sizeof(kvcm_caps) - t.caps_.struct_size);
    const auto fixed_ok = [](float v, float below) { return v == 0.0f || (std::isfinite(v) && v > 0.0f && v < below); };
    if (!fixed_ok(t.caps_.fixed_rope_theta, 3.0e38f) || !fixed_ok(t.caps_.fixed_rms_eps, 1.0f))
        throw TargetError("model table \"" + name + "\": get_caps fixes rope_theta " +
                          std::to_string(t.caps_.fixed_rope_theta) + " and rms_eps " +
                          std::to_string(t.caps_.fixed_rms_eps) +
                          ": a fixed value is 0 (not fixed) or finite and > 0 (rms_eps below 1)");
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
    const bool in_memory = path.empty();
    Lent d("kvcm_model_desc", sizeof desc_, &desc_);
    Lent bytes("weights", in_memory ? weights.size() : 0, in_memory ? weights.data() : nullptr);
    Lent file("weights path", in_memory ? 0 : path.size() + 1, in_memory ? nullptr : path.c_str());
    kvcm_weights w{};
    w.struct_size = sizeof w;
    w.format = format;
    if (in_memory) {
        w.data = bytes.data();
        w.size = weights.size();
    } else {
        w.path = file.as<const char>();
    }
    Lent lw("kvcm_weights", sizeof w, &w);
    kvcm_model* const none = nullptr;
    Lent out("create's out (kvcm_model*)", sizeof none, &none);
    kvc_status s;
    {
        const LentCall naming("create");
        s = target_.api()->create(d.as<const kvcm_model_desc>(), lw.as<const kvcm_weights>(), out.as<kvcm_model*>());
    }
    kvcm_model* made = nullptr;
    std::memcpy(&made, out.data(), sizeof made);
    try {
        check_lent("create", {{&d, &desc_},
                              {&lw, &w},
                              {&bytes, in_memory ? weights.data() : nullptr},
                              {&file, in_memory ? nullptr : path.c_str()},
                              {&out, nullptr}});
    } catch (const LentViolation&) {
        if (s == KVC_OK && made != nullptr) target_.api()->destroy(made);
        throw;
    }
    if (s != KVC_OK || made == nullptr) {
        const char* m = target_.api()->last_error(nullptr);
        throw CallError(s == KVC_OK ? KVC_ERR_INTERNAL : s, std::string("create: ") + (m ? m : "(no message)"));
    }
    model_ = made;
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
    const size_t count = rows * desc_.vocab_size;
    const std::vector<int32_t> t(tokens.begin(), tokens.end());
    Lent in("tokens", t.size() * sizeof(int32_t), t.data()), out("logits_out", count * sizeof(float));
    kvc_status s;
    {
        const LentCall naming("forward");
        s = target_.api()->forward(model_, seq, static_cast<uint32_t>(t.size()), in.as<const int32_t>(),
                                   out.as<float>());
    }
    check_lent("forward", {{&in, t.data()}, {&out, nullptr}});
    if (s != KVC_OK) fail(s, "forward(seq " + std::to_string(seq) + ", " + std::to_string(t.size()) + " tokens)");
    const float* logits = out.as<const float>();
    return std::vector<float>(logits, logits + count);
}

void Model::read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<float>& k,
                    std::vector<float>& v) {
    const size_t count = static_cast<size_t>(n) * desc_.n_kv_heads * desc_.head_dim;
    Lent ko("k_out", count * sizeof(float)), vo("v_out", count * sizeof(float));
    kvc_status s;
    {
        const LentCall naming("read_kv");
        s = target_.api()->read_kv(model_, seq, layer, pos, n, ko.data(), vo.data());
    }
    check_lent("read_kv", {{&ko, nullptr}, {&vo, nullptr}});
    if (s != KVC_OK) fail(s, "read_kv(seq " + std::to_string(seq) + ", layer " + std::to_string(layer) + ")");
    k.assign(ko.as<const float>(), ko.as<const float>() + count);
    v.assign(vo.as<const float>(), vo.as<const float>() + count);
}

kvc_status Model::try_read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n) {
    // room for one row more than asked: a call expected to be refused gets nowhere to scribble on but the guards
    const size_t bytes = static_cast<size_t>(n + 1) * desc_.n_kv_heads * desc_.head_dim * sizeof(float);
    Lent ko("k_out", bytes), vo("v_out", bytes);
    kvc_status s;
    {
        const LentCall naming("read_kv");
        s = target_.api()->read_kv(model_, seq, layer, pos, n, ko.data(), vo.data());
    }
    check_lent("read_kv", {{&ko, nullptr}, {&vo, nullptr}});
    return s;
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
    kvcm_memory init{};
    init.struct_size = sizeof init;
    Lent m("kvcm_memory", sizeof init, &init);
    kvc_status s;
    {
        const LentCall naming("memory");
        s = target_.api()->memory(model_, m.as<kvcm_memory>());
    }
    check_lent("memory", {{&m, nullptr}});
    if (s != KVC_OK) fail(s, "memory");
    kvcm_memory got;
    std::memcpy(&got, m.data(), sizeof got);
    return got;
}

uint64_t Model::kv_projections() {
    const uint64_t zero = 0;
    Lent out("kv_projections' out", sizeof zero, &zero);
    kvc_status s;
    {
        const LentCall naming("kv_projections");
        s = target_.api()->kv_projections(model_, out.as<uint64_t>());
    }
    check_lent("kv_projections", {{&out, nullptr}});
    if (s != KVC_OK) fail(s, "kv_projections");
    uint64_t n = 0;
    std::memcpy(&n, out.data(), sizeof n);
    return n;
}

} // namespace kvc::model
