// The proxy table. All state is static and fixed in size: after connect() no call allocates from the malloc heap
// except the mirror (below), so the case process's heap moves only when the client's does.
//
// The mirror: a client that reports its allocator reading in every reply (kvcheck serve-plugin does, from glibc's
// own counters) has its growth reproduced in this process by one block resized to follow it. NO-Q's allocator watch,
// which reads this process's heap around every call, then judges the client's memory with its unchanged rules.
#include "proxy_core.hpp"

#include "kvcheck/properties/sanitizers.hpp"

#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kvc::pipe {
namespace proxied {

Connection& conn() {
    static Connection c;
    return c;
}

Slot* slot_of(kvc_cache* cache) {
    Connection& c = conn();
    auto* s = reinterpret_cast<Slot*>(cache);
    if (s < c.slots || s >= c.slots + kMaxCaches || !s->used) return nullptr;
    return s;
}

void say(char* dst, std::size_t cap, const char* fmt, ...) {
    va_list a;
    va_start(a, fmt);
    std::vsnprintf(dst, cap, fmt, a);
    va_end(a);
}

void set_text(char* dst, const char* src) { say(dst, kTextBytes, "%s", src); }

// Keeps what the notes pipe holds before the channel closes it (the fault line of a client that died is there).
void drain_notes() {
    Connection& c = conn();
    c.channel.take_notes(c.notes, &c.n_notes, sizeof c.notes);
}

// The connection breaks: the words name the request, and the client is killed so that nothing it does later counts.
kvc_status fail(Breakdown::Kind kind, char* msg_out, const char* fmt, const char* op, uint32_t seq, const char* detail) {
    Connection& c = conn();
    say(c.broken_text, sizeof c.broken_text, fmt, op, seq, detail);
    c.broken = true;
    c.kind = kind;
    drain_notes();
    c.channel.kill_client();
    if (msg_out) set_text(msg_out, c.broken_text);
    return KVC_ERR_INTERNAL;
}

void follow_reading(uint64_t reading) {
    Connection& c = conn();
    if (!c.mirrored || reading == kNoReading) return;
    const int64_t delta = static_cast<int64_t>(reading - c.baseline);
    if (delta > kMirrorMaxGrowth) return;
    const int64_t size = static_cast<int64_t>(kMirrorBase) + delta;
    const std::size_t want = size > 1 ? static_cast<std::size_t>(size) : 1;
    if (void* p = std::realloc(c.mirror, want)) c.mirror = p;
}

// The call driver's far-violation source (lent.hpp) while a client is connected.
std::size_t take_far_violations(const prop::FarViolation** out) {
    Connection& c = conn();
    *out = c.far;
    const std::size_t n = c.n_far;
    c.n_far = 0;
    return n;
}

// How the client ended, for a message: waits a little for it, since an EOF often comes just before the exit status.
// A served plugin's process exits mid-call only because the implementation called exit(): worded as the harness
// words that of a case process.
const char* ending(char* buf, std::size_t cap) {
    Connection& c = conn();
    c.channel.describe_end(1.0, buf, cap);
    if (c.served && c.channel.exit_status() >= 0)
        say(buf, cap, "ended when the implementation ended the process (exit status %d)", c.channel.exit_status());
    return buf;
}

// The process that the words name: under server isolation it is the implementation's own.
const char* client_process() { return conn().served ? "serve-plugin process" : "client process"; }

kvc_status transact(uint16_t op, struct iovec* req, int n_req, const struct iovec* out, int n_out, std::size_t body,
                    char* msg_out, uint64_t* reading) {
    Connection& c = conn();
    const char* name = opcode_name(op);
    if (c.broken) {
        if (msg_out) set_text(msg_out, c.broken_text);
        return KVC_ERR_INTERNAL;
    }
    const uint32_t seq = ++c.seq;
    c.n_far = 0;
    char detail[kTextBytes];
    unsigned char stray[64];
    if (const std::size_t n = c.channel.unrequested(stray, sizeof stray)) {
        char shown[3 * sizeof stray + 1] = "";
        for (std::size_t i = 0; i < std::min(n, sizeof stray); ++i)
            say(shown + 3 * i, 4, "%02x ", stray[i]);
        say(detail, sizeof detail, "%zu byte(s) out of turn, before any request asked for them (%s...)", n,
                      shown);
        return fail(Breakdown::Kind::Error, msg_out,
                    "the client broke the pipe protocol before %s (request #%u): it wrote %s", name, seq, detail);
    }
    std::size_t length = 0;
    for (int i = 0; i < n_req; ++i) length += req[i].iov_len;
    unsigned char head[kHeaderBytes];
    Header h;
    h.opcode = op;
    h.seq = seq;
    h.length = static_cast<uint32_t>(length);
    encode_header(h, head);
    struct iovec all[12];
    all[0] = {head, kHeaderBytes};
    for (int i = 0; i < n_req; ++i) all[i + 1] = req[i];
    const IoEnd w = c.channel.write_all(all, n_req + 1, c.timeout_s);
    if (w == IoEnd::TimedOut) {
        say(detail, sizeof detail, "%g", c.timeout_s);
        return fail(Breakdown::Kind::Timeout, msg_out,
                    "the client did not read the request frame %s (request #%u) within %s s: it hangs", name, seq,
                    detail);
    }
    if (w != IoEnd::Done) {
        char how[256];
        say(detail, sizeof detail, "the %s %s (%s)", client_process(), ending(how, sizeof how),
            std::strerror(c.channel.last_errno()));
        return fail(Breakdown::Kind::Crash, msg_out, "the request frame %s (request #%u) could not be written: %s",
                    name, seq, detail);
    }
    // The reply: header, then the 16-byte prefix, then the message or the body.
    unsigned char rhead[kHeaderBytes + kReplyPrefixBytes];
    std::size_t got = 0;
    struct iovec hv{rhead, sizeof rhead};
    const auto broke_reading = [&](IoEnd e, const char* part) {
        char how[256];
        if (e == IoEnd::TimedOut) {
            say(detail, sizeof detail, "no %s within %g s (%zu byte(s) of it came): it hangs", part,
                          c.timeout_s, got);
            return fail(Breakdown::Kind::Timeout, msg_out, "the reply to %s (request #%u): %s", name, seq, detail);
        }
        if (got == 0 && std::strcmp(part, "header") == 0)
            say(detail, sizeof detail, "the %s %s before it replied", client_process(), ending(how, sizeof how));
        else
            say(detail, sizeof detail, "the %s %s after %zu byte(s) of the %s (a short frame)", client_process(),
                ending(how, sizeof how), got, part);
        return fail(Breakdown::Kind::Crash, msg_out, "the reply to %s (request #%u): %s", name, seq, detail);
    };
    // One deadline for the whole reply, however many parts it is read in: a client that trickles a frame part by part
    // still hangs within the reply timeout, and the words name the request before the case's own timeout ends it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(c.timeout_s);
    const auto left = [&] {
        const double s = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
        return s > 0.001 ? s : 0.001;
    };
    IoEnd r = c.channel.read_exact(&hv, 1, sizeof rhead, left(), &got);
    if (r != IoEnd::Done) return broke_reading(r, "header");
    const Header rh = decode_header(rhead);
    const uint32_t status = get_u32(rhead + kHeaderBytes);
    const uint32_t flags = get_u32(rhead + kHeaderBytes + 4);
    const uint64_t rd = get_u64(rhead + kHeaderBytes + 8);
    const auto bad = [&](const char* what_fmt, unsigned long long a, unsigned long long b) {
        say(detail, sizeof detail, what_fmt, a, b);
        return fail(Breakdown::Kind::Error, msg_out, "bad reply frame to %s (request #%u): %s", name, seq, detail);
    };
    const uint32_t known_flags = c.minor >= kLentReportMinor ? kReplyLentViolations : 0;
    if (rh.magic != kMagic) return bad("magic 0x%08llx where the frame must start with 0x%08llx (\"KVCP\")", rh.magic, kMagic);
    if (rh.opcode != (op | kReplyBit)) return bad("opcode 0x%04llx, expected 0x%04llx", rh.opcode, op | kReplyBit);
    if (rh.reserved != 0 || (flags & ~known_flags) != 0)
        return bad("reserved field %llu or flags 0x%llx not of this protocol minor", rh.reserved, flags);
    if (rh.seq != seq) return bad("request number %llu, expected %llu", rh.seq, seq);
    if (rh.length < kReplyPrefixBytes) return bad("length %llu, shorter than the %llu-byte reply prefix", rh.length, kReplyPrefixBytes);
    if (status > KVC_ERR_EVICTED) return bad("status %llu, not a kvc_status (0..%llu)", status, KVC_ERR_EVICTED);
    // What follows the prefix; every part is read against it, never beyond.
    uint64_t rest = rh.length - kReplyPrefixBytes;
    const auto take = [&](void* p, std::size_t n) {
        struct iovec v{p, n};
        return n == 0 ? IoEnd::Done : c.channel.read_exact(&v, 1, n, left(), &got);
    };
    if (flags & kReplyLentViolations) {
        unsigned char count4[4];
        if (rest < 4) return bad("length %llu: a lent-buffer block needs at least %llu", rh.length, kReplyPrefixBytes + 4);
        if ((r = take(count4, 4)) != IoEnd::Done) return broke_reading(r, "lent-buffer block");
        rest -= 4;
        const uint32_t count = get_u32(count4);
        if (count == 0 || count > kMaxLentViolations)
            return bad("%llu lent-buffer violations (1 to %llu)", count, kMaxLentViolations);
        for (uint32_t i = 0; i < count; ++i) {
            unsigned char vh[kLentViolationHeadBytes];
            if (rest < sizeof vh) return bad("length %llu ends inside lent-buffer violation %llu", rh.length, i);
            if ((r = take(vh, sizeof vh)) != IoEnd::Done)
                return broke_reading(r, "lent-buffer violation");
            rest -= sizeof vh;
            const uint32_t name_len = get_u32(vh + 8), what_len = get_u32(vh + 12);
            if (name_len > kMaxNameBytes || what_len > kMaxMessageBytes)
                return bad("a lent-buffer violation with a %llu-byte name and %llu bytes of words", name_len, what_len);
            if (rest < uint64_t{name_len} + what_len)
                return bad("length %llu ends inside lent-buffer violation %llu", rh.length, i);
            FarText& t = c.far_text[i];
            if ((r = take(t.buffer, name_len)) != IoEnd::Done ||
                (r = take(t.what, what_len)) != IoEnd::Done)
                return broke_reading(r, "lent-buffer violation");
            rest -= uint64_t{name_len} + what_len;
            t.buffer[name_len] = 0;
            t.what[what_len] = 0;
            for (char* x : {t.buffer, t.what})
                for (char* p = x; *p; ++p)
                    if (static_cast<unsigned char>(*p) < 0x20) *p = ' ';
            c.far[i] = {t.buffer, t.what, static_cast<std::size_t>(get_u64(vh))};
        }
        c.n_far = count;
    }
    if (status != KVC_OK) {
        unsigned char len4[4];
        if (rest < 4) return bad("length %llu: an error reply needs at least %llu", rh.length, rh.length - rest + 4);
        if ((r = take(len4, 4)) != IoEnd::Done) return broke_reading(r, "error message length");
        const uint32_t n = get_u32(len4);
        if (n > kMaxMessageBytes) return bad("error message of %llu bytes (at most %llu)", n, kMaxMessageBytes);
        if (rest != 4 + uint64_t{n})
            return bad("length %llu, but an error reply with its message is %llu bytes", rh.length, rh.length - rest + 4 + n);
        char text[kMaxMessageBytes + 1];
        if ((r = take(text, n)) != IoEnd::Done) return broke_reading(r, "error message");
        text[n] = 0;
        for (uint32_t i = 0; i < n; ++i)
            if (text[i] == 0) text[i] = ' ';
        if (msg_out) set_text(msg_out, text);
        if (reading) *reading = rd;
        follow_reading(rd);
        return static_cast<kvc_status>(status);
    }
    if (rest != body)
        return bad("length %llu, but this reply is exactly %llu bytes", rh.length, rh.length - rest + body);
    r = c.channel.read_exact(out, n_out, body, left(), &got);
    if (r != IoEnd::Done) return broke_reading(r, "body");
    if (reading) *reading = rd;
    follow_reading(rd);
    return KVC_OK;
}

} // namespace proxied

