#include "kvcheck/properties/device_watch.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <climits>
#include <cstdlib>
#include <stdexcept>

namespace kvc::prop {

namespace {

constexpr int kCudaSuccess = 0;

// The runtime's handle; never dlclose()d: unloading a CUDA runtime while its context lives is not supported.
void* load_runtime(std::string* path, std::string* why_not) {
    if (const char* forced = std::getenv("KVCHECK_CUDART"); forced != nullptr && *forced != '\0') {
        *path = forced;
        void* h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            const char* e = dlerror();
            *why_not = std::string("the CUDA runtime named by KVCHECK_CUDART cannot be loaded: ") + (e ? e : forced);
        }
        return h;
    }
    std::string tried;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
        if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
            *path = name;
            return h;
        }
        const char* e = dlerror();
        tried += std::string(tried.empty() ? "" : "; ") + (e ? e : name);
    }
    *why_not = "no CUDA runtime library could be loaded (" + tried + "; set KVCHECK_CUDART to its path)";
    return nullptr;
}

// The file a loaded library came from, symbolic links resolved (what dlopen() found for a bare soname).
std::string file_of(void* handle, const std::string& fallback) {
    struct link_map* lm = nullptr;
    std::string name = fallback;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && lm->l_name != nullptr && *lm->l_name != '\0')
        name = lm->l_name;
    char real[PATH_MAX];
    return realpath(name.c_str(), real) != nullptr ? std::string(real) : name;
}

struct Pin {
    RuntimeChoice choice;
    void* handle = nullptr;
};

Pin*& the_pin() {
    static Pin* pin = nullptr; // never freed: the handle is never dlclose()d
    return pin;
}

} // namespace

const RuntimeChoice& DeviceWatch::pin_runtime() {
    Pin*& pin = the_pin();
    if (pin != nullptr) return pin->choice;
    pin = new Pin;
    std::string path;
    pin->handle = load_runtime(&path, &pin->choice.why_not);
    pin->choice.path = pin->handle != nullptr ? file_of(pin->handle, path) : path;
    return pin->choice;
}

const RuntimeChoice& DeviceWatch::pin_runtime(const RuntimeChoice& c) {
    Pin*& pin = the_pin();
    if (pin != nullptr) return pin->choice;
    pin = new Pin;
    pin->choice = c;
    if (c.why_not.empty()) {
        if (c.path.empty() || c.path.front() != '/') {
            pin->choice.why_not = "the CUDA runtime kvcheck resolved has no absolute path (\"" + c.path + "\")";
        } else if ((pin->handle = dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL)) == nullptr) {
            const char* e = dlerror();
            pin->choice.why_not = "the CUDA runtime kvcheck resolved (" + c.path + ") cannot be loaded in the case "
                                  "process: " + (e ? e : "dlopen failed");
        }
    }
    return pin->choice;
}

const RuntimeChoice* DeviceWatch::pinned() { return the_pin() ? &the_pin()->choice : nullptr; }

std::string DeviceWatch::runtime_problem(const std::string& plugin_file) {
    const RuntimeChoice* c = pinned();
    if (c == nullptr || c->path.empty() || !c->why_not.empty()) return "";
    struct stat a {}, b {};
    if (stat(c->path.c_str(), &a) != 0 || stat(plugin_file.c_str(), &b) != 0) return "";
    if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) return "";
    return "the CUDA runtime the device-memory watch would read (" + c->path +
           ", from KVCHECK_CUDART or the library search path) is the plugin under test itself: the watch must read "
           "device memory through a runtime the plugin does not control; refused";
}

std::shared_ptr<DeviceWatch> DeviceWatch::open(std::string* why_not) {
    // Kernels loaded lazily (CUDA's default since 12.2) take device memory at their first launch, inside whichever
    // call launches them first. Eager loading moves that into context creation, which happens here, before create().
    // Too late when the plugin initialised CUDA already (in a constructor or get_caps); the slack covers a page.
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    std::string path;
    void* h = nullptr;
    if (const Pin* pin = the_pin()) { // resolved by kvcheck before any plugin code ran: the environment is not read
        if (pin->handle == nullptr) {
            *why_not = pin->choice.why_not;
            return nullptr;
        }
        h = pin->handle;
        path = pin->choice.path;
    } else if ((h = load_runtime(&path, why_not)) == nullptr) {
        return nullptr;
    }
    auto mem = reinterpret_cast<MemGetInfo>(dlsym(h, "cudaMemGetInfo"));
    auto err = reinterpret_cast<GetErrorString>(dlsym(h, "cudaGetErrorString"));
    if (mem == nullptr) {
        *why_not = path + " exports no cudaMemGetInfo: not a CUDA runtime";
        return nullptr;
    }
    std::shared_ptr<DeviceWatch> w(new DeviceWatch(path, mem, err));
    std::size_t free_b = 0, total_b = 0;
    if (const int e = mem(&free_b, &total_b); e != kCudaSuccess) {
        *why_not = "the CUDA runtime (" + path + ") reports no usable device: cudaMemGetInfo: " + w->error_text(e);
        return nullptr;
    }
    if (total_b == 0 || free_b > total_b) {
        *why_not = "the CUDA runtime (" + path + ") reports an implausible device memory size (free " +
                   std::to_string(free_b) + " of " + std::to_string(total_b) + " bytes)";
        return nullptr;
    }
    return w;
}

std::string DeviceWatch::error_text(int e) const {
    const char* s = err_ ? err_(e) : nullptr;
    return std::string(s ? s : "CUDA error") + " (" + std::to_string(e) + ")";
}

int64_t DeviceWatch::used() const {
    std::size_t free_b = 0, total_b = 0;
    if (const int e = mem_(&free_b, &total_b); e != kCudaSuccess)
        throw std::runtime_error("the device-memory watch cannot read the device: cudaMemGetInfo: " + error_text(e));
    return static_cast<int64_t>(total_b) - static_cast<int64_t>(free_b);
}

} // namespace kvc::prop
