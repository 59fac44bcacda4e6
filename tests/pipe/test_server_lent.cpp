// The server's lent buffers at the frame level (docs/protocol.md, "The lent-buffer block"): kvcheck's pipe server
// lends a plugin guarded copies and says in the reply what the call did outside them. Spoken here by hand, as a peer
// of either minor would: at 1.4 the reply carries the block (flag bit 0) and still its body; below 1.4 the call fails
// with the guards' words instead; a plugin that stays inside what it is lent gets flags 0 at 1.4.
// The model table (protocol 1.5) is spoken the same way.
#include "kvcheck/abi.hpp"
#include "kvcheck/model_abi.h"
#include "kvcheck/pipe/protocol.hpp"
#include "kvcheck/pipe/server.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace kvc::pipe;

bool read_all(int fd, unsigned char* p, std::size_t n) {
    for (std::size_t got = 0; got < n;) {
        const ssize_t r = ::read(fd, p + got, n - got);
        if (r <= 0) return false;
        got += static_cast<std::size_t>(r);
    }
    return true;
}

bool write_all(int fd, const unsigned char* p, std::size_t n) {
    for (std::size_t done = 0; done < n;) {
        const ssize_t w = ::write(fd, p + done, n - done);
        if (w <= 0) return false;
        done += static_cast<std::size_t>(w);
    }
    return true;
}

struct Reply {
    uint32_t status = 0, flags = 0;
    std::vector<unsigned char> rest; // after the 16-byte prefix
};

// One plugin served on a thread, and the requests a peer of `minor` sends it. `model`: its model-level table only.
class Served {
public:
    Served(const std::string& lib, uint32_t minor, bool model = false) {
        handle_ = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
        EXPECT_NE(handle_, nullptr) << dlerror();
        if (!handle_) return;
        if (model) {
            auto entry = reinterpret_cast<kvcm_entry_fn>(dlsym(handle_, KVCM_ENTRY_SYMBOL));
            options_.model = entry(KVCM_ABI_VERSION_MAJOR, KVCM_ABI_VERSION_MINOR);
            options_.model_caps.struct_size = sizeof options_.model_caps;
            options_.model->get_caps(&options_.model_caps);
        } else {
            auto entry = reinterpret_cast<kvc_entry_fn>(dlsym(handle_, KVC_ENTRY_SYMBOL));
            api_ = entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
            caps_.struct_size = sizeof caps_;
            api_->get_caps(&caps_);
        }
        int a[2], b[2];
        EXPECT_EQ(::pipe2(a, O_CLOEXEC), 0);
        EXPECT_EQ(::pipe2(b, O_CLOEXEC), 0);
        to_ = a[1];
        from_ = b[0];
        server_ = std::thread([this, in = a[0], out = b[1]] {
            rc_ = serve(api_, caps_, in, out, options_);
            ::close(in);
            ::close(out);
        });
        unsigned char hello[kHelloRequestBytes];
        put_u32(hello, kProtocolMajor);
        put_u32(hello + 4, minor);
        const Reply r = request(kHello, hello, sizeof hello);
        minor_ = get_u32(r.rest.data() + 4);
    }
    ~Served() {
        if (to_ >= 0) ::close(to_);
        if (server_.joinable()) server_.join();
        if (from_ >= 0) ::close(from_);
        EXPECT_EQ(rc_, 0);
        if (handle_) dlclose(handle_);
    }

    Reply request(uint16_t op, const unsigned char* payload, std::size_t n) {
        Header h;
        h.opcode = op;
        h.seq = ++seq_;
        h.length = static_cast<uint32_t>(n);
        unsigned char head_out[kHeaderBytes];
        encode_header(h, head_out);
        EXPECT_TRUE(write_all(to_, head_out, sizeof head_out));
        EXPECT_TRUE(write_all(to_, payload, n));
        unsigned char head[kHeaderBytes + kReplyPrefixBytes];
        Reply r;
        if (!read_all(from_, head, sizeof head)) {
            ADD_FAILURE() << "no reply to opcode " << op;
            return r;
        }
        const Header rh = decode_header(head);
        r.status = get_u32(head + kHeaderBytes);
        r.flags = get_u32(head + kHeaderBytes + 4);
        r.rest.resize(rh.length - kReplyPrefixBytes);
        EXPECT_TRUE(read_all(from_, r.rest.data(), r.rest.size()));
        return r;
    }

    // An fp8 config with one k and one v scale per layer (scale 0.5) after the fixed part.
    Reply create_fp8(uint32_t n_layers) {
        kvc_config c = kvc::make_config(n_layers, 2, 1, 16, KVC_DTYPE_FP8_E4M3, 1, 8);
        c.kv_scale_mode = KVC_SCALE_TENSOR;
        ConfigArrays a;
        a.n_scales = n_layers;
        std::vector<unsigned char> b(config_bytes(minor_) + a.bytes());
        unsigned char fixed[kConfigBytes] = {};
        encode_config(c, a, minor_, fixed);
        std::copy(fixed, fixed + config_bytes(minor_), b.begin());
        for (uint32_t i = 0; i < 2 * n_layers; ++i) put_f32(b.data() + config_bytes(minor_) + 4 * i, 0.5f);
        return request(kCreate, b.data(), b.size());
    }

