#include "kvcheck/properties/session.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/device_watch.hpp"
#include "kvcheck/properties/heap.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/tolerance.hpp"
#include "kvcheck/reference/dtype.hpp"
#include "lent.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>

namespace kvc::prop {

std::string storage_error_clause(uint32_t cache_dtype, const Mismatch& first) {
    return std::string("; the rows read back differ from the appended values rounded to ") + dtype_name(cache_dtype) +
           " (first: " + first.describe() + "): a storage error, not arithmetic (CACHE-CONTENT checks it)";
}

std::string Mismatch::describe() const {
    std::ostringstream s;
    s.precision(9); // enough to tell two floats apart
    s << what;
    if (op >= 0) s << " at op " << op;
    if (seq >= 0) s << ", seq " << seq;
    if (layer >= 0) s << ", layer " << layer;
    if (pos >= 0) s << ", position " << pos;
    if (head >= 0) s << ", head " << head;
    if (dim >= 0) s << ", dim " << dim;
    s << ": expected " << expected << ", got " << actual;
    return s.str();
}

float input_value(uint64_t seed, uint32_t op, uint32_t seq, uint32_t layer, uint32_t tok, uint32_t which,
                  uint32_t idx, uint32_t qstream) {
    // splitmix64 over the coordinates: stable across platforms and independent of evaluation order
    auto mix = [](uint64_t z) {
        z += 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    };
    uint64_t h = mix(seed);
    for (uint64_t x : {uint64_t(op), uint64_t(seq), uint64_t(layer), uint64_t(tok), uint64_t(which), uint64_t(idx),
                       uint64_t(qstream)})
        h = mix(h ^ x);
    // sum of three uniforms on (-1, 1), scaled to unit variance: bounded, bell-shaped, exact in float
    double s = 0;
    for (int i = 0; i < 3; ++i) {
        s += static_cast<double>(h & 0xFFFFF) / 0x80000 - 1.0;
        h >>= 21;
    }
    return static_cast<float>(s);
}

namespace {

// The harness's model of one (sequence, layer) stream.
struct Stream {
    std::vector<float> k_expect;      // [len][Hkv*d] as the oracle says it must be stored, widened to float
    std::vector<float> k_eff, v_eff;  // [len][Hkv*d] the stored values the oracle computes with
    std::vector<uint8_t> k_bits, v_bits; // [len][Hkv*d*s] bytes read back after the row's append
    uint32_t len = 0;
};

} // namespace

class Session::Impl {
public:
    Impl(const Target& t, const CaseConfig& cfg, uint64_t data_seed, const Checks& ch, QueryVariant qv)
        : t_(t), seed_(data_seed), ch_(ch), qv_(qv), cfg_(cfg), d_(cfg_.head_dim),
          row_(static_cast<size_t>(cfg_.n_kv_heads) * cfg_.head_dim), es_(dtype_size(cfg_.dtype)),
          streams_(cfg_.max_seqs, std::vector<Stream>(cfg_.n_layers)), owner_{t.api} {
        const bool device = t_.caps.memory_space == KVC_MEMORY_DEVICE;
        if (device && (ch_.heap || ch_.device_memory)) { // NO-Q and MEMORY hold device memory against the reports
            std::string why_not;
            device_ = DeviceWatch::open(&why_not);
            if (device_) {
                watch_ = Watch::Device;
                result_.watched = "device memory (" + device_->library() + ")";
            } else {
                result_.watch_not_run = why_not;
            }
        } else if (ch_.heap && !device) {
            if (!heap_accounting_exact())
                throw std::runtime_error(std::string("the allocator watch needs glibc's per-thread cache off: run "
                                                     "with GLIBC_TUNABLES=") + kExactHeapTunable +
                                         " (kvcheck sets it itself; see properties/include/kvcheck/properties/heap.hpp)");
            watch_ = Watch::Heap;
            result_.watched = "heap";
        }
        create();
    }

    void apply(const Op& op) {
        ++op_;
        std::vector<bool> touched(cfg_.max_seqs, false);
        switch (op.kind) {
        case OpKind::Append:
        case OpKind::AppendBatch: append(op, touched); break;
        case OpKind::Fork: fork(op, touched); break;
        case OpKind::Release: release(op, touched); break;
        }
        check_after_op(touched);
    }

    const RunResult& result() const { return result_; }

private:
    [[noreturn]] void fail(const std::string& reason, Mismatch m) {
        if (m.op < 0) m.op = op_;
        throw Violation(ch_.property, reason, std::move(m));
    }

    // ---- calls into the implementation ----
    // Every buffer a call is lent (lent.hpp) is checked right after it returns, before its status: writing outside
    // what the harness lent is a FAIL of the property that made the call, whatever the call returned.
    struct Lending {
        const Lent* buffer;
        const void* input; // what the payload must still equal (const inputs); nullptr for outputs
    };
    void check_lent(const char* call, std::initializer_list<Lending> lent) {
        for (const Lending& l : lent) {
            std::size_t bytes = 0;
            const std::string what = l.buffer->violation(call, l.input, &bytes);
            if (what.empty()) continue;
            Mismatch m;
            m.what = "bytes outside `" + l.buffer->name() + "`";
            m.expected = 0;
            m.actual = static_cast<double>(bytes);
            if (l.input != nullptr && what.rfind("wrote into", 0) == 0) m.what = "bytes of input `" + l.buffer->name() + "`";
            fail(what + ": an implementation may write only into the output buffers it is lent, within their size",
                 m);
        }
    }

