#include "call_driver.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/refused_allocation.hpp"

#include <cerrno>
#include <cstring>
#include <string>

namespace kvc::prop {

namespace {

std::size_t bytes_of(const std::vector<float>& x) { return x.size() * sizeof(float); }

// Floats in each of a config's k_scales and v_scales (abi.h, kvc_scale_mode).
std::size_t scale_count(const kvc_config& c) {
    if (c.kv_scale_mode == KVC_SCALE_TENSOR) return c.n_layers;
    if (c.kv_scale_mode == KVC_SCALE_KV_HEAD) return static_cast<std::size_t>(c.n_layers) * c.n_kv_heads;
    return 0;
}

} // namespace

CallDriver::CallDriver(const kvc_plugin_api* api, const CheckScope& scope, MemoryWatch& watch)
    : scope_(scope), watch_(watch), cache_(api) {}

template <typename F>
void CallDriver::measured(const char* name, F&& call) {
    const MemoryWatch::Reading before = watch_.reading(name, "before");
    {
        const LentCall naming(name);
        errno = 0; // what the call leaves there tells a refused allocation (refused_allocation.hpp)
        call();
    }
    if (!watch_.active()) return;
    const MemoryWatch::Reading grown = watch_.reading(name, "after") - before;
    watch_.judge(grown, memory());
}

void CallDriver::check_lent(const char* call, std::initializer_list<Lending> lent) const {
    const auto report = [&](const char* buffer, const std::string& what, std::size_t bytes, bool input) {
        Mismatch m;
        const bool into = input && what.rfind("wrote into", 0) == 0;
        m.what = std::string(into ? "bytes of input `" : "bytes outside `") + buffer + "`";
        m.expected = 0;
        m.actual = static_cast<double>(bytes);
        scope_.fail(what + ": an implementation may write only into the output buffers it is lent, within their size",
                    m);
    };
    for (const Lending& l : lent) {
        std::size_t bytes = 0;
        const std::string what = l.buffer->violation(call, l.input, &bytes);
        if (!what.empty()) report(l.buffer->name(), what, bytes, l.input != nullptr);
    }
    if (const FarViolationSource far = far_violation_source()) {
        const FarViolation* v = nullptr;
        const std::size_t n = far(&v);
        for (std::size_t i = 0; i < n; ++i) report(v[i].buffer, v[i].what, v[i].bytes, true);
    }
}

void CallDriver::check_status(kvc_status s, const char* call) const {
    if (s == KVC_OK) return;
    note_if_refused(s, errno);
    const char* msg = cache_.api->last_error(cache_.handle);
    throw AbiError(s, std::string(call) + " failed (" + status_name(s) + "): " + (msg ? msg : "(no message)"));
}

void CallDriver::bury(std::initializer_list<Lent*> lent) {
    for (Lent* l : lent) {
        l->retire();
        graveyard_.push_back(std::move(*l));
    }
}

void CallDriver::create(const kvc_config& harness) {
    const kvc_plugin_api* api = cache_.api;
    // The implementation gets copies of the config and of the arrays it points to, never the harness's own: what it
    // does to them cannot change what the case is graded against, and a write into them is seen.
    const std::size_t scales = scale_count(harness);
    Lent k_scales("k_scales", harness.k_scales ? scales * sizeof(float) : 0, harness.k_scales),
        v_scales("v_scales", harness.v_scales ? scales * sizeof(float) : 0, harness.v_scales),
        windows("windows", harness.windows ? harness.n_layers * sizeof(uint32_t) : 0, harness.windows);
    kvc_config abi = harness;
    head_dim_ = harness.head_dim;
    head_dim_v_ = value_dim(harness);
    if (abi.k_scales != nullptr) abi.k_scales = k_scales.as<const float>();
    if (abi.v_scales != nullptr) abi.v_scales = v_scales.as<const float>();
    if (abi.windows != nullptr) abi.windows = windows.as<const uint32_t>();
    Lent config("kvc_config", sizeof abi, &abi), handle("create's out (kvc_cache*)", sizeof(kvc_cache*));
    kvc_cache* raw = nullptr;
    measured("create", [&] {
        const kvc_status s = api->create(config.as<const kvc_config>(), handle.as<kvc_cache*>());
        check_lent("create", {{&config, &abi},
                              {&handle, nullptr},
                              {&k_scales, harness.k_scales},
                              {&v_scales, harness.v_scales},
                              {&windows, harness.windows}});
        std::memcpy(&raw, handle.data(), sizeof raw);
        if (s != KVC_OK || raw == nullptr) {
            note_if_refused(s, errno);
            const char* msg = api->last_error(nullptr);
            const kvc_status st = s == KVC_OK ? KVC_ERR_INTERNAL : s; // OK with no handle is a broken promise
            throw AbiError(st, std::string("create failed (") + status_name(st) + (s == KVC_OK ? ", no handle" : "") +
                                   "): " + (msg ? msg : "(no message)"));
        }
        cache_.handle = raw;
    });
    bury({&k_scales, &v_scales, &windows}); // an implementation that kept a pointer instead of a copy reads NaN
}

kvc_memory CallDriver::memory() {
    kvc_memory init{};
    init.struct_size = sizeof init;
    Lent m("kvc_memory", sizeof init, &init);
    const LentCall naming("memory");
    errno = 0;
    const kvc_status s = cache_.api->memory(cache_.handle, m.as<kvc_memory>());
    check_lent("memory", {{&m, nullptr}});
    check_status(s, "memory");
    kvc_memory out;
    std::memcpy(&out, m.data(), sizeof out);
    return out;
}

std::vector<float> CallDriver::append_attend(uint32_t seq, uint32_t layer, uint32_t n_new,
                                             const std::vector<float>& q, const std::vector<float>& k,
                                             const std::vector<float>& v) {
    Lent lq("q", bytes_of(q), q.data()), lk("k", bytes_of(k), k.data()), lv("v", bytes_of(v), v.data()),
        lout("out", out_elems(q.size()) * sizeof(float));
    measured("append_attend", [&] {
        const kvc_status st = cache_.api->append_attend(cache_.handle, seq, layer, n_new, lq.as<const float>(),
                                                        lk.as<const float>(), lv.as<const float>(), lout.as<float>());
        check_lent("append_attend", {{&lq, q.data()}, {&lk, k.data()}, {&lv, v.data()}, {&lout, nullptr}});
        check_status(st, "append_attend");
    });
    std::vector<float> out(lout.as<float>(), lout.as<float>() + out_elems(q.size()));
    bury({&lq, &lk, &lv, &lout});
    return out;
}

std::vector<std::vector<float>> CallDriver::append_attend_batch(uint32_t layer, const std::vector<BatchPart>& parts) {
    std::vector<uint32_t> ids, offs{0};
    std::vector<float> q, k, v;
    for (const BatchPart& p : parts) {
        ids.push_back(p.seq);
        offs.push_back(offs.back() + p.n_new);
        q.insert(q.end(), p.q->begin(), p.q->end());
        k.insert(k.end(), p.k->begin(), p.k->end());
        v.insert(v.end(), p.v->begin(), p.v->end());
    }
    if (!KVC_API_HAS(cache_.api, append_attend_batch))
        throw AbiError(KVC_ERR_UNSUPPORTED, "append_attend_batch: not provided");
    Lent lq("batch q", bytes_of(q), q.data()), lk("batch k", bytes_of(k), k.data()),
        lv("batch v", bytes_of(v), v.data()), lout("batch out", out_elems(q.size()) * sizeof(float)),
        lids("batch seq_ids", ids.size() * sizeof(uint32_t), ids.data()),
        loffs("batch token_offsets", offs.size() * sizeof(uint32_t), offs.data());
    kvc_batch b{};
    b.struct_size = sizeof b;
    b.n_seqs = static_cast<uint32_t>(parts.size());
    b.seq_ids = lids.as<const uint32_t>();
    b.token_offsets = loffs.as<const uint32_t>();
    b.q = lq.as<const float>();
    b.k = lk.as<const float>();
    b.v = lv.as<const float>();
    b.out = lout.as<float>();
    Lent lb("kvc_batch", sizeof b, &b);
    measured("append_attend_batch", [&] {
        const kvc_status st = cache_.api->append_attend_batch(cache_.handle, layer, lb.as<const kvc_batch>());
        check_lent("append_attend_batch", {{&lb, &b}, {&lids, ids.data()}, {&loffs, offs.data()}, {&lq, q.data()},
                                           {&lk, k.data()}, {&lv, v.data()}, {&lout, nullptr}});
        check_status(st, "append_attend_batch");
    });
    const float* out = lout.as<const float>(); // packed as the queries are
    std::vector<std::vector<float>> outs(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
        outs[i].assign(out, out + out_elems(parts[i].q->size()));
        out += out_elems(parts[i].q->size());
    }
    bury({&lq, &lk, &lv, &lout, &lids, &loffs, &lb});
    return outs;
}

void CallDriver::read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<uint8_t>& k,
                         std::vector<uint8_t>& v) {
    Lent ko("k_out", k.size()), vo("v_out", v.size());
    measured("read_kv", [&] {
        const kvc_status s = cache_.api->read_kv(cache_.handle, seq, layer, pos, n, ko.data(), vo.data());
        check_lent("read_kv", {{&ko, nullptr}, {&vo, nullptr}});
        check_status(s, "read_kv");
    });
    std::memcpy(k.data(), ko.data(), k.size());
    std::memcpy(v.data(), vo.data(), v.size());
}

