// Fuzz target of the parent's frame reader (docs/protocol.md, "What a broken client gets"): the input is what a client
// writes to its stdout, as chunks (u16 little-endian length, then the bytes; a last short chunk is taken as it is),
// one chunk written after each request the proxy sends while it connects and then calls every operation once, of
// whichever tables the replies say the client serves (the model level's from protocol 1.5).
// Whatever the bytes, the proxy must return a status (with words when the connection broke), write no byte outside
// the buffers it is given (AddressSanitizer), and never block (the pipe ends after the last chunk).
#include "kvcheck/abi.hpp"
#include "kvcheck/model_abi.h"
#include "kvcheck/pipe/proxy.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

bool read_exact(int fd, unsigned char* p, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
        const ssize_t r = ::read(fd, p + got, n - got);
        if (r <= 0) return false;
        got += static_cast<std::size_t>(r);
    }
    return true;
}

// The client: reads each request (kvcheck's own, trusted framing), then answers with the next chunk of the input.
void feed(const uint8_t* data, size_t size, int requests, int replies) {
    std::vector<unsigned char> skip;
    std::size_t at = 0;
    while (at < size) {
        unsigned char head[16];
        if (!read_exact(requests, head, sizeof head)) break;
        skip.resize(head[12] | head[13] << 8 | head[14] << 16 | static_cast<std::size_t>(head[15]) << 24);
        if (!read_exact(requests, skip.data(), skip.size())) break;
        std::size_t n = size - at;
        if (n >= 2) {
            n = std::min<std::size_t>(data[at] | data[at + 1] << 8, n - 2);
            at += 2;
        }
        for (std::size_t done = 0; done < n;) {
            const ssize_t w = ::write(replies, data + at + done, n - done);
            if (w <= 0) break;
            done += static_cast<std::size_t>(w);
        }
        at += n;
    }
    ::close(replies);
    while (::read(requests, skip.data(), skip.empty() ? 0 : 1) > 0) {
    }
    ::close(requests);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size > 1000000) return 0;
    int req[2], rep[2];
    if (::pipe2(req, O_CLOEXEC) != 0) return 0;
    if (::pipe2(rep, O_CLOEXEC) != 0) {
        ::close(req[0]);
        ::close(req[1]);
        return 0;
    }
    std::thread client(feed, data, size, req[0], rep[1]);
    try {
        kvc::pipe::connect_fds(req[1], rep[0], 0.05);
    } catch (const kvc::pipe::ConnectError&) {
        kvc::pipe::reset();
        client.join();
        return 0;
    }
    const kvc_plugin_api* api = kvc::pipe::proxy_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    kvc_config cfg = kvc::make_config(2, 2, 1, 32, KVC_DTYPE_Q8_0, 4, 64);
    kvc_cache* cache = nullptr;
    if (api && api->create(&cfg, &cache) == KVC_OK) {
        std::vector<float> q(2 * 2 * 32, 1.0f), kv(2 * 1 * 32, 1.0f), out(q.size());
        api->append_attend(cache, 0, 1, 2, q.data(), kv.data(), kv.data(), out.data());
        std::vector<unsigned char> k(2 * 32), v(2 * 32), ks(2 * 2), vs(2 * 2);
        api->read_kv(cache, 0, 1, 0, 2, k.data(), v.data());
        api->read_kv_scales(cache, 0, 1, 0, 2, ks.data(), vs.data());
        uint32_t len = 0;
        api->seq_length(cache, 0, 1, &len);
        kvc_memory m{};
        m.struct_size = sizeof m;
        api->memory(cache, &m);
        api->fork(cache, 0, 1);
        const uint32_t ids[2] = {0, 1}, offs[3] = {0, 1, 2};
        kvc_batch b{};
        b.struct_size = sizeof b;
        b.n_seqs = 2;
        b.seq_ids = ids;
        b.token_offsets = offs;
        b.q = q.data();
        b.k = b.v = kv.data();
        b.out = out.data();
        api->append_attend_batch(cache, 0, &b);
        api->release(cache, 1);
        if (std::strlen(api->last_error(cache)) > 8192) std::abort(); // messages are bounded
        api->destroy(cache);
    }
    if (const kvcm_model_api* m = kvc::pipe::model_proxy_entry(KVCM_ABI_VERSION_MAJOR, KVCM_ABI_VERSION_MINOR)) {
        kvcm_caps caps{};
        caps.struct_size = sizeof caps;
        m->get_caps(&caps);
        kvcm_model_desc d{};
        d.struct_size = sizeof d;
        d.dim = 8;
        d.hidden_dim = 16;
        d.n_layers = 1;
        d.n_heads = 2;
        d.n_kv_heads = 1;
        d.head_dim = 4;
        d.vocab_size = 5;
        d.max_context = 8;
        d.max_seqs = 2;
        const std::vector<unsigned char> bytes(64, 1);
        kvcm_weights w{};
        w.struct_size = sizeof w;
        w.data = bytes.data();
        w.size = bytes.size();
        kvcm_model* model = nullptr;
        if (m->create(&d, &w, &model) == KVC_OK) {
            const int32_t tokens[2] = {1, 2};
            std::vector<float> logits(2 * 5), k(2 * 4), v(2 * 4);
            m->forward(model, 0, 2, tokens, logits.data());
            m->read_kv(model, 0, 0, 0, 2, k.data(), v.data());
            kvcm_memory mem{};
            mem.struct_size = sizeof mem;
            m->memory(model, &mem);
            uint64_t projected = 0;
            m->kv_projections(model, &projected);
            m->fork(model, 0, 1);
            m->release(model, 1);
            if (std::strlen(m->last_error(model)) > 8192) std::abort();
            m->destroy(model);
        }
        if (std::strlen(m->last_error(nullptr)) > 8192) std::abort();
    }
    if (const auto b = kvc::pipe::breakdown(); b && b->text.empty()) std::abort(); // a breakdown always has words
    kvc::pipe::reset();
    client.join();
    return 0;
}