    void check_status(kvc_status s, const char* call) const {
        if (s == KVC_OK) return;
        const char* msg = owner_.api->last_error(owner_.cache);
        throw AbiError(s, std::string(call) + " failed (" + status_name(s) + "): " + (msg ? msg : "(no message)"));
    }

    const kvc_plugin_api* api() const { return owner_.api; }

    void create() {
        const kvc_config abi = cfg_.to_abi();
        Lent config("kvc_config", sizeof abi, &abi), handle("create's out (kvc_cache*)", sizeof(kvc_cache*));
        kvc_cache* raw = nullptr;
        measured("create", [&] {
            const kvc_status s = api()->create(config.as<const kvc_config>(), handle.as<kvc_cache*>());
            check_lent("create", {{&config, &abi}, {&handle, nullptr}});
            std::memcpy(&raw, handle.data(), sizeof raw);
            if (s != KVC_OK || raw == nullptr) {
                const char* msg = api()->last_error(nullptr);
                const kvc_status st = s == KVC_OK ? KVC_ERR_INTERNAL : s; // OK with no handle is a broken promise
                throw AbiError(st, std::string("create failed (") + status_name(st) + (s == KVC_OK ? ", no handle" : "") +
                                       "): " + (msg ? msg : "(no message)"));
            }
            owner_.cache = raw;
        });
    }

    kvc_memory memory_report() {
        kvc_memory init{};
        init.struct_size = sizeof init;
        Lent m("kvc_memory", sizeof init, &init);
        const kvc_status s = api()->memory(owner_.cache, m.as<kvc_memory>());
        check_lent("memory", {{&m, nullptr}});
        check_status(s, "memory");
        kvc_memory out;
        std::memcpy(&out, m.data(), sizeof out);
        return out;
    }

    // Rows pos .. pos+n-1 of (seq, layer) into k and v (n * row bytes each).
    void read_rows(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<uint8_t>& k,
                   std::vector<uint8_t>& v) {
        Lent ko("k_out", k.size()), vo("v_out", v.size());
        measured("read_kv", [&] {
            const kvc_status s = api()->read_kv(owner_.cache, seq, layer, pos, n, ko.data(), vo.data());
            check_lent("read_kv", {{&ko, nullptr}, {&vo, nullptr}});
            check_status(s, "read_kv");
        });
        std::memcpy(k.data(), ko.data(), k.size());
        std::memcpy(v.data(), vo.data(), v.size());
    }

