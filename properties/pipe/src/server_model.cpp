// The model level behind kvcheck serve-plugin: each kvcm_model_api call the harness makes (model_target.cpp) arrives
// as its own opcode (protocol 1.5) and is made here with the buffers the harness would have lent, under the same names,
// in the same order, checked by the same guards: what the call did outside them travels in the reply's lent-buffer
// block, and model_target.cpp reports it as it reports its own guards' findings.
#include "server_core.hpp"

namespace kvc::pipe::served {

ServedModel* Server::model_at(std::size_t offset) {
    const uint64_t id = get_u64(req_ + offset);
    if (id == 0 || id > kMaxCaches || !models_[id - 1].model) return nullptr;
    return &models_[id - 1];
}

bool Server::model_status(kvc_status st, const kvcm_model* model, struct iovec* body, int n) {
    if (st == KVC_OK) return ok(body, n);
    return refused(st, model_->last_error(model));
}

bool Server::model_dispatch() {
    if (!model_) return error(KVC_ERR_UNSUPPORTED, "the plugin exports no model-level table (" KVCM_ENTRY_SYMBOL ")");
    if (minor_ < kModelMinor) return error(KVC_ERR_INVALID_ARGUMENT, "model-level requests need protocol 1.5");
    if (op_ == kModelGetCaps) return model_get_caps();
    if (op_ == kModelCreate) return model_create();
    const std::size_t want = op_ == kModelForward   ? kModelForwardRequestBytes
                             : op_ == kModelReadKv  ? kReadRequestBytes
                             : op_ == kModelFork || op_ == kModelRelease ? kPairRequestBytes
                                                                         : kCacheRequestBytes;
    if (op_ == kModelForward ? len_ < want : len_ != want) return wrong_length(want);
    ServedModel* m = model_at(0);
    if (op_ == kModelDestroy) {
        if (m) {
            model_->destroy(m->model);
            m->model = nullptr;
        }
        forget_graveyard_when_idle();
        return ok();
    }
    if (!m) return error(KVC_ERR_INVALID_ARGUMENT, "unknown model handle");
    switch (op_) {
    case kModelForward: return model_forward(m);
    case kModelReadKv: return model_read_kv(m);
    case kModelMemory: return model_memory(m);
    case kModelKvProjections: return model_count(m);
    case kModelFork:
    case kModelRelease: {
        // (the harness lends these calls nothing: their arguments are numbers)
        const bool fork = op_ == kModelFork;
        if (fork ? !KVCM_API_HAS(model_, fork) : !KVCM_API_HAS(model_, release))
            return error(KVC_ERR_UNSUPPORTED, "not provided by the plugin");
        errno = 0;
        const kvc_status st = fork ? model_->fork(m->model, get_u32(req_ + 8), get_u32(req_ + 12))
                                   : model_->release(m->model, get_u32(req_ + 8));
        prop::note_if_refused(st, errno);
        return model_status(st, m->model);
    }
    }
    return error(KVC_ERR_INVALID_ARGUMENT, "unknown opcode");
}

bool Server::model_get_caps() {
    if (len_ != 0) return wrong_length(0);
    unsigned char b[kModelGetCapsReplyBytes] = {};
    put_u32(b, model_->abi_major);
    put_u32(b + 4, model_->abi_minor);
    std::strncpy(reinterpret_cast<char*>(b + 8), model_->name ? model_->name : "(unnamed)", kMaxNameBytes);
    std::strncpy(reinterpret_cast<char*>(b + 8 + kMaxNameBytes), model_->version ? model_->version : "",
                 kMaxNameBytes);
    encode_model_caps(o_.model_caps, b + 8 + 2 * kMaxNameBytes);
    struct iovec v{b, sizeof b};
    return ok(&v, 1);
}

bool Server::model_create() {
    if (len_ < kModelCreateRequestBytes) return wrong_length(kModelCreateRequestBytes);
    const kvcm_model_desc desc = decode_model_desc(req_);
    const uint32_t format = get_u32(req_ + kModelDescBytes), where = get_u32(req_ + kModelDescBytes + 4);
    const uint64_t size = get_u64(req_ + kModelDescBytes + 8);
    if (size > kMaxPayloadBytes || len_ != kModelCreateRequestBytes + size)
        return wrong_length(kModelCreateRequestBytes + (size > kMaxPayloadBytes ? 0 : size));
    const unsigned char* data = req_ + kModelCreateRequestBytes;
    const bool in_memory = where == kWeightsInMemory;
    char path[kMaxPathBytes + 1] = "";
    if (!in_memory) {
        if (where != kWeightsFile || size == 0 || size > kMaxPathBytes || std::memchr(data, 0, size))
            return error(KVC_ERR_INVALID_ARGUMENT, "kvcheck serve-plugin: weights neither in memory nor a file path");
        std::memcpy(path, data, size);
    }
    int free_slot = -1;
    for (int i = 0; i < kMaxCaches && free_slot < 0; ++i)
        if (!models_[i].model) free_slot = i;
    if (free_slot < 0) return error(KVC_ERR_OUT_OF_MEMORY, "kvcheck serve-plugin holds at most 256 models");
    // As Model's constructor lends them (model_target.cpp): copies of the description, the weights view and what it
    // points to, and the out handle, each between guards.
    Lent d("kvcm_model_desc", sizeof desc, &desc);
    Lent bytes("weights", in_memory ? size : 0, in_memory ? data : nullptr);
    Lent file("weights path", in_memory ? 0 : size + 1, in_memory ? nullptr : path);
    kvcm_weights w{};
    w.struct_size = sizeof w;
    w.format = format;
    if (in_memory) {
        w.data = bytes.data();
        w.size = size;
    } else {
        w.path = file.as<const char>();
    }
    Lent lw("kvcm_weights", sizeof w, &w);
    kvcm_model* const none = nullptr;
    Lent out("create's out (kvcm_model*)", sizeof none, &none);
    const kvc_status st = lent_call("create", [&] {
        return model_->create(d.as<const kvcm_model_desc>(), lw.as<const kvcm_weights>(), out.as<kvcm_model*>());
    });
    check_lent("create", {{&d, &desc},
                          {&lw, &w},
                          {&bytes, in_memory ? data : nullptr},
                          {&file, in_memory ? nullptr : path},
                          {&out, nullptr}});
    kvcm_model* made = nullptr;
    std::memcpy(&made, out.data(), sizeof made);
    bury({&d, &bytes, &file, &lw, &out});
    if (st != KVC_OK || !made) return model_status(st == KVC_OK ? KVC_ERR_INTERNAL : st, nullptr);
    models_[free_slot] = {made, desc};
    unsigned char b[kCreateReplyBytes];
    put_u64(b, static_cast<uint64_t>(free_slot) + 1);
    struct iovec v{b, sizeof b};
    return ok(&v, 1);
}

bool Server::model_forward(ServedModel* m) {
    const uint32_t n = get_u32(req_ + 12);
    const uint64_t logits = model_logits_bytes(o_.model_caps, m->desc, n);
    if (logits > kMaxPayloadBytes) return error(KVC_ERR_INVALID_ARGUMENT, "more logits than a reply frame carries");
    const uint64_t want = kModelForwardRequestBytes + uint64_t{n} * 4;
    if (len_ != want) return wrong_length(want);
    const unsigned char* tokens = req_ + kModelForwardRequestBytes;
    Lent in("tokens", uint64_t{n} * 4, tokens), out("logits_out", logits);
    const kvc_status st = lent_call("forward", [&] {
        return model_->forward(m->model, get_u32(req_ + 8), n, in.as<const int32_t>(), out.as<float>());
    });
    check_lent("forward", {{&in, tokens}, {&out, nullptr}});
    struct iovec body{out.data(), logits};
    const bool sent = model_status(st, m->model, &body, 1);
    bury({&in, &out});
    return sent;
}

bool Server::model_read_kv(ServedModel* m) {
    if (!KVCM_API_HAS(model_, read_kv)) return error(KVC_ERR_UNSUPPORTED, "not provided by the plugin");
    const uint32_t seq = get_u32(req_ + 8), layer = get_u32(req_ + 12), pos = get_u32(req_ + 16);
    const uint32_t n = get_u32(req_ + 20);
    const uint64_t rows = model_rows_bytes(m->desc, n);
    if (2 * rows > kMaxPayloadBytes) return error(KVC_ERR_INVALID_ARGUMENT, "more rows than a reply frame carries");
    Lent ko("k_out", rows), vo("v_out", rows);
    const kvc_status st = lent_call("read_kv", [&] {
        return model_->read_kv(m->model, seq, layer, pos, n, ko.data(), vo.data());
    });
    check_lent("read_kv", {{&ko, nullptr}, {&vo, nullptr}});
    struct iovec body[2] = {{ko.data(), rows}, {vo.data(), rows}};
    const bool sent = model_status(st, m->model, body, 2);
    bury({&ko, &vo});
    return sent;
}

bool Server::model_memory(ServedModel* m) {
    kvcm_memory init{};
    init.struct_size = sizeof init;
    Lent lm("kvcm_memory", sizeof init, &init);
    const kvc_status st = lent_call("memory", [&] { return model_->memory(m->model, lm.as<kvcm_memory>()); });
    check_lent("memory", {{&lm, nullptr}});
    kvcm_memory got;
    std::memcpy(&got, lm.data(), sizeof got);
    bury({&lm});
    unsigned char b[kModelMemoryReplyBytes];
    put_u64(b, got.bytes_per_token);
    put_u64(b + 8, got.live_bytes);
    put_u64(b + 16, got.reserved_bytes);
    struct iovec v{b, sizeof b};
    return model_status(st, m->model, &v, 1);
}

bool Server::model_count(ServedModel* m) {
    if (!KVCM_API_HAS(model_, kv_projections)) return error(KVC_ERR_UNSUPPORTED, "not provided by the plugin");
    const uint64_t zero = 0;
    Lent out("kv_projections' out", sizeof zero, &zero);
    const kvc_status st = lent_call("kv_projections", [&] {
        return model_->kv_projections(m->model, out.as<uint64_t>());
    });
    check_lent("kv_projections", {{&out, nullptr}});
    uint64_t count = 0;
    std::memcpy(&count, out.data(), sizeof count);
    bury({&out});
    unsigned char b[kModelCountReplyBytes];
    put_u64(b, count);
    struct iovec v{b, sizeof b};
    return model_status(st, m->model, &v, 1);
}

} // namespace kvc::pipe::served