namespace {

using namespace proxied;

// ---- the table --------------------------------------------------------------------------------------------------

void p_get_caps(kvc_caps* out) {
    const uint32_t size = out->struct_size < sizeof(kvc_caps) ? out->struct_size : sizeof(kvc_caps);
    kvc_caps c = conn().caps;
    c.struct_size = out->struct_size;
    std::memcpy(out, &c, size);
}

kvc_status p_create(const kvc_config* config, kvc_cache** out) {
    Connection& c = conn();
    Slot* s = nullptr;
    for (Slot& x : c.slots)
        if (!x.used) {
            s = &x;
            break;
        }
    if (!s) {
        set_text(c.create_error, "kvcheck's pipe proxy holds at most 256 caches at once");
        return KVC_ERR_OUT_OF_MEMORY;
    }
    uint32_t n_scales = config_scale_count(*config);
    if (n_scales == UINT32_MAX || !config->k_scales || !config->v_scales) n_scales = 0;
    if (uint64_t{n_scales} * 8 > kMaxPayloadBytes / 2) {
        set_text(c.create_error, "the config's scale arrays are too large for one frame");
        return KVC_ERR_INVALID_ARGUMENT;
    }
    ConfigArrays arrays;
    arrays.n_scales = n_scales;
    // Windows travel from 1.3 on; below it the caps never declare them, so a config has none to lose.
    if (c.minor >= kWholeAbiMinor && config->windows) arrays.n_windows = config->n_layers;
    unsigned char fixed[kConfigBytes];
    encode_config(*config, arrays, c.minor, fixed);
    struct iovec req[4] = {{fixed, config_bytes(c.minor)},
                           {const_cast<float*>(config->k_scales), n_scales * 4u},
                           {const_cast<float*>(config->v_scales), n_scales * 4u},
                           {const_cast<uint32_t*>(config->windows), arrays.n_windows * 4u}};
    unsigned char handle[kCreateReplyBytes];
    struct iovec rep{handle, sizeof handle};
    const kvc_status st = transact(kCreate, req, 4, &rep, 1, sizeof handle, c.create_error);
    if (st != KVC_OK) return st;
    s->used = true;
    s->remote = get_u64(handle);
    s->shape = shape_of(*config);
    set_text(s->error, "(no error)");
    *out = reinterpret_cast<kvc_cache*>(s);
    return KVC_OK;
}

void p_destroy(kvc_cache* cache) {
    Slot* s = slot_of(cache);
    if (!s) return;
    unsigned char b[kCacheRequestBytes];
    put_u64(b, s->remote);
    struct iovec req{b, sizeof b};
    transact(kDestroy, &req, 1, nullptr, 0, 0, nullptr);
    s->used = false;
}

const char* p_last_error(const kvc_cache* cache) {
    Slot* s = slot_of(const_cast<kvc_cache*>(cache));
    return s ? s->error : conn().create_error;
}

kvc_status too_large(Slot* s, const char* op) {
    say(s->error, sizeof s->error, "%s: the arrays are too large for one pipe frame (1 GiB)", op);
    return KVC_ERR_INVALID_ARGUMENT;
}

kvc_status p_append_attend(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                           const float* k, const float* v, float* out) {
    Slot* s = slot_of(cache);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    const Sizes z = sizes_of(s->shape, n_new);
    if (z.q + z.k + z.v > kMaxPayloadBytes || z.out > kMaxPayloadBytes) return too_large(s, "append_attend");
    Fields f(s->remote);
    f.u32(seq).u32(layer).u32(n_new).u32(0);
    struct iovec req[4] = {{f.b, f.n}, {const_cast<float*>(q), z.q}, {const_cast<float*>(k), z.k},
                           {const_cast<float*>(v), z.v}};
    struct iovec rep{out, z.out};
    return transact(kAppendAttend, req, 4, &rep, 1, z.out, s->error);
}

kvc_status p_append_attend_batch(kvc_cache* cache, uint32_t layer, const kvc_batch* batch) {
    Slot* s = slot_of(cache);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    if (batch->n_seqs > kMaxBatchSeqs) return too_large(s, "append_attend_batch");
    const uint32_t total = batch->token_offsets[batch->n_seqs];
    const Sizes z = sizes_of(s->shape, total);
    const uint64_t ids = uint64_t{batch->n_seqs} * 4, offs = (uint64_t{batch->n_seqs} + 1) * 4;
    if (z.q + z.k + z.v + ids + offs > kMaxPayloadBytes || z.out > kMaxPayloadBytes)
        return too_large(s, "append_attend_batch");
    Fields f(s->remote);
    f.u32(layer).u32(batch->n_seqs);
    struct iovec req[6] = {{f.b, f.n},
                           {const_cast<uint32_t*>(batch->seq_ids), ids},
                           {const_cast<uint32_t*>(batch->token_offsets), offs},
                           {const_cast<float*>(batch->q), z.q},
                           {const_cast<float*>(batch->k), z.k},
                           {const_cast<float*>(batch->v), z.v}};
    struct iovec rep{batch->out, z.out};
    return transact(kAppendAttendBatch, req, 6, &rep, 1, z.out, s->error);
}

kvc_status read_pair(uint16_t op, kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n,
                     void* k_out, void* v_out) {
    Slot* s = slot_of(cache);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    const Sizes z = sizes_of(s->shape, n);
    const uint64_t kb = op == kReadKv ? z.read_k : z.scales_k, vb = op == kReadKv ? z.read_v : z.scales_v;
    if (kb + vb > kMaxPayloadBytes) return too_large(s, opcode_name(op));
    Fields f(s->remote);
    f.u32(seq).u32(layer).u32(pos).u32(n);
    struct iovec req{f.b, f.n};
    struct iovec rep[2] = {{k_out, kb}, {v_out, vb}};
    return transact(op, &req, 1, rep, 2, kb + vb, s->error);
}

kvc_status p_read_kv(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                     void* v_out) {
    return read_pair(kReadKv, cache, seq, layer, pos, n, k_out, v_out);
}

kvc_status p_read_kv_scales(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                            void* v_out) {
    return read_pair(kReadKvScales, cache, seq, layer, pos, n, k_out, v_out);
}

kvc_status p_seq_length(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t* length) {
    Slot* s = slot_of(cache);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    Fields f(s->remote);
    f.u32(seq).u32(layer);
    struct iovec req{f.b, f.n};
    unsigned char b[kSeqLengthReplyBytes];
    struct iovec rep{b, sizeof b};
    const kvc_status st = transact(kSeqLength, &req, 1, &rep, 1, sizeof b, s->error);
    if (st == KVC_OK) *length = get_u32(b);
    return st;
}

kvc_status p_memory(kvc_cache* cache, kvc_memory* out) {
    Slot* s = slot_of(cache);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    Fields f(s->remote);
    struct iovec req{f.b, f.n};
    unsigned char b[kMemoryReplyBytes];
    struct iovec rep{b, sizeof b};
    const kvc_status st = transact(kMemory, &req, 1, &rep, 1, sizeof b, s->error);
    if (st != KVC_OK) return st;
    kvc_memory m{};
    m.struct_size = out->struct_size;
    m.block_size = get_u32(b);
    m.live_bytes = get_u64(b + 8);
    m.capacity_bytes = get_u64(b + 16);
    m.pool_bytes = get_u64(b + 24);
    m.workspace_bytes = get_u64(b + 32);
    std::memcpy(out, &m, out->struct_size < sizeof m ? out->struct_size : sizeof m);
    return KVC_OK;
}

kvc_status pair_call(uint16_t op, kvc_cache* cache, uint32_t a, uint32_t b) {
    Slot* s = slot_of(cache);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    Fields f(s->remote);
    f.u32(a).u32(b);
    struct iovec req{f.b, f.n};
    return transact(op, &req, 1, nullptr, 0, 0, s->error);
}

kvc_status p_fork(kvc_cache* cache, uint32_t parent, uint32_t child) { return pair_call(kFork, cache, parent, child); }
kvc_status p_release(kvc_cache* cache, uint32_t seq) { return pair_call(kRelease, cache, seq, 0); }

[[noreturn]] void refuse(const std::string& what, bool misbehaved) {
    conn().channel.kill_client();
    throw ConnectError(what, misbehaved);
}

} // namespace