    // ---- the allocator watch (NO-Q; MEMORY too for DEVICE caches) ----
    // The same rules for the host heap and for device memory; only the slack differs (kHeapSlackBytes,
    // kDeviceSlackBytes: device memory comes in 2 MiB pages).
    // create() may allocate anything constant: K/V storage (capacity + pool), a declared workspace, and (ABI 1.0
    // plugins, which cannot declare one) an undeclared constant scratch; together at most kMaxWorkspaceBytes beyond
    // the K/V storage. From then on, every byte the allocator grows by must come with as much growth of the reported
    // capacity + pool + workspace: "unexplained" = allocator growth since create - reported growth since create,
    // and its largest rise above its lowest earlier value must stay within kHeapSlackBytes. Judging rises (not the
    // level) means storage reported but never allocated is no credit for hidden growth later, and one temporary
    // freed a call late is not summed up call after call. Hidden Q storage grows with the tokens appended; a
    // workspace does not: reported workspace must not change after create. One exception: a declared workspace may
    // be allocated when first needed (a scratch made on the first append), so what create() left unallocated of it
    // absorbs growth once, up to the declared bytes. That hides nothing an eager workspace could not hold.
    void after_call() {
        const kvc_memory m = memory_report();
        // Saturated at 2^61 each, so that absurd reports (2^64 - 1) read as huge, never wrap to "-2 bytes".
        const auto sat = [](uint64_t b) { return static_cast<int64_t>(std::min<uint64_t>(b, uint64_t{1} << 61)); };
        const int64_t kv = sat(m.capacity_bytes) + sat(m.pool_bytes);
        const int64_t reported = kv + sat(m.workspace_bytes);
        Mismatch mm;
        if (!watching_) { // the window around create()
            watching_ = true;
            workspace_ = m.workspace_bytes;
            create_unreported_ = grown_ - reported;
            workspace_credit_ = std::clamp<int64_t>(-create_unreported_, 0,
                                                    static_cast<int64_t>(std::min<uint64_t>(workspace_, 1ull << 61)));
            base_grown_ = grown_;
            base_reported_ = reported;
            result_.workspace_bytes = workspace_;
            result_.create_unreported_bytes = create_unreported_;
            const int64_t besides_kv = static_cast<int64_t>(std::min<uint64_t>(workspace_, uint64_t{1} << 62)) +
                                       std::max<int64_t>(create_unreported_, 0);
            if (m.workspace_bytes > kMaxWorkspaceBytes ||
                besides_kv > static_cast<int64_t>(kMaxWorkspaceBytes) + kHeapSlackBytes) {
                mm.what = "workspace bytes";
                mm.expected = static_cast<double>(kMaxWorkspaceBytes);
                mm.actual = static_cast<double>(besides_kv);
                fail("create() holds " + std::to_string(besides_kv) + " bytes besides its K/V storage (declared "
                     "workspace " + std::to_string(workspace_) + "): more than the 256 MiB a constant workspace may take",
                     mm);
            }
            check_kv_bound(m);
            return;
        }
        if (m.workspace_bytes != workspace_) {
            mm.what = "workspace_bytes";
            mm.expected = static_cast<double>(workspace_);
            mm.actual = static_cast<double>(m.workspace_bytes);
            fail("reported workspace changed after create (" + std::to_string(workspace_) + " -> " +
                     std::to_string(m.workspace_bytes) + " bytes): a workspace is constant; storage that grows with "
                     "the tokens appended is K/V (capacity, pool) or hidden storage",
                 mm);
        }
        const int64_t grown = grown_ - base_grown_, reported_growth = reported - base_reported_;
        const int64_t raw = grown - reported_growth; // the lazy workspace's credit absorbs growth, never a fall
        const int64_t unexplained = raw > 0 ? std::max<int64_t>(raw - workspace_credit_, 0) : raw;
        const int64_t rise = unexplained - lowest_unexplained_;
        result_.hidden_heap_bytes = std::max(result_.hidden_heap_bytes, rise);
        const bool blind = watch_ == Watch::Heap && heap_watch_blind_reason() != nullptr; // ASan: NO-Q's note
        const int64_t slack = watch_ == Watch::Device ? kDeviceSlackBytes : kHeapSlackBytes;
        if (rise > slack && !blind) {
            const bool dev = watch_ == Watch::Device;
            mm.what = std::string(dev ? "device" : "heap") + " bytes not explained by reported capacity + pool + "
                      "workspace";
            mm.expected = static_cast<double>(lowest_unexplained_ + reported_growth + slack);
            mm.actual = static_cast<double>(grown);
            fail(std::string("since create ") + (dev ? "device memory in use" : "the allocator") + " grew by " +
                     std::to_string(grown) + " bytes while the reported K/V storage and workspace grew by " +
                     std::to_string(reported_growth) + " bytes: " + std::to_string(rise) +
                     " bytes of hidden storage (caching Q, or K/V it does not report; allowed: a slack of " +
                     std::to_string(slack) + " bytes" +
                     (workspace_credit_ > 0 ? " and the " + std::to_string(workspace_credit_) +
                                                  " bytes of the declared workspace that create() did not allocate"
                                            : std::string()) +
                     ")",
                 mm);
        }
        lowest_unexplained_ = std::min(lowest_unexplained_, unexplained);
        check_kv_bound(m);
    }

    // pool_bytes is no free pass: capacity + pool may not exceed the K/V of every sequence at max_tokens in every
    // layer, in whole blocks of the reported size, twice (growth reserve), plus a page of alignment per block and a
    // first slab of 64 KiB.
    void check_kv_bound(const kvc_memory& m) {
        const uint64_t block = std::max<uint32_t>(m.block_size, 1u);
        const uint64_t blocks =
            static_cast<uint64_t>(cfg_.max_seqs) * cfg_.n_layers * ((cfg_.max_tokens + block - 1) / block);
        const long double bound = 2.0L * blocks * block * 2 * row_ * es_ + blocks * 4096.0L + 65536.0L;
        const long double kv = static_cast<long double>(m.capacity_bytes) + m.pool_bytes;
        if (kv <= bound) return;
        Mismatch mm;
        mm.what = "capacity_bytes + pool_bytes";
        mm.expected = static_cast<double>(bound);
        mm.actual = static_cast<double>(kv);
        fail("reported K/V storage (capacity + pool) exceeds twice the formula at max_seqs x max_tokens in whole "
             "blocks plus a page per block: pool_bytes is storage for K/V, not for anything else",
             mm);
    }

    // Every call into the implementation goes through here. The allocator (the host heap, or device memory for a
    // DEVICE cache: device_watch.hpp) is read just before and just after, so the harness's own allocations between
    // calls never count. The buffers a call is lent are allocated before its window opens.
    template <typename F>
    void measured(const char* name, F&& call) {
        const int64_t before = reading(name, "before");
        call();
        if (watch_ == Watch::None) return;
        grown_ += reading(name, "after") - before;
        after_call();
    }

    int64_t reading(const char* call, const char* when) const {
        switch (watch_) {
        case Watch::None: return 0;
        case Watch::Heap: return heap_in_use();
        case Watch::Device:
            try {
                return device_->used();
            } catch (const std::runtime_error& e) { // after a call: most likely a sticky error the call left
                throw AbiError(KVC_ERR_INTERNAL, std::string(e.what()) + " (" + when + " " + call + ")");
            }
        }
        return 0;
    }

