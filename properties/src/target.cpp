#include "kvcheck/properties/target.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/tolerance.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>

namespace kvc::prop {
namespace {

// get_caps with a guard zone after the kvc_caps it fills: a plugin built against a larger kvc_caps (or a careless
// one) writes past it, and that must be an error naming the overrun, not a harness scribbled on.
kvc_caps guarded_caps(const kvc_plugin_api* api, const std::string& origin) {
    constexpr unsigned char kGuard = 0xa5;
    struct {
        kvc_caps caps;
        unsigned char guard[1024];
    } buffer;
    std::memset(&buffer, kGuard, sizeof buffer);
    std::memset(&buffer.caps, 0, sizeof buffer.caps);
    buffer.caps.struct_size = sizeof buffer.caps;
    api->get_caps(&buffer.caps);
    std::size_t last = 0; // one past the last guard byte written
    for (std::size_t i = 0; i < sizeof buffer.guard; ++i)
        if (buffer.guard[i] != kGuard) last = i + 1;
    if (last)
        throw PluginMisbehaved(origin + ": get_caps wrote " + (last == sizeof buffer.guard ? "at least " : "") +
                               std::to_string(last) + " bytes past the end of the kvc_caps it was given (struct_size " +
                               std::to_string(sizeof buffer.caps) + ")");
    return buffer.caps;
}

} // namespace

Target target_from_entry(kvc_entry_fn entry, const std::string& origin) {
    const kvc_plugin_api* api = entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    if (api == nullptr)
        throw LoadError(origin + ": the entry point returned no function table (the plugin cannot serve ABI " +
                        std::to_string(KVC_ABI_VERSION_MAJOR) + "." + std::to_string(KVC_ABI_VERSION_MINOR) + ")");
    if (api->abi_major != KVC_ABI_VERSION_MAJOR)
        throw LoadError(origin + ": plugin speaks ABI major version " + std::to_string(api->abi_major) +
                        ", this kvcheck speaks " + std::to_string(KVC_ABI_VERSION_MAJOR) +
                        " (major versions are incompatible; rebuild the plugin against this kvcheck's abi.h)");
    // Version 1.0 members up to `release` must all be there; a table smaller than that is malformed.
    if (api->struct_size < offsetof(kvc_plugin_api, release) + sizeof(api->release))
        throw LoadError(origin + ": function table struct_size " + std::to_string(api->struct_size) +
                        " is smaller than ABI 1.0's");
    const char* missing = !api->get_caps ? "get_caps" : !api->create ? "create" : !api->destroy ? "destroy"
                        : !api->last_error ? "last_error" : !api->append_attend ? "append_attend"
                        : !api->read_kv ? "read_kv" : !api->seq_length ? "seq_length" : !api->memory ? "memory"
                        : nullptr;
    if (missing) throw LoadError(origin + ": required member " + missing + " is NULL");
    Target t;
    t.name = api->name ? api->name : "(unnamed)";
    t.origin = origin;
    t.api = api;
    t.caps = guarded_caps(api, origin);
    const auto need = [&](uint32_t bit, bool present, const char* what) {
        if ((t.caps.features & bit) && !present)
            throw LoadError(origin + ": declares " + what + " but the table's " + what + " member is NULL");
    };
    need(KVC_FEATURE_FORK, KVC_API_HAS(api, fork), "fork");
    need(KVC_FEATURE_RELEASE, KVC_API_HAS(api, release), "release");
    need(KVC_FEATURE_BATCH, KVC_API_HAS(api, append_attend_batch), "append_attend_batch");
    // sharing on fork is a promise about fork: without fork there is nothing to hold it to
    if (!(t.caps.features & KVC_FEATURE_FORK)) t.caps.features &= ~KVC_FEATURE_FORK_SHARES;
    // Before ABI 1.2 the quantized dtypes did not exist: a bit an older table sets there names nothing it knew.
    if (api->abi_minor < 2) {
        t.caps.dtypes &= (1u << KVC_DTYPE_F32) | (1u << KVC_DTYPE_F16) | (1u << KVC_DTYPE_BF16);
        t.caps.quant = 0;
        t.caps.features &= KVC_FEATURE_GQA | KVC_FEATURE_PAGED | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE |
                           KVC_FEATURE_BATCH | KVC_FEATURE_CHUNKED;
    }
    if (!(t.caps.fixed_rope_theta == 0.0f || (std::isfinite(t.caps.fixed_rope_theta) && t.caps.fixed_rope_theta > 0)))
        throw LoadError(origin + ": fixed_rope_theta " + std::to_string(t.caps.fixed_rope_theta) +
                        " is neither 0 (not fixed) nor a finite base > 0");
    if (t.caps.fixed_scale > KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM)
        throw LoadError(origin + ": fixed_scale " + std::to_string(t.caps.fixed_scale) +
                        " is neither 0 (config.scale) nor KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM");
    const uint32_t quantized = (1u << KVC_DTYPE_FP8_E4M3) | (1u << KVC_DTYPE_FP8_E5M2) |
                               (1u << KVC_DTYPE_INT8_TOKEN) | (1u << KVC_DTYPE_Q8_0);
    if ((t.caps.dtypes & quantized) && !KVC_API_HAS(api, read_kv_scales))
        throw LoadError(origin + ": declares a quantized cache dtype but the table's read_kv_scales member is NULL "
                                 "(or the table predates ABI 1.2)");
    // ABI 1.2: one q8_0 rounding or none (ggml's reference); both is no rounding at all
    if (t.caps.struct_size >= offsetof(kvc_caps, pipeline) + sizeof(kvc_pipeline) &&
        (t.caps.pipeline.flags & KVC_PIPELINE_DECLARED) &&
        (t.caps.pipeline.flags & KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN) &&
        (t.caps.pipeline.flags & KVC_PIPELINE_Q8_0_RECIP_D_EVEN))
        throw LoadError(origin + ": the pipeline declares both KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN and "
                                 "KVC_PIPELINE_Q8_0_RECIP_D_EVEN; q8_0 codes are rounded one way: declare at most one "
                                 "(x86 ggml: RECIP_AMAX_EVEN, ARM NEON ggml: RECIP_D_EVEN, neither: ggml's reference)");
    // Before ABI 1.3 there were no pipeline rules: whatever an older table left there is not a declaration.
    if (api->abi_minor < 3) t.caps.n_pipeline_rules = 0;
    if (const std::string why = pipeline_rules_problem(t.caps); !why.empty())
        throw LoadError(origin + ": " + why + " (docs/tolerance.md, \"A pipeline per cache dtype and call shape\")");
    return t;
}

std::string plugin_file_problem(const std::string& path) {
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) return std::string("cannot open the file (") + std::strerror(errno) + ")";
    if (!S_ISREG(st.st_mode)) return "not a regular file (a directory, FIFO, socket or device)";
    if (access(path.c_str(), R_OK) != 0) return std::string("cannot open the file (") + std::strerror(errno) + ")";
    return "";
}

