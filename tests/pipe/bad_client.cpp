// A pipe-protocol client that breaks the protocol on purpose, one way per mode (argv[1]), at its first append_attend
// (or at hello, for the modes named so). Before that it answers hello, get_caps, create, memory and destroy correctly
// for an f32 cache, so that the case reaches the call that misbehaves. Mode minor_2 breaks nothing: it speaks
// protocol 1.2, whose caps and create frames are shorter, declares windows and a V head dim that 1.2 cannot carry,
// and exits with status 5 on a create frame of any other length; it answers no read_kv.
#include "kvcheck/pipe/protocol.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace kvc::pipe;

namespace {

bool read_exact(void* p, std::size_t n) {
    auto* b = static_cast<unsigned char*>(p);
    std::size_t got = 0;
    while (got < n) {
        const ssize_t r = ::read(0, b + got, n - got);
        if (r <= 0) return false;
        got += static_cast<std::size_t>(r);
    }
    return true;
}

void write_bytes(const std::vector<unsigned char>& b) {
    std::size_t done = 0;
    while (done < b.size()) {
        const ssize_t w = ::write(1, b.data() + done, b.size() - done);
        if (w <= 0) std::exit(3);
        done += static_cast<std::size_t>(w);
    }
}

// A reply frame: header, prefix (status, 0, no reading), body; `length` overrides the header's length field.
std::vector<unsigned char> reply(const Header& req, uint32_t status, const std::vector<unsigned char>& body,
                                 int64_t length = -1) {
    std::vector<unsigned char> f(kHeaderBytes + kReplyPrefixBytes + body.size());
    Header h;
    h.opcode = static_cast<uint16_t>(req.opcode | kReplyBit);
    h.seq = req.seq;
    h.length = length >= 0 ? static_cast<uint32_t>(length) : static_cast<uint32_t>(kReplyPrefixBytes + body.size());
    encode_header(h, f.data());
    put_u32(f.data() + 16, status);
    put_u64(f.data() + 24, kNoReading);
    if (!body.empty()) std::memcpy(f.data() + 32, body.data(), body.size()); // an empty vector's data() may be null
    return f;
}

} // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    const uint32_t minor = mode == "minor_2" ? 2 : kProtocolMinor;
    Shape shape;
    for (;;) {
        unsigned char head[kHeaderBytes];
        if (!read_exact(head, sizeof head)) return 0;
        const Header h = decode_header(head);
        std::vector<unsigned char> payload(h.length);
        if (!read_exact(payload.data(), payload.size())) return 0;
        if (h.opcode == kHello) {
            if (mode == "exit_at_hello") return 3;
            if (mode == "garbage_at_hello") {
                write_bytes(std::vector<unsigned char>(40, 'x'));
                continue;
            }
            std::vector<unsigned char> body(kHelloReplyBytes, 0);
            put_u32(body.data(), kProtocolMajor);
            put_u32(body.data() + 4, mode == "major_2" ? 0 : minor);
            if (mode == "major_2") put_u32(body.data(), 2);
            std::memcpy(body.data() + 8, "bad-client", 10);
            write_bytes(reply(h, KVC_OK, body));
        } else if (h.opcode == kGetCaps) {
            kvc_caps c{};
            c.dtypes = 1u << KVC_DTYPE_F32;
            c.features = KVC_FEATURE_GQA | KVC_FEATURE_CHUNKED;
            if (mode == "minor_2") c.features |= KVC_FEATURE_WINDOW | KVC_FEATURE_HEAD_DIM_V;
            std::vector<unsigned char> body(caps_reply_bytes(minor));
            encode_caps(c, minor, body.data());
            write_bytes(reply(h, KVC_OK, body));
        } else if (h.opcode == kCreate) {
            if (payload.size() < config_bytes(minor)) return 5;
            ConfigArrays arrays;
            shape = shape_of(decode_config(payload.data(), minor, &arrays));
            if (payload.size() != config_bytes(minor) + arrays.bytes()) return 5;
            std::vector<unsigned char> body(8, 0);
            body[0] = 1;
            write_bytes(reply(h, KVC_OK, body));
        } else if (h.opcode == kAppendAttend) {
            const uint64_t out = sizes_of(shape, get_u32(payload.data() + 16)).out;
            std::vector<unsigned char> body(out, 0);
            if (mode == "crash") std::raise(SIGSEGV);
            if (mode == "exit") return 0;
            if (mode == "hang") pause();
            if (mode == "short") { // half the frame, then the end
                std::vector<unsigned char> f = reply(h, KVC_OK, body);
                f.resize(f.size() / 2);
                write_bytes(f);
                return 0;
            }
            if (mode == "oversized") write_bytes(reply(h, KVC_OK, body, int64_t{3} << 30));
            else if (mode == "wrong_length") write_bytes(reply(h, KVC_OK, body, static_cast<int64_t>(out + 20)));
            else if (mode == "wrong_seq") {
                Header other = h;
                other.seq += 7;
                write_bytes(reply(other, KVC_OK, body));
            } else if (mode == "bad_status") write_bytes(reply(h, 99, body));
            else if (mode == "long_message") {
                std::vector<unsigned char> m(4 + 100000, 'm');
                put_u32(m.data(), 100000);
                write_bytes(reply(h, KVC_ERR_INTERNAL, m));
            } else if (mode == "garbage") write_bytes(std::vector<unsigned char>(64, 0x5a));
            else if (mode == "out_of_turn") { // in one write: the stray bytes are there before the next request
                std::vector<unsigned char> f = reply(h, KVC_OK, body);
                f.insert(f.end(), {'h', 'i', '\n'});
                write_bytes(f);
            } else write_bytes(reply(h, KVC_OK, body));
        } else if (h.opcode == kMemory) {
            write_bytes(reply(h, KVC_OK, std::vector<unsigned char>(kMemoryReplyBytes, 0)));
        } else if (h.opcode == kSeqLength) {
            write_bytes(reply(h, KVC_OK, std::vector<unsigned char>(kSeqLengthReplyBytes, 0)));
        } else if (h.opcode == kDestroy) {
            write_bytes(reply(h, KVC_OK, {}));
        } else {
            std::vector<unsigned char> m(4, 0);
            write_bytes(reply(h, KVC_ERR_UNSUPPORTED, m));
        }
    }
}
