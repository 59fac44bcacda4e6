// The model-level proxy: a kvcm_model_api table whose every function forwards its call over the connection that
// proxy.cpp opened (protocol 1.5), so that the model harness (model_target.cpp) judges a served plugin's model table
// unchanged: its lent buffers are the proxy's to fill, and what the plugin did outside the server's copies comes back
// in the reply's lent-buffer block, which model_target.cpp reports as its own guards' findings. All state is static
// and fixed in size, as the operation-level table's.
#include "proxy_core.hpp"

#include <cstring>
#include <new>

namespace kvc::pipe {
namespace proxied {
namespace {

struct ModelSlot {
    bool used = false;
    uint64_t remote = 0;
    kvcm_model_desc desc{};
    char error[kTextBytes] = "";
};

struct ModelSide {
    bool served = false;
    kvcm_model_api table{};
    kvcm_caps caps{};
    char name[kMaxNameBytes + 1] = "", version[kMaxNameBytes + 1] = "";
    char create_error[kTextBytes] = "(no error)";
    ModelSlot slots[kMaxCaches];
};

ModelSide& side() {
    static ModelSide m;
    return m;
}

ModelSlot* slot_of(const kvcm_model* model) {
    ModelSide& m = side();
    auto* s = reinterpret_cast<ModelSlot*>(const_cast<kvcm_model*>(model));
    if (s < m.slots || s >= m.slots + kMaxCaches || !s->used) return nullptr;
    return s;
}

kvc_status too_large(char* error, const char* op) {
    say(error, kTextBytes, "%s: the arrays are too large for one pipe frame (1 GiB)", op);
    return KVC_ERR_INVALID_ARGUMENT;
}

void m_get_caps(kvcm_caps* out) {
    kvcm_caps c = side().caps;
    c.struct_size = sizeof c;
    std::memcpy(out, &c, out->struct_size < sizeof c ? out->struct_size : sizeof c);
}

kvc_status m_create(const kvcm_model_desc* desc, const kvcm_weights* weights, kvcm_model** out) {
    ModelSide& m = side();
    ModelSlot* s = nullptr;
    for (ModelSlot& x : m.slots)
        if (!x.used) {
            s = &x;
            break;
        }
    if (!s) {
        set_text(m.create_error, "kvcheck's pipe proxy holds at most 256 models at once");
        return KVC_ERR_OUT_OF_MEMORY;
    }
    // The weights travel as the harness lent them: the bytes, or the file's path (the server runs on this machine).
    const bool file = weights->path != nullptr;
    const uint64_t size = file ? std::strlen(weights->path) : weights->size;
    if (file ? size == 0 || size > kMaxPathBytes : size > kMaxPayloadBytes - kModelCreateRequestBytes)
        return too_large(m.create_error, "create");
    unsigned char fixed[kModelCreateRequestBytes];
    encode_model_desc(*desc, fixed);
    put_u32(fixed + kModelDescBytes, weights->format);
    put_u32(fixed + kModelDescBytes + 4, file ? kWeightsFile : kWeightsInMemory);
    put_u64(fixed + kModelDescBytes + 8, size);
    struct iovec req[2] = {{fixed, sizeof fixed},
                           {const_cast<void*>(file ? static_cast<const void*>(weights->path) : weights->data), size}};
    unsigned char handle[kCreateReplyBytes];
    struct iovec rep{handle, sizeof handle};
    const kvc_status st = transact(kModelCreate, req, 2, &rep, 1, sizeof handle, m.create_error);
    if (st != KVC_OK) return st;
    s->used = true;
    s->remote = get_u64(handle);
    s->desc = *desc;
    set_text(s->error, "(no error)");
    *out = reinterpret_cast<kvcm_model*>(s);
    return KVC_OK;
}

void m_destroy(kvcm_model* model) {
    ModelSlot* s = slot_of(model);
    if (!s) return;
    unsigned char b[kCacheRequestBytes];
    put_u64(b, s->remote);
    struct iovec req{b, sizeof b};
    transact(kModelDestroy, &req, 1, nullptr, 0, 0, nullptr);
    s->used = false;
}

const char* m_last_error(const kvcm_model* model) {
    ModelSlot* s = slot_of(model);
    return s ? s->error : side().create_error;
}

kvc_status m_forward(kvcm_model* model, uint32_t seq, uint32_t n_tokens, const int32_t* tokens, float* logits_out) {
    ModelSlot* s = slot_of(model);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    const uint64_t logits = model_logits_bytes(side().caps, s->desc, n_tokens);
    if (logits > kMaxPayloadBytes || uint64_t{n_tokens} * 4 > kMaxPayloadBytes / 2)
        return too_large(s->error, "forward");
    Fields f(s->remote);
    f.u32(seq).u32(n_tokens);
    struct iovec req[2] = {{f.b, f.n}, {const_cast<int32_t*>(tokens), uint64_t{n_tokens} * 4}};
    struct iovec rep{logits_out, logits};
    return transact(kModelForward, req, 2, &rep, 1, logits, s->error);
}

kvc_status m_read_kv(kvcm_model* model, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                     void* v_out) {
    ModelSlot* s = slot_of(model);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    const uint64_t rows = model_rows_bytes(s->desc, n);
    if (2 * rows > kMaxPayloadBytes) return too_large(s->error, "read_kv");
    Fields f(s->remote);
    f.u32(seq).u32(layer).u32(pos).u32(n);
    struct iovec req{f.b, f.n};
    struct iovec rep[2] = {{k_out, rows}, {v_out, rows}};
    return transact(kModelReadKv, &req, 1, rep, 2, 2 * rows, s->error);
}

kvc_status pair_call(uint16_t op, kvcm_model* model, uint32_t a, uint32_t b) {
    ModelSlot* s = slot_of(model);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    Fields f(s->remote);
    f.u32(a).u32(b);
    struct iovec req{f.b, f.n};
    return transact(op, &req, 1, nullptr, 0, 0, s->error);
}

kvc_status m_fork(kvcm_model* model, uint32_t parent, uint32_t child) {
    return pair_call(kModelFork, model, parent, child);
}
kvc_status m_release(kvcm_model* model, uint32_t seq) { return pair_call(kModelRelease, model, seq, 0); }

kvc_status m_memory(kvcm_model* model, kvcm_memory* out) {
    ModelSlot* s = slot_of(model);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    Fields f(s->remote);
    struct iovec req{f.b, f.n};
    unsigned char b[kModelMemoryReplyBytes];
    struct iovec rep{b, sizeof b};
    const kvc_status st = transact(kModelMemory, &req, 1, &rep, 1, sizeof b, s->error);
    if (st != KVC_OK) return st;
    kvcm_memory got{};
    got.struct_size = out->struct_size;
    got.bytes_per_token = get_u64(b);
    got.live_bytes = get_u64(b + 8);
    got.reserved_bytes = get_u64(b + 16);
    std::memcpy(out, &got, out->struct_size < sizeof got ? out->struct_size : sizeof got);
    return KVC_OK;
}

kvc_status m_kv_projections(kvcm_model* model, uint64_t* out) {
    ModelSlot* s = slot_of(model);
    if (!s) return KVC_ERR_INVALID_ARGUMENT;
    Fields f(s->remote);
    struct iovec req{f.b, f.n};
    unsigned char b[kModelCountReplyBytes];
    struct iovec rep{b, sizeof b};
    const kvc_status st = transact(kModelKvProjections, &req, 1, &rep, 1, sizeof b, s->error);
    if (st == KVC_OK) *out = get_u64(b);
    return st;
}

} // namespace

bool model_handshake(kvc_status* status, char* msg, uint64_t* reading) {
    ModelSide& m = side();
    unsigned char b[kModelGetCapsReplyBytes];
    struct iovec rep{b, sizeof b};
    *status = transact(kModelGetCaps, nullptr, 0, &rep, 1, sizeof b, msg, reading);
    if (*status != KVC_OK) return false;
    std::memcpy(m.name, b + 8, kMaxNameBytes);
    std::memcpy(m.version, b + 8 + kMaxNameBytes, kMaxNameBytes);
    m.name[kMaxNameBytes] = m.version[kMaxNameBytes] = 0;
    m.caps = decode_model_caps(b + 8 + 2 * kMaxNameBytes);
    kvcm_model_api& t = m.table;
    t.struct_size = sizeof t;
    // the plugin's own version: model_target.cpp checks the table exactly as it would have checked the plugin's
    t.abi_major = get_u32(b);
    t.abi_minor = get_u32(b + 4);
    t.name = m.name;
    t.version = m.version;
    t.get_caps = m_get_caps;
    t.create = m_create;
    t.destroy = m_destroy;
    t.last_error = m_last_error;
    t.forward = m_forward;
    t.read_kv = m_read_kv;
    t.fork = m_fork;
    t.release = m_release;
    t.memory = m_memory;
    t.kv_projections = m_kv_projections;
    m.served = true;
    return true;
}

void model_reset() {
    ModelSide& m = side();
    m.~ModelSide();
    new (&m) ModelSide();
}

} // namespace proxied

const kvcm_model_api* model_proxy_entry(uint32_t, uint32_t) {
    return proxied::conn().channel.started() && proxied::side().served ? &proxied::side().table : nullptr;
}

} // namespace kvc::pipe