    uint64_t create(const kvc_config& c) {
        unsigned char b[kConfigBytes] = {};
        encode_config(c, ConfigArrays{}, minor_, b);
        const Reply r = request(kCreate, b, config_bytes(minor_));
        EXPECT_EQ(r.status, 0u);
        return r.rest.size() >= 8 ? get_u64(r.rest.data()) : 0;
    }

    // One token of `c`'s shape, every element 0.5.
    Reply append_one(uint64_t cache, const kvc_config& c) {
        const std::size_t q = std::size_t{c.n_q_heads} * c.head_dim, kv = std::size_t{c.n_kv_heads} * c.head_dim;
        std::vector<unsigned char> b(kAppendRequestBytes + (q + 2 * kv) * 4);
        put_u64(b.data(), cache);
        put_u32(b.data() + 8, 0);  // seq
        put_u32(b.data() + 12, 0); // layer
        put_u32(b.data() + 16, 1); // n_new
        for (std::size_t i = 0; i < q + 2 * kv; ++i) put_f32(b.data() + kAppendRequestBytes + 4 * i, 0.5f);
        return request(kAppendAttend, b.data(), b.size());
    }

    uint32_t minor() const { return minor_; }

private:
    void* handle_ = nullptr;
    const kvc_plugin_api* api_ = nullptr;
    kvc_caps caps_{};
    ServeOptions options_;
    int to_ = -1, from_ = -1, rc_ = -1;
    std::thread server_;
    uint32_t seq_ = 0, minor_ = 0;
};

const std::string kLib = KVC_LIB_DIR;
const kvc_config kConfig = kvc::make_config(1, 2, 1, 16, KVC_DTYPE_F32, 1, 8);
constexpr std::size_t kOutBytes = 2 * 16 * 4; // one token, 2 query heads of 16

TEST(ServerLent, A14PeerGetsTheBlockAndTheBody) {
    Served s(kLib + "/libkvcheck_double_overrun_out_past.so", 4);
    ASSERT_EQ(s.minor(), 4u);
    const Reply r = s.append_one(s.create(kConfig), kConfig);
    EXPECT_EQ(r.status, 0u);
    ASSERT_EQ(r.flags, kReplyLentViolations);
    ASSERT_GE(r.rest.size(), 4 + kLentViolationHeadBytes);
    EXPECT_EQ(get_u32(r.rest.data()), 1u); // one violation
    const unsigned char* v = r.rest.data() + 4;
    EXPECT_EQ(get_u64(v), 4u); // four bytes past
    const uint32_t name_len = get_u32(v + 8), what_len = get_u32(v + 12);
    const std::string name(reinterpret_cast<const char*>(v + 16), name_len);
    const std::string what(reinterpret_cast<const char*>(v + 16 + name_len), what_len);
    EXPECT_EQ(name, "out");
    EXPECT_NE(what.find("wrote 4 bytes past `out` in append_attend"), std::string::npos) << what;
    EXPECT_EQ(r.rest.size(), 4 + kLentViolationHeadBytes + name_len + what_len + kOutBytes); // the body still follows
}

// Two buffers misused in one call (before `out`, into the const `q`): both violations in one block, in the order the
// case process's own guards check them (q before out), and the body after them.
TEST(ServerLent, TwoViolationsOfOneCallTravelInOneBlock) {
    Served s(kLib + "/libkvcheck_double_reach_out_and_q.so", 4);
    const Reply r = s.append_one(s.create(kConfig), kConfig);
    EXPECT_EQ(r.status, 0u);
    ASSERT_EQ(r.flags, kReplyLentViolations);
    ASSERT_GE(r.rest.size(), 4u);
    ASSERT_EQ(get_u32(r.rest.data()), 2u);
    std::size_t at = 4;
    std::vector<std::string> names, words;
    for (int i = 0; i < 2; ++i) {
        ASSERT_GE(r.rest.size(), at + kLentViolationHeadBytes);
        const unsigned char* v = r.rest.data() + at;
        const uint32_t name_len = get_u32(v + 8), what_len = get_u32(v + 12);
        ASSERT_GE(r.rest.size(), at + kLentViolationHeadBytes + name_len + what_len);
        names.emplace_back(reinterpret_cast<const char*>(v + 16), name_len);
        words.emplace_back(reinterpret_cast<const char*>(v + 16 + name_len), what_len);
        at += kLentViolationHeadBytes + name_len + what_len;
    }
    EXPECT_EQ(names, (std::vector<std::string>{"q", "out"}));
    EXPECT_NE(words[0].find("wrote into `q`, a const input, in append_attend"), std::string::npos) << words[0];
    EXPECT_NE(words[1].find("wrote 4 bytes before `out` in append_attend"), std::string::npos) << words[1];
    EXPECT_EQ(r.rest.size(), at + kOutBytes); // the body still follows
}