void CallDriver::read_kv_scales(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<uint8_t>& k,
                                std::vector<uint8_t>& v) {
    if (!KVC_API_HAS(cache_.api, read_kv_scales))
        throw AbiError(KVC_ERR_UNSUPPORTED, "read_kv_scales: not provided, though a quantized dtype is declared");
    Lent ko("k_scales_out", k.size()), vo("v_scales_out", v.size());
    measured("read_kv_scales", [&] {
        const kvc_status s = cache_.api->read_kv_scales(cache_.handle, seq, layer, pos, n, ko.data(), vo.data());
        check_lent("read_kv_scales", {{&ko, nullptr}, {&vo, nullptr}});
        check_status(s, "read_kv_scales");
    });
    std::memcpy(k.data(), ko.data(), k.size());
    std::memcpy(v.data(), vo.data(), v.size());
}

uint32_t CallDriver::seq_length(uint32_t seq, uint32_t layer) {
    uint32_t len = 0;
    Lent out("seq_length's out", sizeof len);
    measured("seq_length", [&] {
        const kvc_status st = cache_.api->seq_length(cache_.handle, seq, layer, out.as<uint32_t>());
        check_lent("seq_length", {{&out, nullptr}});
        check_status(st, "seq_length");
    });
    std::memcpy(&len, out.data(), sizeof len);
    return len;
}

void CallDriver::fork(uint32_t parent, uint32_t child) {
    if (!KVC_API_HAS(cache_.api, fork)) throw AbiError(KVC_ERR_UNSUPPORTED, "fork: not provided");
    measured("fork", [&] { check_status(cache_.api->fork(cache_.handle, parent, child), "fork"); });
}

void CallDriver::release(uint32_t seq) {
    if (!KVC_API_HAS(cache_.api, release)) throw AbiError(KVC_ERR_UNSUPPORTED, "release: not provided");
    measured("release", [&] { check_status(cache_.api->release(cache_.handle, seq), "release"); });
}

} // namespace kvc::prop