namespace {

void handshake(const std::string& command);

} // namespace

void connect(const std::string& command, double reply_timeout_s, bool served) {
    Connection& c = conn();
    if (c.channel.started()) throw ConnectError("kvcheck's pipe proxy is connected already", false);
    c.timeout_s = reply_timeout_s;
    c.served = served;
    c.channel.start(command, served);
    // Under AddressSanitizer the heap watch is blind (heap.hpp) and a resized block is copied each time: no mirror.
    c.mirrored = !prop::kBuiltWithAddressSanitizer;
    handshake(command);
}

void connect_fds(int to_client, int from_client, double reply_timeout_s) {
    Connection& c = conn();
    if (c.channel.started()) throw ConnectError("kvcheck's pipe proxy is connected already", false);
    c.timeout_s = reply_timeout_s;
    c.channel.attach(to_client, from_client);
    handshake("descriptors");
}

void reset() {
    Connection& c = conn();
    c.channel.kill_client();
    std::free(c.mirror);
    prop::set_far_violation_source(nullptr);
    c.~Connection();
    new (&c) Connection();
    model_reset();
}

namespace {

void handshake(const std::string& command) {
    Connection& c = conn();
    char msg[kTextBytes] = "";
    const auto failed = [&](kvc_status st, const char* step) {
        if (c.broken) refuse(std::string("the client (") + command + ") broke off " + step + ": " + c.broken_text, true);
        refuse(std::string("the client (") + command + ") refused " + step + " (" + status_name(st) + "): " + msg,
               false);
    };
    unsigned char hello[kHelloRequestBytes];
    put_u32(hello, kProtocolMajor);
    put_u32(hello + 4, kProtocolMinor);
    struct iovec req{hello, sizeof hello};
    unsigned char h[kHelloReplyBytes];
    struct iovec rep{h, sizeof h};
    uint64_t reading = kNoReading;
    kvc_status st = transact(kHello, &req, 1, &rep, 1, sizeof h, msg, &reading);
    if (st != KVC_OK) failed(st, "the handshake");
    const uint32_t major = get_u32(h), minor = get_u32(h + 4);
    if (major != kProtocolMajor)
        refuse("the client (" + command + ") speaks protocol " + std::to_string(major) + "." + std::to_string(minor) +
                   ", this kvcheck speaks " + std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor) +
                   " (major versions are incompatible)",
               false);
    c.minor = minor < kProtocolMinor ? minor : kProtocolMinor;
    std::memcpy(c.name, h + 8, kMaxNameBytes);
    std::memcpy(c.version, h + 8 + kMaxNameBytes, kMaxNameBytes);
    c.name[kMaxNameBytes] = c.version[kMaxNameBytes] = 0;
    unsigned char caps[kCapsReplyBytes];
    struct iovec crep{caps, caps_reply_bytes(c.minor)};
    st = transact(kGetCaps, nullptr, 0, &crep, 1, caps_reply_bytes(c.minor), msg, &reading);
    // From 1.5 a served plugin may export the model-level table only: get_caps is then UNSUPPORTED, and the model
    // get_caps that follows says what the client serves.
    if (st != KVC_OK && (st != KVC_ERR_UNSUPPORTED || c.minor < kModelMinor)) failed(st, "get_caps");
    bool model = false;
    if (c.minor >= kModelMinor) {
        char model_msg[kTextBytes] = "";
        kvc_status model_st = KVC_OK;
        model = model_handshake(&model_st, model_msg, &reading);
        if (!model && model_st != KVC_ERR_UNSUPPORTED) {
            set_text(msg, model_msg);
            failed(model_st, "the model table's get_caps");
        }
    }
    if (st != KVC_OK && !model) failed(st, "get_caps");
    c.has_operation = st == KVC_OK;
    if (c.has_operation) c.caps = decode_caps(caps, c.minor);
    // The mirror starts at its base before any call is judged; from here it follows the client's reading.
    c.baseline = reading;
    c.mirrored = c.mirrored && reading != kNoReading;
    if (c.mirrored) c.mirror = std::malloc(kMirrorBase);
    // What the client's guards find (1.4) reaches the call driver as its own guards' findings.
    prop::set_far_violation_source(take_far_violations);
    kvc_plugin_api& t = c.table;
    t.struct_size = sizeof t;
    t.abi_major = KVC_ABI_VERSION_MAJOR;
    t.abi_minor = abi_minor_of(c.minor);
    t.name = c.name;
    t.version = c.version;
    t.get_caps = p_get_caps;
    t.create = p_create;
    t.destroy = p_destroy;
    t.last_error = p_last_error;
    t.append_attend = p_append_attend;
    t.append_attend_batch = p_append_attend_batch;
    t.read_kv = p_read_kv;
    t.seq_length = p_seq_length;
    t.memory = p_memory;
    t.fork = p_fork;
    t.release = p_release;
    t.read_kv_scales = p_read_kv_scales;
}

} // namespace

