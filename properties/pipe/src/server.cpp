#include "kvcheck/pipe/server.hpp"

#include "channel.hpp"
#include "kvcheck/pipe/protocol.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvc::pipe {
namespace {

constexpr int kMaxCaches = 256;

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

struct Served {
    kvc_cache* cache = nullptr;
    Shape shape;
};

class Server {
public:
    Server(const kvc_plugin_api* api, const kvc_caps& caps, int in, int out, const ServeOptions& o)
        : api_(api), caps_(caps), in_(in), out_(out), o_(o) {}

    int run() {
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
            if (!dispatch()) return 2;
            // Poison what the plugin was lent: a pointer it kept reads NaN from now on, as under the harness.
            std::memset(req_, 0xff, len_);
            if (out_used_) std::memset(out_buf_.data(), 0xff, out_used_);
            out_used_ = 0;
        }
    }

private:
    template <typename... A>
    int protocol_error(const char* fmt, A... a) {
        std::fprintf(stderr, "kvcheck serve-plugin: ");
        std::fprintf(stderr, fmt, a...);
        std::fprintf(stderr, "\n");
        return 2;
    }

    bool reply(kvc_status st, const char* message, struct iovec* body, int n_body) {
        const uint64_t reading = o_.reading ? o_.reading() : kNoReading;
        unsigned char head[kHeaderBytes + kReplyPrefixBytes + 4];
        std::size_t length = kReplyPrefixBytes;
        uint32_t mlen = 0;
        if (st != KVC_OK) {
            mlen = static_cast<uint32_t>(std::min<std::size_t>(std::strlen(message), kMaxMessageBytes));
            length += 4 + mlen;
        } else {
            for (int i = 0; i < n_body; ++i) length += body[i].iov_len;
        }
        Header h;
        h.opcode = static_cast<uint16_t>(op_ | kReplyBit);
        h.seq = seq_;
        h.length = static_cast<uint32_t>(length);
        encode_header(h, head);
        put_u32(head + kHeaderBytes, st);
        put_u32(head + kHeaderBytes + 4, 0);
        put_u64(head + kHeaderBytes + 8, reading);
        struct iovec all[4];
        int n = 0;
        if (st != KVC_OK) {
            put_u32(head + kHeaderBytes + kReplyPrefixBytes, mlen);
            all[n++] = {head, sizeof head};
            all[n++] = {const_cast<char*>(message), mlen};
        } else {
            all[n++] = {head, kHeaderBytes + kReplyPrefixBytes};
            for (int i = 0; i < n_body; ++i) all[n++] = body[i];
        }
        if (!write_all(out_, all, n)) {
            std::fprintf(stderr, "kvcheck serve-plugin: cannot write the reply to %s (%s)\n", opcode_name(op_),
                         std::strerror(errno));
            return false;
        }
        return true;
    }
    bool ok(struct iovec* body = nullptr, int n = 0) { return reply(KVC_OK, "", body, n); }
    bool error(kvc_status st, const char* message) { return reply(st, message, nullptr, 0); }
    bool status(kvc_status st, kvc_cache* cache, struct iovec* body = nullptr, int n = 0) {
        if (st == KVC_OK) return ok(body, n);
        const char* m = api_->last_error(cache);
        return error(st, m ? m : "(no message)");
    }
    bool wrong_length(uint64_t want) {
        char m[160];
        std::snprintf(m, sizeof m, "kvcheck serve-plugin: a %s request of %u bytes; it must be %llu", opcode_name(op_),
                      len_, static_cast<unsigned long long>(want));
        return error(KVC_ERR_INVALID_ARGUMENT, m);
    }

    Served* cache_at(std::size_t offset) {
        const uint64_t id = get_u64(req_ + offset);
        if (id == 0 || id > kMaxCaches || !caches_[id - 1].cache) return nullptr;
        return &caches_[id - 1];
    }
    unsigned char* out(uint64_t bytes) {
        out_used_ = static_cast<std::size_t>(bytes);
        return out_buf_.reserve(out_used_);
    }

