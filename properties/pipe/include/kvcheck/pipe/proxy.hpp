// The proxy: a kvc_plugin_api table whose every function forwards its call over the pipe protocol to a client
// process (docs/protocol.md). kvcheck's case process connects, then judges the table like any plugin's: the
// properties, the call driver, the lent buffers and the memory watch run unchanged.
//
// A client that breaks the protocol (a frame that is short, oversized, of the wrong length or not a frame at all; an
// exit; no reply within the timeout; bytes written out of turn) breaks the connection for good: that call and every
// later one return KVC_ERR_INTERNAL with the words of the breakdown, and breakdown() says what happened so that the
// case's verdict can be CRASH, TIMEOUT or ERROR rather than whatever the property made of a failed call.
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/model_abi.h"

#include <optional>
#include <stdexcept>
#include <string>

namespace kvc::pipe {

// The client could not be started or did not complete the handshake. `misbehaved`: it crashed, hung or sent bytes
// that are not the protocol (exit 4, as a plugin that misbehaves while loading); otherwise it answered and cannot
// serve this kvcheck (exit 2).
class ConnectError : public std::runtime_error {
public:
    ConnectError(const std::string& what, bool misbehaved) : std::runtime_error(what), misbehaved_(misbehaved) {}
    bool misbehaved() const { return misbehaved_; }

private:
    bool misbehaved_;
};

// Starts `/bin/sh -c command`, exchanges hello and get_caps, and makes the table ready. One connection per process;
// reply_timeout_s bounds every wait for a reply (and for the client to take a request). `served`: the command is
// kvcheck serve-plugin with --notes-fd 3 (server isolation): its notes pipe is read, and its process is the
// implementation's in the words of a breakdown. Throws ConnectError.
void connect(const std::string& command, double reply_timeout_s, bool served = false);

// connect() over two descriptors instead of a process of its own (the frame-reader fuzz target feeds replies this
// way), and reset(), which forgets the connection and closes them, so that the next connect starts afresh.
void connect_fds(int to_client, int from_client, double reply_timeout_s);
void reset();

// The entry function of the connected table (kvc_entry_fn): the version check is the handshake's, done in connect().
const kvc_plugin_api* proxy_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);
// The model-level table of the connected client (kvcm_entry_fn), when it serves one (protocol 1.5: kvcheck
// serve-plugin around a plugin that exports kvcheck_model_entry); NULL otherwise, as proxy_entry() is NULL for a
// client that serves the model table only.
const kvcm_model_api* model_proxy_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);

struct Breakdown {
    enum class Kind { Crash, Timeout, Error };
    Kind kind = Kind::Error;
    std::string text; // "the reply to read_kv (request #7): the client process died of SIGSEGV ..."
};
// The connection's breakdown, if it broke.
std::optional<Breakdown> breakdown();

// What a served plugin's process wrote on its notes pipe so far (docs/protocol.md, "Notes"): that the memory limit
// refused an allocation ("M"), and the guards' fault line as it died ("G ...", kept only when the process died of
// SIGSEGV, as a case process's). Words only: the plugin can write there too, so nothing here decides a verdict; it
// names the cause of an OUT_OF_MEMORY or of a CRASH.
struct ClientNotes {
    bool allocation_refused = false;
    std::string guard_fault;
};
ClientNotes client_notes();

// Ends the client: closes its stdin, lets it exit, kills it when it does not within a second.
void disconnect();

} // namespace kvc::pipe
