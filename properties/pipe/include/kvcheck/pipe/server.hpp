// The server side of the pipe protocol around any plugin table: what `kvcheck serve-plugin LIB.so` runs, so that every
// plugin, the test doubles included, can be judged through the pipe route too (docs/protocol.md).
#pragma once

#include "kvcheck/abi.h"
#include "kvcheck/model_abi.h"

#include <functional>
#include <string>

namespace kvc::pipe {

struct ServeOptions {
    // The allocator reading each reply carries (bytes held from malloc now); empty: kNoReading.
    std::function<uint64_t()> reading;
    // Set when the table could not be made: hello is answered with KVC_ERR_UNSUPPORTED and this message, then the
    // server ends (the proxy reports the words as a plugin that cannot be loaded).
    std::string load_error;
    // The notes descriptor (server isolation; docs/protocol.md, "Notes"), -1: none. An OUT_OF_MEMORY reply that the
    // memory limit likely caused is preceded by "M\n" there, and the guards' fault handler writes its line there.
    int notes_fd = -1;
    // The plugin's model-level table (model_abi.h), checked by whoever loaded it, and what its get_caps declared;
    // null: none is served (the model opcodes are answered KVC_ERR_UNSUPPORTED).
    const kvcm_model_api* model = nullptr;
    kvcm_caps model_caps{};
};

// Serves requests from in_fd, replies to out_fd, until in_fd ends (0) or a frame breaks the protocol (2, the reason
// on stderr). `caps` is what the table declared (checked by whoever loaded it). `api` may be null only with a
// load_error or a model table in the options (a plugin that exports the model level only).
int serve(const kvc_plugin_api* api, const kvc_caps& caps, int in_fd, int out_fd, const ServeOptions& options);

} // namespace kvc::pipe