const kvc_plugin_api* proxy_entry(uint32_t, uint32_t) {
    return conn().channel.started() && conn().has_operation ? &conn().table : nullptr;
}

ClientNotes client_notes() {
    Connection& c = conn();
    drain_notes();
    ClientNotes n;
    std::size_t at = 0;
    while (at < c.n_notes) {
        const char* nl = static_cast<const char*>(std::memchr(c.notes + at, '\n', c.n_notes - at));
        if (!nl) break; // a line still being written (or cut at the cap): not a note
        const std::string line(static_cast<const char*>(c.notes + at), nl);
        at = static_cast<std::size_t>(nl - c.notes) + 1;
        if (line == "M") n.allocation_refused = true;
        // the fault handler speaks only as the process dies of the fault: from a process that did not, not kvcheck's
        else if (line.size() > 2 && line[0] == prop::kGuardFaultTag && line[1] == ' ' &&
                 c.channel.end_signal() == SIGSEGV)
            n.guard_fault = line.substr(2);
    }
    return n;
}

std::optional<Breakdown> breakdown() {
    const Connection& c = conn();
    if (!c.broken) return std::nullopt;
    return Breakdown{c.kind, c.broken_text};
}

void disconnect() {
    Connection& c = conn();
    drain_notes();
    c.channel.close_and_wait(1.0);
}

} // namespace kvc::pipe