    // ---- appends ----
    struct Pending {
        uint32_t seq, n_new, before;
        std::vector<float> q, k, v; // [n][Hq*d], [n][Hkv*d]
        bool extreme = false;       // a stale-slot trap (SeqAppend::extreme): not graded
        const Pending* call = nullptr; // a sampled row graded alone: the whole call it belongs to
    };

    Pending inputs(uint32_t seq, uint32_t n_new, uint32_t layer, bool extreme) const {
        Pending p{seq, n_new, streams_[seq][layer].len, {}, {}, {}, extreme};
        const uint32_t qs = (qv_.enabled && static_cast<uint32_t>(op_ % 2) != qv_.keep_parity) ? 1u : 0u;
        const size_t qrow = static_cast<size_t>(cfg_.n_q_heads) * d_;
        p.q.resize(n_new * qrow);
        p.k.resize(n_new * row_);
        p.v.resize(n_new * row_);
        const uint32_t o = static_cast<uint32_t>(op_);
        for (uint32_t i = 0; i < n_new; ++i) {
            for (size_t x = 0; x < qrow; ++x)
                p.q[i * qrow + x] = input_value(seed_, o, seq, layer, i, 0, static_cast<uint32_t>(x), qs);
            for (size_t x = 0; x < row_; ++x) {
                p.k[i * row_ + x] = input_value(seed_, o, seq, layer, i, 1, static_cast<uint32_t>(x));
                p.v[i * row_ + x] = input_value(seed_, o, seq, layer, i, 2, static_cast<uint32_t>(x));
                if (extreme) { // 2^14 with the drawn sign: exact in f16 and bf16, and a rotated pair stays < 65504
                    p.k[i * row_ + x] = std::copysign(kExtremeValue, p.k[i * row_ + x]);
                    p.v[i * row_ + x] = std::copysign(kExtremeValue, p.v[i * row_ + x]);
                }
            }
        }
        return p;
    }

    void append(const Op& op, std::vector<bool>& touched) {
        std::vector<uint32_t> order = op.layer_order;
        if (order.empty()) {
            order.resize(cfg_.n_layers);
            std::iota(order.begin(), order.end(), 0u);
        }
        for (const SeqAppend& a : op.appends) touched[a.seq] = true;
        for (uint32_t layer : order) {
            std::vector<Pending> ps;
            for (const SeqAppend& a : op.appends) ps.push_back(inputs(a.seq, a.n_new, layer, a.extreme));
            std::vector<std::vector<float>> outs(ps.size());
            if (op.kind == OpKind::Append) { // one call per sequence (BATCH runs its batches this way to compare)
                for (size_t i = 0; i < ps.size(); ++i) {
                    Pending& p = ps[i];
                    Lent q("q", bytes_of(p.q), p.q.data()), k("k", bytes_of(p.k), p.k.data()),
                        v("v", bytes_of(p.v), p.v.data()), out("out", bytes_of(p.q));
                    measured("append_attend", [&] {
                        const kvc_status st = api()->append_attend(owner_.cache, p.seq, layer, p.n_new,
                                                                   q.as<const float>(), k.as<const float>(),
                                                                   v.as<const float>(), out.as<float>());
                        check_lent("append_attend",
                                   {{&q, p.q.data()}, {&k, p.k.data()}, {&v, p.v.data()}, {&out, nullptr}});
                        check_status(st, "append_attend");
                    });
                    outs[i].assign(out.as<float>(), out.as<float>() + p.q.size());
                    bury({&q, &k, &v, &out});
                }
            } else {
                call_batch(layer, ps, outs);
            }
            for (size_t i = 0; i < ps.size(); ++i) record(ps[i], layer, outs[i]);
        }
    }

    static std::size_t bytes_of(const std::vector<float>& x) { return x.size() * sizeof(float); }

    void call_batch(uint32_t layer, std::vector<Pending>& ps, std::vector<std::vector<float>>& outs) {
        std::vector<uint32_t> ids, offs{0};
        std::vector<float> q, k, v;
        for (const Pending& p : ps) {
            ids.push_back(p.seq);
            offs.push_back(offs.back() + p.n_new);
            q.insert(q.end(), p.q.begin(), p.q.end());
            k.insert(k.end(), p.k.begin(), p.k.end());
            v.insert(v.end(), p.v.begin(), p.v.end());
        }
        if (!KVC_API_HAS(api(), append_attend_batch))
            throw AbiError(KVC_ERR_UNSUPPORTED, "append_attend_batch: not provided");
        Lent lq("batch q", bytes_of(q), q.data()), lk("batch k", bytes_of(k), k.data()),
            lv("batch v", bytes_of(v), v.data()), lout("batch out", bytes_of(q)),
            lids("batch seq_ids", ids.size() * sizeof(uint32_t), ids.data()),
            loffs("batch token_offsets", offs.size() * sizeof(uint32_t), offs.data());
        kvc_batch b{};
        b.struct_size = sizeof b;
        b.n_seqs = static_cast<uint32_t>(ps.size());
        b.seq_ids = lids.as<const uint32_t>();
        b.token_offsets = loffs.as<const uint32_t>();
        b.q = lq.as<const float>();
        b.k = lk.as<const float>();
        b.v = lv.as<const float>();
        b.out = lout.as<float>();
        Lent lb("kvc_batch", sizeof b, &b);
        measured("append_attend_batch", [&] {
            const kvc_status st = api()->append_attend_batch(owner_.cache, layer, lb.as<const kvc_batch>());
            check_lent("append_attend_batch", {{&lb, &b}, {&lids, ids.data()}, {&loffs, offs.data()}, {&lq, q.data()},
                                               {&lk, k.data()}, {&lv, v.data()}, {&lout, nullptr}});
            check_status(st, "append_attend_batch");
        });
        const size_t qrow = static_cast<size_t>(cfg_.n_q_heads) * d_;
        const float* out = lout.as<const float>();
        for (size_t i = 0; i < ps.size(); ++i) outs[i].assign(out + offs[i] * qrow, out + offs[i + 1] * qrow);
        bury({&lq, &lk, &lv, &lout, &lids, &loffs, &lb});
    }

