// The server's session (reading requests, replying) and the operation level's calls: each buffer the call driver
// would lend is lent as a guarded copy, checked after the call, then buried (server_core.hpp).
#include "server_core.hpp"

namespace kvc::pipe {
namespace served {
namespace {

// Blocking exact read; false at an end or an error (`*got` says how far it came).
bool read_exact(int fd, unsigned char* p, std::size_t n, std::size_t* got) {
    *got = 0;
    while (*got < n) {
        const ssize_t r = ::read(fd, p + *got, n - *got);
        if (r > 0) *got += static_cast<std::size_t>(r);
        else if (r == 0 || errno != EINTR) return false;
    }
    return true;
}

bool write_all(int fd, struct iovec* iov, int n) {
    int i = 0;
    while (i < n) {
        if (iov[i].iov_len == 0) {
            ++i;
            continue;
        }
        const ssize_t w = ::writev(fd, iov + i, n - i);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        std::size_t done = static_cast<std::size_t>(w);
        while (i < n && done >= iov[i].iov_len) done -= iov[i++].iov_len;
        if (i < n) {
            iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + done;
            iov[i].iov_len -= done;
        }
    }
    return true;
}

} // namespace

int Server::run() {
    for (;;) {
        unsigned char head[kHeaderBytes];
        std::size_t got = 0;
        if (!read_exact(in_, head, sizeof head, &got)) {
            if (got == 0) return 0; // kvcheck closed the pipe: the end of the session
            return protocol_error("a short request header (%zu of 16 bytes)", got);
        }
        const Header h = decode_header(head);
        if (h.magic != kMagic || h.reserved != 0 || (h.opcode & kReplyBit) ||
            std::strcmp(opcode_name(h.opcode), "unknown") == 0)
            return protocol_error("a request header that is not the protocol (magic 0x%08x, opcode %u)", h.magic,
                                  h.opcode);
        if (h.length > kMaxPayloadBytes) return protocol_error("a request of %u bytes (at most 1 GiB)", h.length);
        req_ = request_buf_.reserve(h.length);
        if (!read_exact(in_, req_, h.length, &got))
            return protocol_error("a short request (%zu of %u bytes)", got, h.length);
        seq_ = h.seq;
        op_ = h.opcode;
        len_ = h.length;
        n_violations_ = 0;
        if (!dispatch()) return 2;
    }
}

bool Server::reply(kvc_status st, const char* message, struct iovec* body, int n_body) {
    char converted[kMaxMessageBytes];
    if (n_violations_ > 0 && minor_ < kLentReportMinor) {
        // A peer below 1.4 cannot be told in the prefix: the call fails with the guards' words instead.
        std::snprintf(converted, sizeof converted, "kvcheck serve-plugin: the plugin %.*s",
                      static_cast<int>(violations_[0].length), violations_[0].what);
        st = KVC_ERR_INTERNAL;
        message = converted;
        n_violations_ = 0;
    }
    const uint64_t reading = o_.reading ? o_.reading() : kNoReading;
    unsigned char head[kHeaderBytes + kReplyPrefixBytes], mlen_bytes[4];
    unsigned char block[4 + kMaxLentViolations * kLentViolationHeadBytes];
    std::size_t length = kReplyPrefixBytes;
    uint32_t mlen = 0;
    struct iovec all[8 + 3 * kMaxLentViolations];
    int n = 0;
    all[n++] = {head, kHeaderBytes + kReplyPrefixBytes};
    if (n_violations_ > 0) {
        put_u32(block, static_cast<uint32_t>(n_violations_));
        all[n++] = {block, 4};
        for (std::size_t i = 0; i < n_violations_; ++i) {
            const Violation& v = violations_[i];
            unsigned char* h = block + 4 + i * kLentViolationHeadBytes;
            const uint32_t name_len = static_cast<uint32_t>(std::min<std::size_t>(std::strlen(v.buffer), kMaxNameBytes));
            put_u64(h, v.bytes);
            put_u32(h + 8, name_len);
            put_u32(h + 12, v.length);
            all[n++] = {h, kLentViolationHeadBytes};
            all[n++] = {const_cast<char*>(v.buffer), name_len};
            all[n++] = {const_cast<char*>(v.what), v.length};
        }
        for (int i = 1; i < n; ++i) length += all[i].iov_len;
    }
    if (st != KVC_OK) {
        mlen = static_cast<uint32_t>(std::min<std::size_t>(std::strlen(message), kMaxMessageBytes));
        length += 4 + mlen;
        put_u32(mlen_bytes, mlen);
        all[n++] = {mlen_bytes, 4};
        all[n++] = {const_cast<char*>(message), mlen};
    } else {
        for (int i = 0; i < n_body; ++i) {
            length += body[i].iov_len;
            all[n++] = body[i];
        }
    }
    Header h;
    h.opcode = static_cast<uint16_t>(op_ | kReplyBit);
    h.seq = seq_;
    h.length = static_cast<uint32_t>(length);
    encode_header(h, head);
    put_u32(head + kHeaderBytes, st);
    put_u32(head + kHeaderBytes + 4, n_violations_ > 0 ? kReplyLentViolations : 0);
    put_u64(head + kHeaderBytes + 8, reading);
    if (!write_all(out_, all, n)) {
        std::fprintf(stderr, "kvcheck serve-plugin: cannot write the reply to %s (%s)\n", opcode_name(op_),
                     std::strerror(errno));
        return false;
    }
    return true;
}

bool Server::dispatch() {
    if (op_ == kHello) {
        if (len_ != kHelloRequestBytes) return wrong_length(kHelloRequestBytes);
        if (!o_.load_error.empty()) {
            error(KVC_ERR_UNSUPPORTED, o_.load_error.c_str());
            return false;
        }
        // The connection speaks the lower of kvcheck's minor and the one that carries the plugin's ABI.
        // (a plugin with the model table only is served at this kvcheck's minor: no operation frame to age)
        const uint32_t asked = get_u32(req_ + 4), own = api_ ? protocol_minor_of(api_->abi_minor) : kProtocolMinor;
        minor_ = asked < own ? asked : own;
        unsigned char b[kHelloReplyBytes] = {};
        put_u32(b, kProtocolMajor);
        put_u32(b + 4, minor_);
        const char* name = api_ ? api_->name : model_->name;
        const char* version = api_ ? api_->version : model_->version;
        std::strncpy(reinterpret_cast<char*>(b + 8), name ? name : "(unnamed)", kMaxNameBytes);
        std::strncpy(reinterpret_cast<char*>(b + 8 + kMaxNameBytes), version ? version : "", kMaxNameBytes);
        struct iovec v{b, sizeof b};
        return ok(&v, 1);
    }
    if (is_model_opcode(op_)) return model_dispatch();
    if (!api_ && model_)
        return error(KVC_ERR_UNSUPPORTED, "the plugin exports no operation-level table (" KVC_ENTRY_SYMBOL ")");
    if (!api_) return error(KVC_ERR_INTERNAL, "no plugin");
    switch (op_) {
    case kGetCaps: {
        if (len_ != 0) return wrong_length(0);
        unsigned char b[kCapsReplyBytes];
        encode_caps(caps_, minor_, b);
        struct iovec v{b, caps_reply_bytes(minor_)};
        return ok(&v, 1);
    }
    case kCreate: return create();
    case kDestroy: {
        if (len_ != kCacheRequestBytes) return wrong_length(kCacheRequestBytes);
        Served* s = cache_at(0);
        if (s) {
            api_->destroy(s->cache);
            s->cache = nullptr;
        }
        forget_graveyard_when_idle();
        return ok();
    }
    case kAppendAttend: return append();
    case kAppendAttendBatch: return batch();
    case kReadKv:
    case kReadKvScales: return read();
    case kSeqLength: {
        if (len_ != kSeqLengthRequestBytes) return wrong_length(kSeqLengthRequestBytes);
        Served* s = cache_at(0);
        if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
        Lent n("seq_length's out", sizeof(uint32_t));
        const kvc_status st = lent_call("seq_length", [&] {
            return api_->seq_length(s->cache, get_u32(req_ + 8), get_u32(req_ + 12), n.as<uint32_t>());
        });
        check_lent("seq_length", {{&n, nullptr}});
        uint32_t length = 0;
        std::memcpy(&length, n.data(), sizeof length);
        unsigned char b[kSeqLengthReplyBytes] = {};
        put_u32(b, length);
        struct iovec v{b, sizeof b};
        const bool sent = status(st, s->cache, &v, 1);
        bury({&n});
        return sent;
    }
    case kMemory: {
        if (len_ != kCacheRequestBytes) return wrong_length(kCacheRequestBytes);
        Served* s = cache_at(0);
        if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
        kvc_memory init{};
        init.struct_size = sizeof init;
        Lent lm("kvc_memory", sizeof init, &init);
        const kvc_status st = lent_call("memory", [&] { return api_->memory(s->cache, lm.as<kvc_memory>()); });
        check_lent("memory", {{&lm, nullptr}});
        kvc_memory m;
        std::memcpy(&m, lm.data(), sizeof m);
        bury({&lm});
        unsigned char b[kMemoryReplyBytes] = {};
        put_u32(b, m.block_size);
        put_u64(b + 8, m.live_bytes);
        put_u64(b + 16, m.capacity_bytes);
        put_u64(b + 24, m.pool_bytes);
        put_u64(b + 32, m.workspace_bytes);
        struct iovec v{b, sizeof b};
        return status(st, s->cache, &v, 1);
    }
    case kFork:
    case kRelease: {
        if (len_ != kPairRequestBytes) return wrong_length(kPairRequestBytes);
        Served* s = cache_at(0);
        if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
        const bool fork = op_ == kFork;
        if (fork ? !KVC_API_HAS(api_, fork) : !KVC_API_HAS(api_, release))
            return error(KVC_ERR_UNSUPPORTED, "not provided by the plugin");
        errno = 0;
        const kvc_status st = fork ? api_->fork(s->cache, get_u32(req_ + 8), get_u32(req_ + 12))
                                   : api_->release(s->cache, get_u32(req_ + 8));
        prop::note_if_refused(st, errno);
        return status(st, s->cache);
    }
    }
    return error(KVC_ERR_INVALID_ARGUMENT, "unknown opcode");
}

bool Server::create() {
    const std::size_t fixed = config_bytes(minor_);
    if (len_ < fixed) return wrong_length(fixed);
    ConfigArrays a;
    kvc_config c = decode_config(req_, minor_, &a);
    if (len_ != fixed + a.bytes()) return wrong_length(fixed + a.bytes());
    if (a.n_windows != 0 && a.n_windows != c.n_layers)
        return error(KVC_ERR_INVALID_ARGUMENT, "kvcheck serve-plugin: n_windows is neither 0 nor n_layers");
    int free_slot = -1;
    for (int i = 0; i < kMaxCaches && free_slot < 0; ++i)
        if (!caches_[i].cache) free_slot = i;
    if (free_slot < 0) return error(KVC_ERR_OUT_OF_MEMORY, "kvcheck serve-plugin holds at most 256 caches");
    // The plugin gets copies of the config and its arrays, as from the call driver: kept pointers read NaN later.
    const unsigned char* scales = req_ + fixed;
    Lent ks("k_scales", a.n_scales * 4u, scales), vs("v_scales", a.n_scales * 4u, scales + a.n_scales * 4u),
        win("windows", a.n_windows * 4u, scales + a.n_scales * 8u);
    if (a.n_scales) {
        c.k_scales = ks.as<const float>();
        c.v_scales = vs.as<const float>();
    }
    if (a.n_windows) c.windows = win.as<const uint32_t>();
    Lent config("kvc_config", sizeof c, &c), handle("create's out (kvc_cache*)", sizeof(kvc_cache*));
    const kvc_status st = lent_call("create", [&] {
        return api_->create(config.as<const kvc_config>(), handle.as<kvc_cache*>());
    });
    check_lent("create", {{&config, &c},
                          {&handle, nullptr},
                          {&ks, a.n_scales ? scales : nullptr},
                          {&vs, a.n_scales ? scales + a.n_scales * 4u : nullptr},
                          {&win, a.n_windows ? scales + a.n_scales * 8u : nullptr}});
    kvc_cache* cache = nullptr;
    std::memcpy(&cache, handle.data(), sizeof cache);
    bury({&ks, &vs, &win, &config, &handle});
    if (st != KVC_OK || !cache) return status(st == KVC_OK ? KVC_ERR_INTERNAL : st, nullptr);
    if (n_violations_ > 0 && minor_ < kLentReportMinor) {
        // the reply will be the call's failure (reply()): no handle reaches the peer, so none may stay here
        api_->destroy(cache);
        return error(KVC_ERR_INTERNAL, "");
    }
    caches_[free_slot] = {cache, shape_of(c)};
    unsigned char b[kCreateReplyBytes];
    put_u64(b, static_cast<uint64_t>(free_slot) + 1);
    struct iovec v{b, sizeof b};
    return ok(&v, 1);
}

bool Server::append() {
    if (len_ < kAppendRequestBytes) return wrong_length(kAppendRequestBytes);
    Served* s = cache_at(0);
    if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
    const uint32_t n_new = get_u32(req_ + 16);
    const Sizes z = sizes_of(s->shape, n_new);
    if (z.out > kMaxPayloadBytes) return error(KVC_ERR_INVALID_ARGUMENT, "more output than a reply frame carries");
    if (len_ != kAppendRequestBytes + z.q + z.k + z.v) return wrong_length(kAppendRequestBytes + z.q + z.k + z.v);
    const unsigned char* q = req_ + kAppendRequestBytes;
    const unsigned char* k = q + z.q;
    const unsigned char* v = k + z.k;
    Lent lq("q", z.q, q), lk("k", z.k, k), lv("v", z.v, v), lout("out", z.out);
    const kvc_status st = lent_call("append_attend", [&] {
        return api_->append_attend(s->cache, get_u32(req_ + 8), get_u32(req_ + 12), n_new, lq.as<const float>(),
                                   lk.as<const float>(), lv.as<const float>(), lout.as<float>());
    });
    check_lent("append_attend", {{&lq, q}, {&lk, k}, {&lv, v}, {&lout, nullptr}});
    struct iovec body{lout.data(), z.out};
    const bool sent = status(st, s->cache, &body, 1);
    bury({&lq, &lk, &lv, &lout});
    return sent;
}

bool Server::batch() {
    if (len_ < kBatchRequestBytes) return wrong_length(kBatchRequestBytes);
    Served* s = cache_at(0);
    if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
    if (!KVC_API_HAS(api_, append_attend_batch)) return error(KVC_ERR_UNSUPPORTED, "not provided by the plugin");
    const uint32_t n = get_u32(req_ + 12);
    if (n > kMaxBatchSeqs) return error(KVC_ERR_INVALID_ARGUMENT, "more sequences than a batch frame carries");
    const uint64_t ids_bytes = uint64_t{n} * 4, offs_bytes = (uint64_t{n} + 1) * 4;
    if (len_ < kBatchRequestBytes + ids_bytes + offs_bytes)
        return wrong_length(kBatchRequestBytes + ids_bytes + offs_bytes);
    const unsigned char* ids = req_ + kBatchRequestBytes;
    const unsigned char* offs = ids + ids_bytes;
    const Sizes z = sizes_of(s->shape, get_u32(offs + uint64_t{n} * 4));
    if (z.out > kMaxPayloadBytes) return error(KVC_ERR_INVALID_ARGUMENT, "more output than a reply frame carries");
    const uint64_t want = kBatchRequestBytes + ids_bytes + offs_bytes + z.q + z.k + z.v;
    if (len_ != want) return wrong_length(want);
    const unsigned char* q = offs + offs_bytes;
    const unsigned char* k = q + z.q;
    const unsigned char* v = k + z.k;
    Lent lq("batch q", z.q, q), lk("batch k", z.k, k), lv("batch v", z.v, v), lout("batch out", z.out),
        lids("batch seq_ids", ids_bytes, ids), loffs("batch token_offsets", offs_bytes, offs);
    kvc_batch b{};
    b.struct_size = sizeof b;
    b.n_seqs = n;
    b.seq_ids = lids.as<const uint32_t>();
    b.token_offsets = loffs.as<const uint32_t>();
    b.q = lq.as<const float>();
    b.k = lk.as<const float>();
    b.v = lv.as<const float>();
    b.out = lout.as<float>();
    Lent lb("kvc_batch", sizeof b, &b);
    const kvc_status st = lent_call("append_attend_batch", [&] {
        return api_->append_attend_batch(s->cache, get_u32(req_ + 8), lb.as<const kvc_batch>());
    });
    check_lent("append_attend_batch", {{&lb, &b}, {&lids, ids}, {&loffs, offs}, {&lq, q}, {&lk, k}, {&lv, v},
                                       {&lout, nullptr}});
    struct iovec body{lout.data(), z.out};
    const bool sent = status(st, s->cache, &body, 1);
    bury({&lq, &lk, &lv, &lout, &lids, &loffs, &lb});
    return sent;
}

bool Server::read() {
    if (len_ != kReadRequestBytes) return wrong_length(kReadRequestBytes);
    Served* s = cache_at(0);
    if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
    const bool scales = op_ == kReadKvScales;
    if (scales && !KVC_API_HAS(api_, read_kv_scales)) return error(KVC_ERR_UNSUPPORTED, "not provided by the plugin");
    const uint32_t n = get_u32(req_ + 20);
    const Sizes z = sizes_of(s->shape, n);
    const uint64_t kb = scales ? z.scales_k : z.read_k, vb = scales ? z.scales_v : z.read_v;
    if (kb + vb > kMaxPayloadBytes) return error(KVC_ERR_INVALID_ARGUMENT, "more rows than a reply frame carries");
    Lent ko(scales ? "k_scales_out" : "k_out", kb), vo(scales ? "v_scales_out" : "v_out", vb);
    const uint32_t seq = get_u32(req_ + 8), layer = get_u32(req_ + 12), pos = get_u32(req_ + 16);
    const char* call = scales ? "read_kv_scales" : "read_kv";
    const kvc_status st = lent_call(call, [&] {
        return scales ? api_->read_kv_scales(s->cache, seq, layer, pos, n, ko.data(), vo.data())
                      : api_->read_kv(s->cache, seq, layer, pos, n, ko.data(), vo.data());
    });
    check_lent(call, {{&ko, nullptr}, {&vo, nullptr}});
    struct iovec body[2] = {{ko.data(), kb}, {vo.data(), vb}};
    const bool sent = status(st, s->cache, body, 2);
    bury({&ko, &vo});
    return sent;
}

} // namespace served

using served::Server;

int serve(const kvc_plugin_api* api, const kvc_caps& caps, int in_fd, int out_fd, const ServeOptions& options) {
    // A far stray write faults in a protected guard page: the line naming the buffer goes where the proxy reads it.
    if (options.notes_fd >= 0) prop::report_guard_faults_to(options.notes_fd);
    Server s(api, caps, in_fd, out_fd, options);
    const int rc = s.run();
    s.destroy_all();
    return rc;
}

} // namespace kvc::pipe
