// Device memory in use, read through the CUDA runtime loaded at run time, so that NO-Q and MEMORY can hold a DEVICE
// cache's allocations against what it reports (docs/conformance.md) while kvcheck itself never requires CUDA.
//
// The runtime is dlopen()ed: the path in KVCHECK_CUDART when set (the tests point it at a fake runtime), else
// libcudart.so.13, libcudart.so.12, libcudart.so. Only cudaMemGetInfo (and cudaGetErrorString for messages) is
// called. kvcheck resolves that runtime once, in its own process before any plugin code runs (pin_runtime()), and
// hands the resolved file to its case processes in the request; once pinned, open() uses that handle and never
// reads the environment again, so a plugin that setenv()s KVCHECK_CUDART in a constructor changes nothing. Without
// a pin (the library used in-process, as the property tests do) open() reads the environment at each call. Where no runtime loads or it reports no usable device, open() says why and the allocator half of those
// properties is reported as not run, never passed.
//
// The reading is total - free of the calling thread's current device: global to the device, so allocations of other
// processes on the same GPU show up too (docs/conformance.md, "device memory watch", says what that means).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace kvc::prop {

// Rises of device growth beyond reported growth tolerated after create: the driver hands out device memory in
// 2 MiB pages (small allocations share one, a new one appears when it is full), and one more page covers what the
// runtime allocates for itself lazily (module code, internal buffers).
constexpr int64_t kDeviceSlackBytes = 4ll << 20;

// The runtime the watch reads: the resolved file (absolute, symbolic links resolved), or why none could be loaded.
struct RuntimeChoice {
    std::string path;
    std::string why_not;
};

class DeviceWatch {
public:
    // kvcheck's own process: resolves the runtime from the environment and dlopen()s it, once (later calls return
    // the first answer). Only loads the library: no CUDA call, so no context exists before a fork.
    static const RuntimeChoice& pin_runtime();
    // A case process: pins the parent's choice (dlopen()s `c.path`; no search, no environment). When this process
    // pinned already (a fork()ed copy of the parent) the earlier pin stays.
    static const RuntimeChoice& pin_runtime(const RuntimeChoice& c);
    // The pinned choice, or nullptr when nothing was pinned in this process.
    static const RuntimeChoice* pinned();
    // Why the pinned runtime cannot be used with the plugin in `plugin_file` (it is that very file: a plugin would
    // feed the watch its own cudaMemGetInfo), or "" when it can (or nothing is pinned).
    static std::string runtime_problem(const std::string& plugin_file);

    // The watch, or nullptr with *why_not set (the runtime's path and dlerror(), or the CUDA error of the first
    // reading). The first reading happens here, before the implementation's create(): it creates the CUDA context,
    // whose own memory must not count against the cache.
    static std::shared_ptr<DeviceWatch> open(std::string* why_not);

    // Bytes in use on the current device (total - free). Throws std::runtime_error naming the CUDA error when the
    // runtime refuses (after a plugin's call, usually a sticky error the plugin caused).
    int64_t used() const;

    const std::string& library() const { return library_; }

    using MemGetInfo = int (*)(std::size_t* free, std::size_t* total);
    using GetErrorString = const char* (*)(int error);

private:
    DeviceWatch(std::string library, MemGetInfo mem, GetErrorString err)
        : library_(std::move(library)), mem_(mem), err_(err) {}
    std::string error_text(int e) const;

    std::string library_;
    MemGetInfo mem_;
    GetErrorString err_;
};

} // namespace kvc::prop