    // After a call the harness poisons every buffer it lent and keeps it alive until the cache is destroyed, so an
    // implementation that kept a pointer reads NaN later instead of silently reading stale inputs (NO-Q part 3).
    void bury(std::initializer_list<Lent*> lent) {
        for (Lent* l : lent) {
            l->poison();
            graveyard_.push_back(std::move(*l));
        }
    }

    // Update the model with the new rows, read them back, grade the outputs.
    void record(const Pending& p, uint32_t layer, const std::vector<float>& out) {
        Stream& s = streams_[p.seq][layer];
        result_.outputs[{op_, layer, p.seq}] = out;
        if (p.n_new == 0) return;
        const size_t rb = row_ * es_;
        std::vector<uint8_t> kb(p.n_new * rb), vb(p.n_new * rb);
        read_rows(p.seq, layer, p.before, p.n_new, kb, vb);
        std::vector<float> kr(row_), kx(row_); // rotated (long double, to float), and rounded to the cache dtype
        const uint32_t rope_stage = declared_pipeline(t_.caps).rope;
        for (uint32_t i = 0; i < p.n_new; ++i) {
            const uint32_t pos = p.before + i;
            expected_rotated_key(cfg_, p.k.data() + i * row_, pos, kr.data());
            for (size_t x = 0; x < row_; ++x) kx[x] = ref::round_to_dtype(kr[x], cfg_.dtype);
            for (size_t x = 0; x < row_; ++x) {
                uint8_t want_k[4], want_v[4];
                ref::store_dtype(kx[x], cfg_.dtype, want_k);
                ref::store_dtype(p.v[i * row_ + x], cfg_.dtype, want_v);
                const uint8_t* got_k = kb.data() + (i * row_ + x) * es_;
                const uint8_t* got_v = vb.data() + (i * row_ + x) * es_;
                const float gk = ref::load_dtype(got_k, cfg_.dtype), gv = ref::load_dtype(got_v, cfg_.dtype);
                // a key the implementation rotated itself may be the rounding of any rotation within an ordinary
                // f32 rotation's error (stored_key_acceptable); without RoPE the stored bits are exact
                const bool k_ok = std::memcmp(want_k, got_k, es_) == 0 ||
                                  (cfg_.rope != KVC_ROPE_NONE &&
                                   stored_key_acceptable(cfg_, rope_stage, p.k.data() + i * row_, pos,
                                                         static_cast<uint32_t>(x), kr[x], gk));
                const bool v_ok = std::memcmp(want_v, got_v, es_) == 0;
                s.k_eff.push_back(k_ok ? gk : kx[x]);
                s.v_eff.push_back(ref::load_dtype(want_v, cfg_.dtype));
                if (!k_ok || !v_ok) {
                    Mismatch m;
                    m.seq = static_cast<int>(p.seq);
                    m.layer = static_cast<int>(layer);
                    m.pos = static_cast<int>(pos);
                    m.head = static_cast<int>(x / d_);
                    m.dim = static_cast<int>(x % d_);
                    m.what = !k_ok ? "k" : "v";
                    m.expected = !k_ok ? kx[x] : ref::load_dtype(want_v, cfg_.dtype);
                    m.actual = !k_ok ? gk : gv;
                    if (!ch_.content) { // EQUIV's diagnosis names the first
                        if (!storage_mismatch_) storage_mismatch_ = m;
                        continue;
                    }
                    fail(std::string("read-back ") + m.what + " differs from the appended value rounded to " +
                             dtype_name(cfg_.dtype) +
                             (cfg_.rope != KVC_ROPE_NONE && !k_ok
                                  ? " and rotated (not the rounding of an f32 rotation, nor within the bound of the "
                                    "declared RoPE stage)"
                                  : " (bitwise)"),
                         m);
                }
            }
        }
        s.k_expect.insert(s.k_expect.end(), kx.begin(), kx.end());
        s.k_bits.insert(s.k_bits.end(), kb.begin(), kb.end());
        s.v_bits.insert(s.v_bits.end(), vb.begin(), vb.end());
        s.len += p.n_new;
        if (ch_.equiv && !p.extreme) grade_rows(p, layer, out);
    }