Target load_plugin(const std::string& path) {
    if (const std::string why = plugin_file_problem(path); !why.empty()) throw LoadError(path + ": " + why);
    // A bare file name would make dlopen search the library path instead of opening the file the user named.
    const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
    // RTLD_NODELETE: the last Target's dlclose must not unmap the library. A plugin may keep threads (a pool) that
    // outlive its caches; unmapped, their next instruction is a crash of the harness's process, after a verdict.
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!handle) {
        const char* err = dlerror();
        throw LoadError(path + ": not a loadable shared library (" + (err ? err : "dlopen failed") + ")");
    }
    std::shared_ptr<void> lib(handle, [](void* h) { dlclose(h); });
    void* sym = dlsym(handle, KVC_ENTRY_SYMBOL);
    if (!sym) throw LoadError(path + ": no exported symbol " KVC_ENTRY_SYMBOL " (see docs/plugin-abi.md)");
    // A data object under the entry's name would be "called" as code: refuse it by its ELF symbol type.
    Dl_info info{};
    void* entry_info = nullptr;
    if (dladdr1(sym, &info, &entry_info, RTLD_DL_SYMENT) && entry_info) {
        const unsigned type = static_cast<const ElfW(Sym)*>(entry_info)->st_info & 0xfu; // ELF{32,64}_ST_TYPE
        if (type != STT_FUNC && type != STT_GNU_IFUNC)
            throw LoadError(path + ": the exported symbol " KVC_ENTRY_SYMBOL " is not a function (" +
                            (type == STT_OBJECT ? std::string("a data object") : "ELF symbol type " +
                                                                                    std::to_string(type)) +
                            "; see docs/plugin-abi.md)");
    }
    kvc_entry_fn entry;
    static_assert(sizeof entry == sizeof sym, "function and object pointers differ in size");
    std::memcpy(&entry, &sym, sizeof entry);
    Target t = target_from_entry(entry, path);
    t.library = lib;
    return t;
}

} // namespace kvc::prop
