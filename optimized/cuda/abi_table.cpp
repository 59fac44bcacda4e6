// The CUDA engine behind the plugin ABI: one function table over kvc::cuda::Engine, and the availability probe.
#include "kvcheck/optimized/abi_table_common.hpp"
#include "kvcheck/optimized/cuda_engine.h"

#include "engine.hpp"
#include "kernels.hpp"

#include <cerrno>
#include <new>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace {

struct CudaOps {
    using Engine = kvc::cuda::Engine;
    static constexpr uint32_t kMemorySpace = KVC_MEMORY_DEVICE;
    static constexpr uint32_t kMaxHeadDim = kvc::cuda::kMaxHeadDim;
    static constexpr bool kQuantized = true; // fp8, int8 per token and q8_0 caches (ABI 1.2), with read_kv_scales
    // ABI 1.2: sliding windows per layer (any W), any number of sinks and eviction, with every dtype; head_dim_v
    // apart from head_dim and RoPE on a range of the head dims, with every dtype (q8_0: both multiples of 32). Heads,
    // K and V, up to kMaxHeadDim = 576 (MLA's K rows): the attention tile's shared memory caps it (tile_plan.hpp).
    static constexpr bool kWindows = true;
    static constexpr bool kLatent = true;
    // fork retains every block of the parent's tables, the partial last one too (copied on the next write to it),
    // and capacity counts a block once whatever its reference count: the CPU engine's sharing
    static constexpr bool kForkShares = true;
    static constexpr const char* kCreateFailed = "create: host allocation failed";

    // No exception crosses the ABI; a failed allocation on the host is OUT_OF_MEMORY, like on the device.
    template <class F>
    static kvc_status guard(Engine& e, F&& call) {
        try {
            return call(e);
        } catch (const std::bad_alloc&) {
            return e.fail(KVC_ERR_OUT_OF_MEMORY, "host allocation failed");
        } catch (...) {
            return e.fail(KVC_ERR_INTERNAL, "unexpected exception");
        }
    }
    // One sequence is a batch of one: the engine has a single entry point.
    static kvc_status append_attend(Engine& e, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                    const float* k, const float* v, float* out) {
        const uint32_t offsets[2] = {0, n_new};
        return e.append_attend_batch(layer, 1, &seq, offsets, q, k, v, out);
    }
    static kvc_status append_attend_batch(Engine& e, uint32_t layer, const kvc_batch* b) {
        bool empty = false;
        if (const kvc::opt::Refusal r = kvc::opt::check_batch_struct(b, &empty); r.refused()) return e.fail(r);
        if (empty) return KVC_OK;
        return e.append_attend_batch(layer, b->n_seqs, b->seq_ids, b->token_offsets, b->q, b->k, b->v, b->out);
    }
};
using Table = kvc::opt::AbiTable<CudaOps>;

kvc_status create(const kvc_config* config, kvc_cache** out) {
    return Table::create_with(config, out, [](const kvc_config& c, kvc_status* status, std::string* error) {
        return kvc::cuda::Engine::create(c, status, error);
    });
}

} // namespace

extern "C" const kvc_plugin_api* kvc_cuda_engine_entry(uint32_t major, uint32_t /*minor*/) {
    static const kvc_plugin_api table = Table::make("kvcheck-cuda", create);
    return Table::entry(table, major);
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