    // Grades a call's outputs: every row when the oracle's cost (n_new * T * Hq * d, in long double) is small, and
    // otherwise a sample of rows, each graded as a one-row call over the history truncated after it (its own
    // expectation exactly): the first and last rows, rows at 63/64/65 and around 2^k and 512 cached tokens, and a few
    // more drawn from the case's seed.
    void grade_rows(const Pending& p, uint32_t layer, const std::vector<float>& out) {
        Stream& s = streams_[p.seq][layer];
        const uint64_t cost = static_cast<uint64_t>(p.n_new) * s.len * cfg_.n_q_heads * d_;
        if (cost <= kFullGradeCost) return grade(p, layer, out);
        std::vector<uint32_t> rows = {0, 1, 62, 63, 64, 65, p.n_new - 2, p.n_new - 1};
        for (uint32_t k = 8; k <= 16; ++k)
            for (int64_t off : {-1, 0, 1}) {
                const int64_t r = (int64_t{1} << k) + off - 1 - p.before; // position 2^k + off is row r
                if (r >= 0 && r < p.n_new) rows.push_back(static_cast<uint32_t>(r));
            }
        uint64_t h = seed_ ^ (static_cast<uint64_t>(op_) << 40) ^ (static_cast<uint64_t>(layer) << 20) ^ p.seq;
        for (uint32_t k = 0; k < kSampledRows; ++k) { // a 64-bit LCG: the same rows every replay
            h = h * 6364136223846793005ull + 1442695040888963407ull;
            rows.push_back(static_cast<uint32_t>((h >> 33) % p.n_new));
        }
        std::sort(rows.begin(), rows.end());
        rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
        const size_t qrow = static_cast<size_t>(cfg_.n_q_heads) * d_;
        const uint32_t len = s.len;
        struct Restore { // grade() reads the stream's length as the history: give it the row's own
            Stream& s;
            uint32_t len;
            ~Restore() { s.len = len; }
        } restore{s, len};
        for (uint32_t i : rows) {
            if (i >= p.n_new) continue;
            Pending one{p.seq, 1, p.before + i, {}, {}, {}, false, &p};
            one.q.assign(p.q.begin() + static_cast<std::ptrdiff_t>(i * qrow), p.q.begin() + static_cast<std::ptrdiff_t>((i + 1) * qrow));
            one.k.assign(p.k.begin() + static_cast<std::ptrdiff_t>(i * row_), p.k.begin() + static_cast<std::ptrdiff_t>((i + 1) * row_));
            one.v.assign(p.v.begin() + static_cast<std::ptrdiff_t>(i * row_), p.v.begin() + static_cast<std::ptrdiff_t>((i + 1) * row_));
            const std::vector<float> o(out.begin() + static_cast<std::ptrdiff_t>(i * qrow),
                                       out.begin() + static_cast<std::ptrdiff_t>((i + 1) * qrow));
            s.len = p.before + i + 1;
            grade(one, layer, o);
        }
    }

    // The rows the call's queries attend, with its new rows as given (rotated, unrounded): what a pipeline with
    // KVC_PIPELINE_NEW_ROWS_UNROUNDED computes with.
    // A sampled row (p.call set) sees the earlier rows of its call unrounded too. Returns the rows and how many of
    // the last ones are unrounded.
    std::pair<std::vector<float>, std::vector<float>> with_unrounded_new_rows(const Pending& p, const Stream& s,
                                                                              uint32_t& n_unrounded) const {
        const Pending& call = p.call ? *p.call : p;
        n_unrounded = s.len - call.before; // the call's rows up to this one (s.len = the history this row sees)
        std::vector<float> k(s.k_eff.begin(), s.k_eff.begin() + static_cast<std::ptrdiff_t>(s.len * row_));
        std::vector<float> v(s.v_eff.begin(), s.v_eff.begin() + static_cast<std::ptrdiff_t>(s.len * row_));
        const size_t first = static_cast<size_t>(call.before) * row_;
        for (uint32_t i = 0; i < n_unrounded; ++i)
            expected_rotated_key(cfg_, call.k.data() + i * row_, call.before + i, k.data() + first + i * row_);
        std::copy(call.v.begin(), call.v.begin() + static_cast<std::ptrdiff_t>(n_unrounded * row_),
                  v.begin() + static_cast<std::ptrdiff_t>(first));
        return {std::move(k), std::move(v)};
    }