TEST(ServerLent, APeerBelow14GetsTheCallsFailureInstead) {
    Served s(kLib + "/libkvcheck_double_overrun_out_past.so", 3);
    ASSERT_EQ(s.minor(), 3u);
    const Reply r = s.append_one(s.create(kConfig), kConfig);
    EXPECT_EQ(r.status, static_cast<uint32_t>(KVC_ERR_INTERNAL));
    EXPECT_EQ(r.flags, 0u);
    ASSERT_GE(r.rest.size(), 4u);
    const std::string message(reinterpret_cast<const char*>(r.rest.data() + 4), get_u32(r.rest.data()));
    EXPECT_NE(message.find("the plugin wrote 4 bytes past `out`"), std::string::npos) << message;
}

TEST(ServerLent, APluginInsideItsBuffersGetsNoFlag) {
    Served s(kLib + "/libkvcheck_example.so", 4);
    const Reply r = s.append_one(s.create(kConfig), kConfig);
    EXPECT_EQ(r.status, 0u);
    EXPECT_EQ(r.flags, 0u);
    EXPECT_EQ(r.rest.size(), kOutBytes);
}

// A plugin with the model table only, served (protocol 1.5): get_caps is UNSUPPORTED, model get_caps names the
// model table, and model create hands the plugin the weights as the harness lent them, here a file's path, which the
// engine then names in its refusal; a peer below 1.5 is refused the model opcodes.
TEST(ServerModel, TheModelTableIsServedFrom15) {
    {
        Served s(kLib + "/libkvcheck_model_example_plugin.so", kModelMinor, true);
        ASSERT_EQ(s.minor(), kModelMinor);
        EXPECT_EQ(s.request(kGetCaps, nullptr, 0).status, static_cast<uint32_t>(KVC_ERR_UNSUPPORTED));
        const Reply caps = s.request(kModelGetCaps, nullptr, 0);
        ASSERT_EQ(caps.status, 0u);
        ASSERT_EQ(caps.rest.size(), kModelGetCapsReplyBytes);
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(caps.rest.data() + 8)), "model-example-c");
        const kvcm_caps c = decode_model_caps(caps.rest.data() + 8 + 2 * kMaxNameBytes);
        EXPECT_NE(c.features & KVCM_FEATURE_READ_KV, 0u);
        kvcm_model_desc d{};
        d.dim = 8;
        d.hidden_dim = 16;
        d.n_layers = 1;
        d.n_heads = 2;
        d.n_kv_heads = 1;
        d.head_dim = 4;
        d.vocab_size = 5;
        d.max_context = 8;
        d.max_seqs = 1;
        d.tied = 1;
        const std::string path = "/nonexistent/kvcheck-served-weights.bin";
        std::vector<unsigned char> b(kModelCreateRequestBytes + path.size());
        encode_model_desc(d, b.data());
        put_u32(b.data() + kModelDescBytes, KVCM_WEIGHTS_FLAT_F32);
        put_u32(b.data() + kModelDescBytes + 4, kWeightsFile);
        put_u64(b.data() + kModelDescBytes + 8, path.size());
        std::copy(path.begin(), path.end(), b.begin() + kModelCreateRequestBytes);
        const Reply r = s.request(kModelCreate, b.data(), b.size());
        EXPECT_NE(r.status, 0u);
        const std::string rest(r.rest.begin(), r.rest.end());
        EXPECT_NE(rest.find("checkpoint " + path + ": cannot be opened"), std::string::npos) << rest;
    }
    {
        Served s(kLib + "/libkvcheck_model_example_plugin.so", kModelMinor - 1, true);
        ASSERT_EQ(s.minor(), kModelMinor - 1);
        EXPECT_EQ(s.request(kModelGetCaps, nullptr, 0).status, static_cast<uint32_t>(KVC_ERR_INVALID_ARGUMENT));
    }
}

} // namespace

// A create that writes into the scales its config points to: at 1.4 the cache is made and the block names `k_scales`;
// below 1.4 the create fails with the guards' words (and the server keeps no cache the peer has no handle for).
TEST(ServerLent, ACreateWritingIntoItsScalesIsReportedAtEitherMinor) {
    {
        Served s(kLib + "/libkvcheck_double_config_scales_writer.so", 4);
        const Reply r = s.create_fp8(2);
        EXPECT_EQ(r.status, 0u);
        ASSERT_EQ(r.flags, kReplyLentViolations);
        const std::string rest(r.rest.begin(), r.rest.end());
        EXPECT_NE(rest.find("wrote into `k_scales`, a const input, in create"), std::string::npos) << rest;
    }
    {
        Served s(kLib + "/libkvcheck_double_config_scales_writer.so", 3);
        const Reply r = s.create_fp8(2);
        EXPECT_EQ(r.status, static_cast<uint32_t>(KVC_ERR_INTERNAL));
        EXPECT_EQ(r.flags, 0u);
        const std::string rest(r.rest.begin(), r.rest.end());
        EXPECT_NE(rest.find("the plugin wrote into `k_scales`"), std::string::npos) << rest;
    }
}