    bool dispatch() {
        if (op_ == kHello) {
            if (len_ != kHelloRequestBytes) return wrong_length(kHelloRequestBytes);
            if (!o_.load_error.empty()) {
                error(KVC_ERR_UNSUPPORTED, o_.load_error.c_str());
                return false;
            }
            // The connection speaks the lower of kvcheck's minor and the one that carries the plugin's ABI.
            const uint32_t asked = get_u32(req_ + 4), own = protocol_minor_of(api_->abi_minor);
            minor_ = asked < own ? asked : own;
            unsigned char b[kHelloReplyBytes] = {};
            put_u32(b, kProtocolMajor);
            put_u32(b + 4, minor_);
            std::strncpy(reinterpret_cast<char*>(b + 8), api_->name ? api_->name : "(unnamed)", kMaxNameBytes);
            std::strncpy(reinterpret_cast<char*>(b + 8 + kMaxNameBytes), api_->version ? api_->version : "",
                         kMaxNameBytes);
            struct iovec v{b, sizeof b};
            return ok(&v, 1);
        }
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
            uint32_t n = 0;
            const kvc_status st = api_->seq_length(s->cache, get_u32(req_ + 8), get_u32(req_ + 12), &n);
            unsigned char b[kSeqLengthReplyBytes] = {};
            put_u32(b, n);
            struct iovec v{b, sizeof b};
            return status(st, s->cache, &v, 1);
        }
        case kMemory: {
            if (len_ != kCacheRequestBytes) return wrong_length(kCacheRequestBytes);
            Served* s = cache_at(0);
            if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
            kvc_memory m{};
            m.struct_size = sizeof m;
            const kvc_status st = api_->memory(s->cache, &m);
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
            const kvc_status st = fork ? api_->fork(s->cache, get_u32(req_ + 8), get_u32(req_ + 12))
                                       : api_->release(s->cache, get_u32(req_ + 8));
            return status(st, s->cache);
        }
        }
        return error(KVC_ERR_INVALID_ARGUMENT, "unknown opcode");
    }

    bool create() {
        const std::size_t fixed = config_bytes(minor_);
        if (len_ < fixed) return wrong_length(fixed);
        ConfigArrays a;
        kvc_config c = decode_config(req_, minor_, &a);
        if (len_ != fixed + a.bytes()) return wrong_length(fixed + a.bytes());
        if (a.n_windows != 0 && a.n_windows != c.n_layers)
            return error(KVC_ERR_INVALID_ARGUMENT, "kvcheck serve-plugin: n_windows is neither 0 nor n_layers");
        if (a.n_scales) {
            c.k_scales = reinterpret_cast<const float*>(req_ + fixed);
            c.v_scales = reinterpret_cast<const float*>(req_ + fixed + a.n_scales * 4u);
        }
        if (a.n_windows) c.windows = reinterpret_cast<const uint32_t*>(req_ + fixed + a.n_scales * 8u);
        int free_slot = -1;
        for (int i = 0; i < kMaxCaches && free_slot < 0; ++i)
            if (!caches_[i].cache) free_slot = i;
        if (free_slot < 0) return error(KVC_ERR_OUT_OF_MEMORY, "kvcheck serve-plugin holds at most 256 caches");
        kvc_cache* cache = nullptr;
        const kvc_status st = api_->create(&c, &cache);
        if (st != KVC_OK || !cache) return status(st == KVC_OK ? KVC_ERR_INTERNAL : st, nullptr);
        caches_[free_slot] = {cache, shape_of(c)};
        unsigned char b[kCreateReplyBytes];
        put_u64(b, static_cast<uint64_t>(free_slot) + 1);
        struct iovec v{b, sizeof b};
        return ok(&v, 1);
    }

    bool append() {
        if (len_ < kAppendRequestBytes) return wrong_length(kAppendRequestBytes);
        Served* s = cache_at(0);
        if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
        const uint32_t n_new = get_u32(req_ + 16);
        const Sizes z = sizes_of(s->shape, n_new);
        if (z.out > kMaxPayloadBytes) return error(KVC_ERR_INVALID_ARGUMENT, "more output than a reply frame carries");
        if (len_ != kAppendRequestBytes + z.q + z.k + z.v) return wrong_length(kAppendRequestBytes + z.q + z.k + z.v);
        const auto* q = reinterpret_cast<const float*>(req_ + kAppendRequestBytes);
        const auto* k = reinterpret_cast<const float*>(req_ + kAppendRequestBytes + z.q);
        const auto* v = reinterpret_cast<const float*>(req_ + kAppendRequestBytes + z.q + z.k);
        auto* o = reinterpret_cast<float*>(out(z.out));
        const kvc_status st = api_->append_attend(s->cache, get_u32(req_ + 8), get_u32(req_ + 12), n_new, q, k, v, o);
        struct iovec body{o, z.out};
        return status(st, s->cache, &body, 1);
    }

    bool batch() {
        if (len_ < kBatchRequestBytes) return wrong_length(kBatchRequestBytes);
        Served* s = cache_at(0);
        if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
        if (!KVC_API_HAS(api_, append_attend_batch)) return error(KVC_ERR_UNSUPPORTED, "not provided by the plugin");
        const uint32_t n = get_u32(req_ + 12);
        if (n > kMaxBatchSeqs) return error(KVC_ERR_INVALID_ARGUMENT, "more sequences than a batch frame carries");
        const uint64_t lists = uint64_t{n} * 4 + (uint64_t{n} + 1) * 4;
        if (len_ < kBatchRequestBytes + lists) return wrong_length(kBatchRequestBytes + lists);
        const auto* ids = reinterpret_cast<const uint32_t*>(req_ + kBatchRequestBytes);
        const auto* offs = ids + n;
        const Sizes z = sizes_of(s->shape, offs[n]);
        if (z.out > kMaxPayloadBytes) return error(KVC_ERR_INVALID_ARGUMENT, "more output than a reply frame carries");
        const uint64_t want = kBatchRequestBytes + lists + z.q + z.k + z.v;
        if (len_ != want) return wrong_length(want);
        kvc_batch b{};
        b.struct_size = sizeof b;
        b.n_seqs = n;
        b.seq_ids = ids;
        b.token_offsets = offs;
        b.q = reinterpret_cast<const float*>(req_ + kBatchRequestBytes + lists);
        b.k = reinterpret_cast<const float*>(req_ + kBatchRequestBytes + lists + z.q);
        b.v = reinterpret_cast<const float*>(req_ + kBatchRequestBytes + lists + z.q + z.k);
        b.out = reinterpret_cast<float*>(out(z.out));
        const kvc_status st = api_->append_attend_batch(s->cache, get_u32(req_ + 8), &b);
        struct iovec body{b.out, z.out};
        return status(st, s->cache, &body, 1);
    }

    bool read() {
        if (len_ != kReadRequestBytes) return wrong_length(kReadRequestBytes);
        Served* s = cache_at(0);
        if (!s) return error(KVC_ERR_INVALID_ARGUMENT, "unknown cache handle");
        const bool scales = op_ == kReadKvScales;
        if (scales && !KVC_API_HAS(api_, read_kv_scales)) return error(KVC_ERR_UNSUPPORTED, "not provided by the plugin");
        const uint32_t n = get_u32(req_ + 20);
        const Sizes z = sizes_of(s->shape, n);
        const uint64_t kb = scales ? z.scales_k : z.read_k, vb = scales ? z.scales_v : z.read_v;
        if (kb + vb > kMaxPayloadBytes) return error(KVC_ERR_INVALID_ARGUMENT, "more rows than a reply frame carries");
        unsigned char* k = out(kb + vb);
        unsigned char* v = k + kb;
        const uint32_t seq = get_u32(req_ + 8), layer = get_u32(req_ + 12), pos = get_u32(req_ + 16);
        const kvc_status st = scales ? api_->read_kv_scales(s->cache, seq, layer, pos, n, k, v)
                                     : api_->read_kv(s->cache, seq, layer, pos, n, k, v);
        struct iovec body{k, kb + vb};
        return status(st, s->cache, &body, 1);
    }

    const kvc_plugin_api* api_;
    kvc_caps caps_;
    int in_, out_;
    const ServeOptions& o_;
    MappedBuffer request_buf_, out_buf_;
    unsigned char* req_ = nullptr;
    std::size_t out_used_ = 0;
    uint32_t seq_ = 0, len_ = 0;
    uint16_t op_ = 0;
    uint32_t minor_ = 0; // the protocol minor of this connection, set by hello
    Served caches_[kMaxCaches];
};

} // namespace

int serve(const kvc_plugin_api* api, const kvc_caps& caps, int in_fd, int out_fd, const ServeOptions& options) {
    Server s(api, caps, in_fd, out_fd, options);
    return s.run();
}

} // namespace kvc::pipe