    void grade(const Pending& p, uint32_t layer, const std::vector<float>& out) {
        const Stream& s = streams_[p.seq][layer];
        const Pipeline pipe = declared_pipeline(t_.caps);
        const bool narrow_cache = cfg_.dtype != KVC_DTYPE_F32;
        const auto unrounded = [&] {
            uint32_t n_unrounded = 0;
            const auto kv = with_unrounded_new_rows(p, s, n_unrounded);
            return expect_outputs(cfg_, p.q.data(), p.n_new, kv.first, kv.second, s.len, HeadMap::Repeat,
                                  n_unrounded);
        };
        // an implementation is graded for the pipeline it declares, new rows unrounded included
        const bool declared_unrounded = pipe.new_rows_unrounded && narrow_cache;
        const Expected e =
            declared_unrounded ? unrounded() : expect_outputs(cfg_, p.q.data(), p.n_new, s.k_eff, s.v_eff, s.len);
        const bool stored_right = !storage_mismatch_; // else the storage, not a pipeline, is named
        Grade g = grade_outputs(cfg_, pipe, out.data(), e, nullptr, stored_right);
        result_.headroom = std::max(result_.headroom, g.headroom);
        result_.fails_f32_class = result_.fails_f32_class || g.fails_f32_class;
        if (g.pass) return;
        if (narrow_cache && !declared_unrounded && !g.nan) { // is it the new rows attended before rounding?
            const Expected alt = unrounded();
            g = grade_outputs(cfg_, pipe, out.data(), e, &alt, stored_right);
        }
        Mismatch m;
        m.what = "output";
        m.seq = static_cast<int>(p.seq);
        m.layer = static_cast<int>(layer);
        m.pos = static_cast<int>(p.before + g.worst.token);
        m.head = static_cast<int>(g.worst.head);
        m.dim = static_cast<int>(g.worst.dim);
        m.expected = g.worst.expected;
        m.actual = g.worst.actual;
        std::string reason = g.message;
        if (storage_mismatch_) reason += storage_error_clause(cfg_.dtype, *storage_mismatch_);
        if (ch_.diagnose_heads && cfg_.n_kv_heads < cfg_.n_q_heads && cfg_.n_kv_heads > 1) {
            const Expected tile = expect_outputs(cfg_, p.q.data(), p.n_new, s.k_eff, s.v_eff, s.len, HeadMap::Tile);
            if (grade_outputs(cfg_, pipe, out.data(), tile).pass)
                reason += "; the outputs match query head h reading KV head h % n_kv_heads ('tile') instead of "
                          "h / (n_q_heads / n_kv_heads) ('repeat')";
        }
        if (ch_.diagnose_layers)
            for (uint32_t other = 0; other < cfg_.n_layers; ++other) {
                const Stream& o = streams_[p.seq][other];
                if (other == layer || o.len != s.len) continue;
                const Expected e2 = expect_outputs(cfg_, p.q.data(), p.n_new, o.k_eff, o.v_eff, o.len);
                if (grade_outputs(cfg_, pipe, out.data(), e2).pass) {
                    reason += "; layer " + std::to_string(layer) + "'s outputs match layer " + std::to_string(other) +
                              "'s history: one layer's cache is used for another";
                    break;
                }
            }
        fail(reason, m);
    }

    // ---- fork and release ----
    void fork(const Op& op, std::vector<bool>& touched) {
        touched[op.child] = true;
        forked_ = true;
        if (!KVC_API_HAS(api(), fork)) throw AbiError(KVC_ERR_UNSUPPORTED, "fork: not provided");
        measured("fork", [&] { check_status(api()->fork(owner_.cache, op.seq, op.child), "fork"); });
        for (uint32_t l = 0; l < cfg_.n_layers; ++l) streams_[op.child][l] = streams_[op.seq][l];
        if (ch_.fork_shares)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l) compare_rows(op.child, l, "a forked child's rows differ from its parent's");
    }

    void release(const Op& op, std::vector<bool>& touched) {
        touched[op.seq] = true;
        if (!KVC_API_HAS(api(), release)) throw AbiError(KVC_ERR_UNSUPPORTED, "release: not provided");
        measured("release", [&] { check_status(api()->release(owner_.cache, op.seq), "release"); });
        for (uint32_t l = 0; l < cfg_.n_layers; ++l) streams_[op.seq][l] = Stream{};
    }

    // ---- checks after every op ----
    void compare_rows(uint32_t seq, uint32_t layer, const std::string& reason) {
        const Stream& s = streams_[seq][layer];
        if (s.len == 0) return;
        std::vector<uint8_t> kb(s.k_bits.size()), vb(s.v_bits.size());
        read_rows(seq, layer, 0, s.len, kb, vb);
        for (int pass = 0; pass < 2; ++pass) {
            const auto& want = pass == 0 ? s.k_bits : s.v_bits;
            const auto& got = pass == 0 ? kb : vb;
            if (want == got) continue;
            const size_t byte = static_cast<size_t>(std::mismatch(want.begin(), want.end(), got.begin()).first - want.begin());
            const size_t el = byte / es_;
            Mismatch m;
            m.what = pass == 0 ? "k" : "v";
            m.seq = static_cast<int>(seq);
            m.layer = static_cast<int>(layer);
            m.pos = static_cast<int>(el / row_);
            m.head = static_cast<int>(el % row_ / d_);
            m.dim = static_cast<int>(el % d_);
            m.expected = ref::load_dtype(want.data() + el * es_, cfg_.dtype);
            m.actual = ref::load_dtype(got.data() + el * es_, cfg_.dtype);
            fail(reason, m);
        }
    }

