// The CUDA engine behind the plugin ABI: one function table over kvc::cuda::Engine, and the availability probe.
#include "kvcheck/optimized/cuda_engine.h"

#include "engine.hpp"
#include "kernels.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

struct kvc_cache {
    std::unique_ptr<kvc::cuda::Engine> engine;
};

namespace {

using kvc::cuda::Engine;

// last_error(NULL): the last failed create on this thread.
thread_local char g_create_error[512] = "no error";

void set_create_error(const std::string& msg) { std::snprintf(g_create_error, sizeof g_create_error, "%s", msg.c_str()); }

// No exception crosses the ABI; a failed allocation on the host is OUT_OF_MEMORY, like on the device.
template <typename F>
kvc_status guarded(kvc_cache* cache, F&& body) {
    if (cache == nullptr) {
        set_create_error("cache is NULL");
        return KVC_ERR_INVALID_ARGUMENT;
    }
    try {
        return body(*cache->engine);
    } catch (const std::bad_alloc&) {
        return cache->engine->fail(KVC_ERR_OUT_OF_MEMORY, "host allocation failed");
    } catch (...) {
        return cache->engine->fail(KVC_ERR_INTERNAL, "unexpected exception");
    }
}

void get_caps(kvc_caps* out) {
    if (out == nullptr) return;
    kvc_caps c{};
    c.struct_size = out->struct_size;
    c.dtypes = (1u << KVC_DTYPE_F32) | (1u << KVC_DTYPE_F16) | (1u << KVC_DTYPE_BF16);
    c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.features = KVC_FEATURE_GQA | KVC_FEATURE_PAGED | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_BATCH |
                 KVC_FEATURE_CHUNKED;
    // What the kernels do: q f32 (rotated in double, rounded once), K/V widened from the cache dtype, scores,
    // exp, sums and the V accumulation in f32, split states merged in f32. The f32 class, as the CPU engine.
    c.precision = KVC_PRECISION_F32;
    c.memory_space = KVC_MEMORY_DEVICE;
    c.max_layers = 1024;
    c.max_q_heads = 1024;
    c.max_kv_heads = 1024;
    c.max_head_dim = kvc::cuda::kMaxHeadDim;
    c.max_seqs = 0;
    c.max_tokens = 0;
    const size_t n = out->struct_size < sizeof c ? out->struct_size : sizeof c;
    if (n > sizeof c.struct_size)
        std::memcpy(reinterpret_cast<char*>(out) + sizeof c.struct_size,
                    reinterpret_cast<const char*>(&c) + sizeof c.struct_size, n - sizeof c.struct_size);
}

kvc_status create(const kvc_config* config, kvc_cache** out) {
    if (out == nullptr) {
        set_create_error("create: out is NULL");
        return KVC_ERR_INVALID_ARGUMENT;
    }
    *out = nullptr;
    if (config == nullptr) {
        set_create_error("create: config is NULL");
        return KVC_ERR_INVALID_ARGUMENT;
    }
    try {
        kvc_status status = KVC_OK;
        std::string error;
        auto engine = Engine::create(*config, &status, &error);
        if (!engine) {
            set_create_error("create: " + error);
            return status;
        }
        *out = new kvc_cache{std::move(engine)};
        return KVC_OK;
    } catch (...) {
        set_create_error("create: host allocation failed");
        return KVC_ERR_OUT_OF_MEMORY;
    }
}

void destroy(kvc_cache* cache) { delete cache; }

const char* last_error(const kvc_cache* cache) { return cache ? cache->engine->last_error() : g_create_error; }

kvc_status append_attend(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                         const float* k, const float* v, float* out) {
    const uint32_t offsets[2] = {0, n_new};
    return guarded(cache, [&](Engine& e) { return e.append_attend_batch(layer, 1, &seq, offsets, q, k, v, out); });
}

kvc_status append_attend_batch(kvc_cache* cache, uint32_t layer, const kvc_batch* b) {
    return guarded(cache, [&](Engine& e) {
        bool empty = false;
        if (const kvc::opt::Refusal r = kvc::opt::check_batch_struct(b, &empty); r.refused()) return e.fail(r);
        if (empty) return KVC_OK;
        return e.append_attend_batch(layer, b->n_seqs, b->seq_ids, b->token_offsets, b->q, b->k, b->v, b->out);
    });
}

kvc_status read_kv(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                   void* v_out) {
    return guarded(cache, [&](Engine& e) { return e.read_kv(seq, layer, pos, n, k_out, v_out); });
}

kvc_status seq_length(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t* length) {
    return guarded(cache, [&](Engine& e) { return e.seq_length(seq, layer, length); });
}

kvc_status memory(kvc_cache* cache, kvc_memory* out) {
    return guarded(cache, [&](Engine& e) { return e.memory(out); });
}

kvc_status fork(kvc_cache* cache, uint32_t parent, uint32_t child) {
    return guarded(cache, [&](Engine& e) { return e.fork(parent, child); });
}

kvc_status release(kvc_cache* cache, uint32_t seq) {
    return guarded(cache, [&](Engine& e) { return e.release(seq); });
}

kvc_plugin_api make_table() {
    kvc_plugin_api t{};
    t.struct_size = sizeof t;
    t.abi_major = KVC_ABI_VERSION_MAJOR;
    t.abi_minor = KVC_ABI_VERSION_MINOR;
    t.name = "kvcheck-cuda";
    t.version = "0.1.0";
    t.get_caps = get_caps;
    t.create = create;
    t.destroy = destroy;
    t.last_error = last_error;
    t.append_attend = append_attend;
    t.append_attend_batch = append_attend_batch;
    t.read_kv = read_kv;
    t.seq_length = seq_length;
    t.memory = memory;
    t.fork = fork;
    t.release = release;
    return t;
}

} // namespace

extern "C" const kvc_plugin_api* kvc_cuda_engine_entry(uint32_t major, uint32_t minor) {
    (void)minor; // a newer minor only appends members
    static const kvc_plugin_api table = make_table();
    return major == KVC_ABI_VERSION_MAJOR ? &table : nullptr;
}

namespace {

// The probe runs in a child process, so that asking does not initialize CUDA in the caller: a process that has
// touched CUDA cannot hand the device to a fork() of itself, and the harness runs cases in forks. Once this process
// has initialized CUDA itself (a cache was created), its own answer is used.
std::string probe_in_child() {
    if (kvc::cuda::probed_in_this_process()) return kvc::cuda::unavailable_reason();
    int fd[2];
    if (pipe(fd) != 0) return kvc::cuda::unavailable_reason();
    const pid_t pid = ::fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return kvc::cuda::unavailable_reason();
    }
    if (pid == 0) {
        close(fd[0]);
        const std::string r = kvc::cuda::unavailable_reason();
        const char ok = r.empty() ? '1' : '0';
        bool written = write(fd[1], &ok, 1) == 1;
        for (size_t at = 0; written && at < r.size();) {
            const ssize_t n = write(fd[1], r.data() + at, r.size() - at);
            written = n > 0;
            at += n > 0 ? static_cast<size_t>(n) : 0;
        }
        _exit(written ? 0 : 1);
    }
    close(fd[1]);
    std::string got;
    char buf[512];
    for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        got.append(buf, static_cast<size_t>(n));
    }
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got.empty())
        return "no CUDA device: the probe process (cudaGetDeviceCount) did not finish normally";
    return got[0] == '1' ? std::string() : got.substr(1);
}

} // namespace

extern "C" const char* kvc_cuda_engine_unavailable(void) {
    static const std::string reason = probe_in_child();
    return reason.empty() ? nullptr : reason.c_str();
}
