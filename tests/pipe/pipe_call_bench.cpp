// The pipe route's cost per call (issue 41, item 6): one decode step of 8 sequences x 32 heads x 128 dims
// (append_attend_batch, f32, one new token each) timed through a plugin table in this process and through the proxy
// to a client process. The difference for the same implementation is the protocol's overhead.
//
//   pipe_call_bench DIRECT                          the example plugin linked in
//   pipe_call_bench 'kvcheck serve-plugin LIB.so'    any client command
#include "kvcheck/abi.hpp"
#include "kvcheck/pipe/proxy.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

extern "C" const kvc_plugin_api* kvc_example_entry(uint32_t major, uint32_t minor);

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: pipe_call_bench DIRECT | COMMAND [steps]\n");
        return 2;
    }
    const std::string target = argv[1];
    const int steps = argc > 2 ? std::stoi(argv[2]) : 200;
    const kvc_plugin_api* api = nullptr;
    if (target == "DIRECT") {
        api = kvc_example_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    } else {
        kvc::pipe::connect(target, 60);
        api = kvc::pipe::proxy_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    }
    constexpr uint32_t kSeqs = 8, kHeads = 32, kDim = 128, kPrefill = 16;
    const kvc_config cfg = kvc::make_config(1, kHeads, kHeads, kDim, KVC_DTYPE_F32, kSeqs, kPrefill + steps + 1);
    kvc::Cache cache(api, cfg);
    std::vector<float> x(std::size_t{kPrefill} * kHeads * kDim, 0.25f), out(x.size());
    for (uint32_t s = 0; s < kSeqs; ++s) cache.append_attend(s, 0, kPrefill, x.data(), x.data(), x.data(), out.data());
    std::vector<uint32_t> ids(kSeqs), offs(kSeqs + 1);
    for (uint32_t s = 0; s < kSeqs; ++s) {
        ids[s] = s;
        offs[s + 1] = s + 1;
    }
    std::vector<float> q(std::size_t{kSeqs} * kHeads * kDim, 0.5f), o(q.size());
    kvc_batch b{};
    b.struct_size = sizeof b;
    b.n_seqs = kSeqs;
    b.seq_ids = ids.data();
    b.token_offsets = offs.data();
    b.q = b.k = b.v = q.data();
    b.out = o.data();
    const bool batch = (kvc::query_caps(api).features & KVC_FEATURE_BATCH) != 0;
    std::vector<double> us;
    for (int i = 0; i < steps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        if (batch) cache.append_attend_batch(0, b);
        else
            for (uint32_t s = 0; s < kSeqs; ++s)
                cache.append_attend(s, 0, 1, q.data() + std::size_t{s} * kHeads * kDim, q.data(), q.data(),
                                    o.data() + std::size_t{s} * kHeads * kDim);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::printf("%s: %s, %d decode steps of 8 seqs x 32 heads x 128 dims: median %.1f us, p90 %.1f us per step\n",
                target.c_str(), batch ? "append_attend_batch" : "8 x append_attend", steps, us[us.size() / 2],
                us[us.size() * 9 / 10]);
    return 0;
}