    void check_after_op(const std::vector<bool>& touched) {
        for (uint32_t seq = 0; seq < cfg_.max_seqs; ++seq)
            for (uint32_t l = 0; l < cfg_.n_layers; ++l) {
                if (ch_.all_unchanged || (ch_.others_unchanged && !touched[seq]))
                    compare_rows(seq, l, "a row read back earlier changed: the past of the cache was rewritten");
                if (ch_.lengths) {
                    uint32_t len = 0;
                    Lent out("seq_length's out", sizeof len);
                    measured("seq_length", [&] {
                        const kvc_status st = api()->seq_length(owner_.cache, seq, l, out.as<uint32_t>());
                        check_lent("seq_length", {{&out, nullptr}});
                        check_status(st, "seq_length");
                    });
                    std::memcpy(&len, out.data(), sizeof len);
                    if (len != streams_[seq][l].len) {
                        Mismatch m;
                        m.what = "seq_length";
                        m.seq = static_cast<int>(seq);
                        m.layer = static_cast<int>(l);
                        m.expected = streams_[seq][l].len;
                        m.actual = len;
                        fail("the sequence's length differs from the number of rows appended since it was started",
                             m);
                    }
                }
            }
        if (ch_.memory) check_memory();
    }

    void check_memory() {
        const kvc_memory m = memory_report();
        const uint64_t row_bytes = 2ull * row_ * es_;
        const uint64_t block = std::max<uint32_t>(m.block_size, 1u);
        uint64_t live = 0, bound = 0;
        for (const auto& seq : streams_)
            for (const Stream& s : seq) {
                live += s.len * row_bytes;
                bound += (s.len + block - 1) / block * block * row_bytes;
            }
        Mismatch mm;
        if (m.live_bytes != live) {
            mm.what = "live_bytes";
            mm.expected = static_cast<double>(live);
            mm.actual = static_cast<double>(m.live_bytes);
            fail("reported live bytes differ from 2 * tokens * n_kv_heads * head_dim * sizeof(dtype)", mm);
        }
        if (m.capacity_bytes > bound) {
            mm.what = "capacity_bytes";
            mm.expected = static_cast<double>(bound);
            mm.actual = static_cast<double>(m.capacity_bytes);
            fail("reported capacity exceeds the formula rounded up to whole blocks of " + std::to_string(block) +
                     " tokens per sequence and layer",
                 mm);
        }
        // without sharing (no fork yet) the live rows need at least their own bytes
        if (!forked_ && m.capacity_bytes < live) {
            mm.what = "capacity_bytes";
            mm.expected = static_cast<double>(live);
            mm.actual = static_cast<double>(m.capacity_bytes);
            fail("reported capacity is smaller than the live bytes although no storage is shared (no fork yet)", mm);
        }
        if (m.block_size == 0 || (cfg_.max_tokens > 0 && m.block_size > std::max(cfg_.max_tokens, 1u))) {
            mm.what = "block_size";
            mm.expected = 1;
            mm.actual = m.block_size;
            fail("reported block size must be between 1 and max_tokens", mm);
        }
    }

    const Target& t_;
    const uint64_t seed_;
    const Checks ch_;
    QueryVariant qv_;
    const CaseConfig cfg_;
    const uint32_t d_;
    const size_t row_, es_;
    std::vector<std::vector<Stream>> streams_; // [seq][layer]
    std::vector<Lent> graveyard_; // poisoned buffers, alive until the cache is gone (declared before owner_)
    // The cache instance; destroyed before the graveyard (members are destroyed in reverse order).
    struct Owner {
        const kvc_plugin_api* api;
        kvc_cache* cache = nullptr;
        explicit Owner(const kvc_plugin_api* a) : api(a) {}
        Owner(const Owner&) = delete;
        Owner& operator=(const Owner&) = delete;
        ~Owner() {
            if (cache) api->destroy(cache);
        }
    } owner_;
    enum class Watch { None, Heap, Device } watch_ = Watch::None; // what measured() reads around every call
    std::shared_ptr<DeviceWatch> device_;
    int64_t grown_ = 0; // allocator growth summed over the windows around calls
    bool watching_ = false;          // the create() window has been judged
    uint64_t workspace_ = 0;         // reported right after create; constant from then on
    int64_t create_unreported_ = 0;  // what create() allocated beyond its report (an undeclared constant scratch)
    std::optional<Mismatch> storage_mismatch_; // the first element read back unlike the appended one, when
                                               // CACHE-CONTENT is off (EQUIV's diagnosis names it)
    int64_t workspace_credit_ = 0;   // the declared workspace create() did not allocate (allocated when first needed)
    int64_t base_grown_ = 0, base_reported_ = 0; // right after create
    int64_t lowest_unexplained_ = 0; // the lowest value of (growth - reported growth) since create
    bool forked_ = false; // storage may be shared from the first fork on
    int op_ = -1;
    RunResult result_;
};

Session::Session(const Target& target, const CaseConfig& cfg, uint64_t data_seed, const Checks& checks,
                 QueryVariant variant)
    : impl_(std::make_unique<Impl>(target, cfg, data_seed, checks, variant)) {}
Session::~Session() = default;
void Session::apply(const Op& op) { impl_->apply(op); }
const RunResult& Session::result() const { return impl_->result(); }

RunResult run_script(const Target& target, const Case& c, const Checks& checks, QueryVariant variant) {
    Session s(target, c.cfg, c.data_seed, checks, variant);
    for (const Op& op : c.ops) s.apply(op);
    return s.result();
}

} // namespace kvc::prop
