// The one place the plugin harness calls an implementation. Every call:
//   - gets its buffers lent (lent.hpp): copies of the inputs and NaN-filled outputs between guard zones, checked
//     right after the call returns and before its status, so writing outside what was lent is a FAIL of the
//     property that made the call, whatever the call returned;
//   - is measured: the memory watch (memory_watch.hpp) reads the allocator just before and just after it, so the
//     harness's own allocations between calls never count, and judges the cache's memory report after it;
//   - has its status turned into a kvc::AbiError naming the call and the implementation's last_error.
// After a call the buffers it was lent are poisoned (NaN) and kept alive until the cache is destroyed, so an
// implementation that kept a pointer reads NaN later instead of silently reading stale inputs (NO-Q part 3).
#pragma once

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/mismatch.hpp"
#include "lent.hpp"
#include "memory_watch.hpp"

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace kvc::prop {

class CallDriver {
public:
    CallDriver(const kvc_plugin_api* api, const CheckScope& scope, MemoryWatch& watch);
    CallDriver(const CallDriver&) = delete;
    CallDriver& operator=(const CallDriver&) = delete;

    // Creates the cache from copies of `config` and of the arrays it points to (scales, windows), so nothing the
    // implementation does to them reaches the harness's own; throws AbiError when create fails or returns no handle.
    void create(const kvc_config& config);

    // One sequence's n_new tokens: q [n][Hq*d], k [n][Hkv*d], v [n][Hkv*dv]; returns out [n][Hq*dv].
    std::vector<float> append_attend(uint32_t seq, uint32_t layer, uint32_t n_new, const std::vector<float>& q,
                                     const std::vector<float>& k, const std::vector<float>& v);

    // One call for several sequences: each part's q, k, v as above; returns each part's out.
    struct BatchPart {
        uint32_t seq;
        uint32_t n_new;
        const std::vector<float>* q;
        const std::vector<float>* k;
        const std::vector<float>* v;
    };
    std::vector<std::vector<float>> append_attend_batch(uint32_t layer, const std::vector<BatchPart>& parts);

    // Rows pos .. pos+n-1 of (seq, layer) into k and v (n * row bytes each).
    void read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<uint8_t>& k,
                 std::vector<uint8_t>& v);
    // Their scales (ABI 1.2, quantized dtypes): k and v sized as read_kv_scales fills them. An implementation that
    // declares a quantized dtype without read_kv_scales: AbiError UNSUPPORTED (an ERROR: a declared capability).
    void read_kv_scales(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<uint8_t>& k,
                        std::vector<uint8_t>& v);
    uint32_t seq_length(uint32_t seq, uint32_t layer);
    kvc_memory memory(); // not measured: the watch itself asks for it after every measured call
    void fork(uint32_t parent, uint32_t child);
    void release(uint32_t seq);

private:
    // The output elements of queries of q_elems elements: a query row has head_dim dims, an output row head_dim_v.
    size_t out_elems(size_t q_elems) const { return q_elems / head_dim_ * head_dim_v_; }
    uint32_t head_dim_ = 1, head_dim_v_ = 1; // from the config create was given
    struct Lending {
        const Lent* buffer;
        const void* input; // what the payload must still equal (const inputs); nullptr for outputs
    };
    void check_lent(const char* call, std::initializer_list<Lending> lent) const;
    void check_status(kvc_status s, const char* call) const;
    void bury(std::initializer_list<Lent*> lent);
    template <typename F> void measured(const char* name, F&& call);

    const CheckScope& scope_;
    MemoryWatch& watch_;
    std::vector<Lent> graveyard_; // poisoned buffers, alive until the cache is gone (declared before cache_)
    // The cache instance; destroyed before the graveyard (members are destroyed in reverse order).
    struct OwnedCache {
        const kvc_plugin_api* api;
        kvc_cache* handle = nullptr;
        explicit OwnedCache(const kvc_plugin_api* a) : api(a) {}
        OwnedCache(const OwnedCache&) = delete;
        OwnedCache& operator=(const OwnedCache&) = delete;
        ~OwnedCache() {
            if (handle) api->destroy(handle);
        }
    } cache_;
};

} // namespace kvc::prop
