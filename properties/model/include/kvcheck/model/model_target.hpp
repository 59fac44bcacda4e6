// A model-level implementation as the harness sees it: its table (checked once at load) and, per case, a Model
// that owns one created kvcm_model. Every call goes through here, so every refusal becomes a CallError carrying the
// status and the engine's own message.
#pragma once

#include "kvcheck/model_abi.h"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvc::model {

// The table itself is unusable: wrong major version, a required member missing, a declared feature without its
// member, a NULL name. The CLI maps it to exit code 2 (docs/bad-input.md).
class TargetError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The implementation misbehaved while being loaded (get_caps wrote outside the kvcm_caps it was lent): exit code 4,
// as the operation level's PluginMisbehaved.
class TargetMisbehaved : public TargetError {
public:
    using TargetError::TargetError;
};

// A call wrote outside a buffer it was lent, or into a const input (lent.hpp words it): a FAIL of the property that
// made the call, whatever the call returned.
class LentViolation : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A call returned something other than KVC_OK.
class CallError : public std::runtime_error {
public:
    CallError(kvc_status status, const std::string& what) : std::runtime_error(what), status_(status) {}
    kvc_status status() const { return status_; }

private:
    kvc_status status_;
};

class ModelTarget {
public:
    // From an entry function linked into this program (ours, the C example, the tests' doubles).
    static ModelTarget from_entry(kvcm_entry_fn entry);
    // From a shared library exporting KVCM_ENTRY_SYMBOL. Throws TargetError naming the path and what is wrong.
    static ModelTarget from_library(const std::string& path);
    // True when path exports KVCM_ENTRY_SYMBOL. Loads the library into this process (its constructors run here):
    // `kvcheck validate` asks in its probe child instead (kvcheck_harness, child.cpp), never in the parent.
    static bool library_exports_model_entry(const std::string& path);

    const kvcm_model_api* api() const { return api_; }
    const kvcm_caps& caps() const { return caps_; }
    const std::string& name() const { return name_; }
    bool has(uint32_t feature) const { return (caps_.features & feature) != 0; }

private:
    static ModelTarget checked(const kvcm_model_api* api, std::shared_ptr<void> handle);
    const kvcm_model_api* api_ = nullptr;
    kvcm_caps caps_{};
    std::string name_;
    std::shared_ptr<void> handle_; // keeps a dlopen'ed library loaded while any copy lives
};

// One created model. Every buffer handed to the engine is lent (properties/src/lent.hpp): a copy between guard zones
// checked when the call returns, outputs filled with NaN before it, so a row the engine does not write shows as NaN.
// The engine never gets the harness's own description or weights, only copies: whatever it does to them, the
// harness sizes its buffers and grades by its own.
class Model {
public:
    // weights: the bytes of a file in the given format; passed as an in-memory view, or, with path non-empty, as
    // that file (which must hold the same bytes).
    Model(const ModelTarget& target, const kvcm_model_desc& desc, uint32_t format, const std::string& weights,
          const std::string& path = "");
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    // Logit rows: n_tokens rows with KVCM_FEATURE_ALL_LOGITS, else one (the last token's). Row-major [rows][vocab].
    std::vector<float> forward(uint32_t seq, const std::vector<int>& tokens);
    // f32 caches only in ABI 1.0's properties: [n][kv_dim] each.
    void read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, std::vector<float>& k, std::vector<float>& v);
    kvc_status try_read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n);
    void fork(uint32_t parent, uint32_t child);
    void release(uint32_t seq);
    kvc_status try_release(uint32_t seq);
    kvcm_memory memory();
    uint64_t kv_projections();

private:
    [[noreturn]] void fail(kvc_status s, const std::string& call);
    const ModelTarget& target_;
    kvcm_model_desc desc_;
    kvcm_model* model_ = nullptr;
};

} // namespace kvc::model
