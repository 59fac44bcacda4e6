// The proxy's connection, private to kvcheck_pipe: the one client process, its handshake state and the request/reply
// transaction, shared by the operation-level table (proxy.cpp) and the model-level table (model_proxy.cpp), which
// forward their calls over the same pipe, one request in flight at a time.
#pragma once

#include "channel.hpp"
#include "kvcheck/pipe/protocol.hpp"
#include "kvcheck/pipe/proxy.hpp"
#include "lent.hpp"

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace kvc::pipe::proxied {

constexpr int kMaxCaches = 256;
constexpr std::size_t kTextBytes = kMaxMessageBytes + 512;
// The mirror starts this large (address space only: an untouched malloc'ed block costs no memory), so that a client
// whose reading falls below where it started is still followed down.
constexpr uint64_t kMirrorBase = uint64_t{64} << 20;
// A reading this far above the first one is not believed (a 64-bit value a client made up): the mirror stays put.
constexpr int64_t kMirrorMaxGrowth = int64_t{1} << 40;

struct Slot {
    bool used = false;
    uint64_t remote = 0;
    Shape shape;
    char error[kTextBytes] = "";
};

// A lent-buffer violation the client reported (protocol 1.4), in fixed storage: handed to the call driver as
// prop::FarViolation after the call.
struct FarText {
    char buffer[kMaxNameBytes + 1];
    char what[kMaxMessageBytes + 1];
};

struct Connection {
    Channel channel;
    double timeout_s = 30;
    uint32_t seq = 0;
    uint32_t minor = 0; // the protocol minor both sides speak
    kvc_plugin_api table{};
    char name[kMaxNameBytes + 1] = "", version[kMaxNameBytes + 1] = "";
    kvc_caps caps{};
    bool mirrored = false; // the client's readings are followed (a process of ours, a heap watch that can see it)
    bool served = false;   // the client is kvcheck serve-plugin: its process is the implementation's
    char notes[2048] = "";
    std::size_t n_notes = 0;
    bool has_operation = true; // the client serves the operation-level table (a server may serve the model one only)
    bool broken = false;
    Breakdown::Kind kind = Breakdown::Kind::Error;
    char broken_text[kTextBytes] = "";
    char create_error[kTextBytes] = "(no error)";
    uint64_t baseline = kNoReading; // the client's first reading
    void* mirror = nullptr;
    FarText far_text[kMaxLentViolations];
    prop::FarViolation far[kMaxLentViolations];
    std::size_t n_far = 0; // of the last reply, until the call driver takes them
    Slot slots[kMaxCaches];
};

Connection& conn();

// The request of a call on one cache or model: u64 handle then u32 fields.
struct Fields {
    unsigned char b[32];
    std::size_t n = 8;
    explicit Fields(uint64_t remote) { put_u64(b, remote); }
    Fields& u32(uint32_t v) {
        put_u32(b + n, v);
        n += 4;
        return *this;
    }
};

// snprintf into a fixed buffer, cutting what does not fit (messages are bounded on purpose).
__attribute__((format(printf, 3, 4))) void say(char* dst, std::size_t cap, const char* fmt, ...);
void set_text(char* dst, const char* src);

// One request and its reply. `req` holds the request's payload parts (the header is prepended here); `out` the
// buffers the reply body goes into, `body` its exact length. Returns the client's status; on anything but KVC_OK
// the message is in msg_out. *reading gets the client's allocator reading. A reply that breaks the protocol breaks
// the connection for good (breakdown()).
kvc_status transact(uint16_t op, struct iovec* req, int n_req, const struct iovec* out, int n_out, std::size_t body,
                    char* msg_out, uint64_t* reading = nullptr);

// The model level's side of the connection (model_proxy.cpp). model_handshake(): at protocol 1.5 and later, asks the
// client for its model table (model get_caps); true when it serves one, false when it answers UNSUPPORTED; any other
// failure is reported through *status and msg (the handshake refuses the client). model_reset() forgets it.
bool model_handshake(kvc_status* status, char* msg, uint64_t* reading);
void model_reset();

} // namespace kvc::pipe::proxied
