// The server side of the pipe protocol, private to kvcheck_pipe: the Server that reads requests, lends the plugin
// guarded buffers, calls it and replies, with what every call shares (the reply, the lending checks, the graveyard).
// server.cpp defines the session and the operation level's calls; server_model.cpp the model level's, on the same
// frames, lending, checks and replies, so that both tables are served by one server and one set of guards.
#pragma once

#include "kvcheck/pipe/server.hpp"

#include "channel.hpp"
#include "kvcheck/pipe/protocol.hpp"
#include "kvcheck/properties/refused_allocation.hpp"
#include "lent.hpp"

#include <sys/resource.h>

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace kvc::pipe::served {


constexpr int kMaxCaches = 256;
// Retired lent buffers kept mapped (poisoned) so that a pointer the plugin kept reads NaN, as under the harness; the
// oldest is unmapped beyond this many (each is a few pages and a mapping or two of the process's limit).
constexpr std::size_t kGraveyard = 4096;

using prop::Lent;

// A buffer lent for one call, and what its payload must still equal afterwards (inputs); nullptr for outputs.
struct Lending {
    Lent* buffer;
    const void* input;
};

// What the guards found after a call, in fixed storage: the reply's lent-buffer block (or, below 1.4, its error).
struct Violation {
    const char* buffer = "";
    uint64_t bytes = 0;
    uint32_t length = 0;
    char what[kMaxMessageBytes];
};

struct Served {
    kvc_cache* cache = nullptr;
    Shape shape;
};

// A created model and the description its array lengths follow from.
struct ServedModel {
    kvcm_model* model = nullptr;
    kvcm_model_desc desc{};
};

class Server {
public:
    Server(const kvc_plugin_api* api, const kvc_caps& caps, int in, int out, const ServeOptions& o)
        : api_(api), caps_(caps), model_(o.model), in_(in), out_(out), o_(o) {
        graveyard_.reserve(kGraveyard); // before the first reading: the graveyard never moves the heap later
    }

    int run();

    // The session is over: caches the peer did not destroy (it ended, or broke the protocol) are destroyed as the
    // harness destroys its own, so that the plugin's memory is given back before the process ends.
    void destroy_all() {
        for (Served& c : caches_)
            if (c.cache) {
                api_->destroy(c.cache);
                c.cache = nullptr;
            }
        for (ServedModel& m : models_)
            if (m.model) {
                model_->destroy(m.model);
                m.model = nullptr;
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

    bool reply(kvc_status st, const char* message, struct iovec* body, int n_body);
    bool ok(struct iovec* body = nullptr, int n = 0) { return reply(KVC_OK, "", body, n); }
    bool error(kvc_status st, const char* message) { return reply(st, message, nullptr, 0); }
    bool status(kvc_status st, kvc_cache* cache, struct iovec* body = nullptr, int n = 0) {
        if (st == KVC_OK) return ok(body, n);
        return refused(st, api_->last_error(cache));
    }
    // A call that failed: its status and the plugin's message (last_error's), after the memory limit's note.
    bool refused(kvc_status st, const char* message) {
        if (st == KVC_ERR_OUT_OF_MEMORY && o_.notes_fd >= 0 && prop::memory_limit_likely_hit(address_limit()) &&
            ::write(o_.notes_fd, "M\n", 2) < 0) {
        } // (a note the proxy cannot read only loses the limit's name from the words)
        return error(st, message ? message : "(no message)");
    }
    // No cache or model can hold a pointer into the buried buffers any more: they go.
    void forget_graveyard_when_idle() {
        for (const Served& c : caches_)
            if (c.cache) return;
        for (const ServedModel& m : models_)
            if (m.model) return;
        graveyard_.clear();
        oldest_ = 0;
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
    // After a call: what it did outside the buffers it was lent, as the call driver's guards word it.
    void check_lent(const char* call, std::initializer_list<Lending> lent) {
        for (const Lending& l : lent) {
            std::size_t bytes = 0;
            const std::string what = l.buffer->violation(call, l.input, &bytes);
            if (what.empty() || n_violations_ == kMaxLentViolations) continue;
            Violation& v = violations_[n_violations_++];
            v.buffer = l.buffer->name();
            v.bytes = bytes;
            v.length = static_cast<uint32_t>(std::min<std::size_t>(what.size(), sizeof v.what));
            std::memcpy(v.what, what.data(), v.length);
        }
    }
    // After the reply: the buffers are poisoned and kept, so that a pointer the plugin kept reads NaN.
    void bury(std::initializer_list<Lent*> lent) {
        for (Lent* l : lent) {
            l->retire();
            if (graveyard_.size() < kGraveyard) graveyard_.push_back(std::move(*l));
            else graveyard_[oldest_++ % kGraveyard] = std::move(*l);
        }
    }
    // The guards' fault handler names the call under way (a far stray write faults in a protected page).
    template <typename F>
    kvc_status lent_call(const char* call, F&& f) {
        const prop::LentCall naming(call);
        errno = 0; // an ENOMEM left from an earlier call the plugin recovered from is not this call's
        const kvc_status st = f();
        prop::note_if_refused(st, errno);
        return st;
    }
    // This process's address-space limit (RLIMIT_AS, inherited from the case process); 0: none.
    static uint64_t address_limit() {
        struct rlimit l{};
        return ::getrlimit(RLIMIT_AS, &l) == 0 && l.rlim_cur != RLIM_INFINITY ? static_cast<uint64_t>(l.rlim_cur) : 0;
    }

    // The operation level (server.cpp): one request, then its call.
    bool dispatch();
    bool create();
    bool append();
    bool batch();
    bool read();

    // The model level (server_model.cpp): the same lending, checking and burying around kvcm_model_api's calls.
    bool model_dispatch();
    bool model_get_caps();
    bool model_create();
    bool model_forward(ServedModel* m);
    bool model_read_kv(ServedModel* m);
    bool model_memory(ServedModel* m);
    bool model_count(ServedModel* m);
    bool model_status(kvc_status st, const kvcm_model* model, struct iovec* body = nullptr, int n = 0);
    ServedModel* model_at(std::size_t offset);

    const kvc_plugin_api* api_;
    kvc_caps caps_;
    const kvcm_model_api* model_; // null: the plugin exports no model table
    ServedModel models_[kMaxCaches];
    int in_, out_;
    const ServeOptions& o_;
    MappedBuffer request_buf_;
    unsigned char* req_ = nullptr;
    std::vector<Lent> graveyard_;
    std::size_t oldest_ = 0;
    Violation violations_[kMaxLentViolations];
    std::size_t n_violations_ = 0;
    uint32_t seq_ = 0, len_ = 0;
    uint16_t op_ = 0;
    uint32_t minor_ = 0; // the protocol minor of this connection, set by hello
    Served caches_[kMaxCaches];
};

} // namespace kvc::pipe::served
