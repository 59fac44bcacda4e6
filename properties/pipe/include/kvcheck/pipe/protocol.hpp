// The pipe protocol (docs/protocol.md): how kvcheck talks to an implementation that runs as a separate process, over
// that process's stdin and stdout. One request frame per ABI operation, one reply frame per request, little-endian,
// arrays raw. This header holds what both sides must agree on: the frame header, the opcodes, the limits, and the
// exact payload sizes, so that every length a peer sends is checked against the one it must be.
#pragma once

#include "kvcheck/abi.hpp"
#include "kvcheck/model_abi.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvc::pipe {

// The protocol's major version is the ABI's. Its minor follows the ABI's up to 1.2, whose caps and config frames
// left out the windowed and latent fields; 1.3 carries every field of ABI 1.2; 1.4 lets a reply say that the call
// wrote outside a buffer it was lent (the reply prefix's flags); 1.5 adds the model-level table (model_abi.h) as
// opcodes of its own and carries ABI 1.3's pipeline rules in the caps reply. A connection speaks the lower of the two
// peers' minors (docs/protocol.md, Version handshake).
constexpr uint32_t kProtocolMajor = KVC_ABI_VERSION_MAJOR;
constexpr uint32_t kProtocolMinor = 5;
constexpr uint32_t kWholeAbiMinor = 3;  // the first protocol minor with ABI 1.2's windows, sinks, eviction, MLA shapes
constexpr uint32_t kLentReportMinor = 4; // the first with the reply flag kReplyLentViolations
constexpr uint32_t kModelMinor = 5;      // the first with the model-level opcodes
constexpr uint32_t kRulesMinor = 5;      // the first with ABI 1.3's pipeline rules in the caps reply
// The ABI minor a connection of this protocol minor gives the harness, and the protocol minor a plugin of an ABI minor
// is served at: this protocol's own from ABI 1.2 on (a 1.2 table's caps carry no rules, so the 1.5 caps reply holds
// none for it, and the model level, which needs 1.5, can be served beside it), its own older minor before that.
uint32_t abi_minor_of(uint32_t protocol_minor);
uint32_t protocol_minor_of(uint32_t abi_minor);

constexpr uint32_t kMagic = 0x5043564bu; // the bytes "KVCP" on the wire
constexpr uint16_t kReplyBit = 0x8000u;  // a reply's opcode is its request's opcode with this bit set
constexpr std::size_t kHeaderBytes = 16;

// Hard limits on every length a peer sends. A frame is refused when its length exceeds the bound before a byte of
// its payload is read.
constexpr uint32_t kMaxPayloadBytes = 1u << 30;    // one frame's payload
constexpr uint32_t kMaxMessageBytes = 4096;        // an error message
constexpr uint32_t kMaxNameBytes = 64;             // the name and the version string, each NUL-padded to this
constexpr uint32_t kMaxBatchSeqs = 1u << 16;       // sequences in one append_attend_batch

enum Opcode : uint16_t {
    kHello = 1,
    kGetCaps = 2,
    kCreate = 3,
    kDestroy = 4,
    kAppendAttend = 5,
    kAppendAttendBatch = 6,
    kReadKv = 7,
    kReadKvScales = 8,
    kSeqLength = 9,
    kMemory = 10,
    kFork = 11,
    kRelease = 12,
    // The model-level table (from 1.5): one opcode per kvcm_model_api member the harness calls.
    kModelGetCaps = 13,
    kModelCreate = 14,
    kModelDestroy = 15,
    kModelForward = 16,
    kModelReadKv = 17,
    kModelFork = 18,
    kModelRelease = 19,
    kModelMemory = 20,
    kModelKvProjections = 21,
};
bool is_model_opcode(uint16_t op);
const char* opcode_name(uint16_t op); // "append_attend", ...; "unknown" for anything else

// The 16 bytes before every payload.
struct Header {
    uint32_t magic = kMagic;
    uint16_t opcode = 0;
    uint16_t reserved = 0; // 0
    uint32_t seq = 0;      // the request's number; its reply repeats it
    uint32_t length = 0;   // payload bytes after the header
};
void encode_header(const Header& h, unsigned char out[kHeaderBytes]);
Header decode_header(const unsigned char in[kHeaderBytes]);

// Every reply payload starts with these 16 bytes: the kvc_status, the flags (0 below 1.4), and the peer's allocator
// reading (bytes it holds from its allocator now, measured after the call; kNoReading when it does not measure).
// With kReplyLentViolations the lent-buffer block follows the prefix. Then, on a status other than KVC_OK, u32
// message length + the message (at most kMaxMessageBytes); on KVC_OK the body.
constexpr std::size_t kReplyPrefixBytes = 16;
constexpr uint64_t kNoReading = ~uint64_t{0};
// The flag of a reply whose call wrote outside a buffer the server lent it (from 1.4). The block: u32 count
// (1..kMaxLentViolations), then per violation u64 bytes, u32 name length, u32 text length, the buffer's name (at most
// kMaxNameBytes), the words (at most kMaxMessageBytes), as kvcheck's own guards word them (docs/protocol.md).
constexpr uint32_t kReplyLentViolations = 1u;
constexpr uint32_t kMaxLentViolations = 8;
constexpr std::size_t kLentViolationHeadBytes = 16;

// Fixed request sizes (before any array) and fixed reply body sizes (after the prefix).
constexpr std::size_t kHelloRequestBytes = 8;       // u32 major, u32 minor
constexpr std::size_t kHelloReplyBytes = 8 + 2 * kMaxNameBytes; // u32 major, minor, name, version
// kvc_caps without struct_size, field by field: 26 words, then (from 1.5) n_pipeline_rules and 8 rules of 9 words
// (cache_dtypes, min_new, the pipeline's 6 stages and flags)
constexpr std::size_t kCapsReplyBytes = 26 * 4 + 4 + KVC_MAX_PIPELINE_RULES * 9 * 4;
constexpr std::size_t kConfigBytes = 20 * 4;        // kvc_config without struct_size and pointers, + counts
constexpr std::size_t kCapsReplyBytes14 = 26 * 4;   // the caps reply of 1.3 and 1.4
constexpr std::size_t kCapsReplyBytes12 = 21 * 4;   // the same below 1.3
constexpr std::size_t kConfigBytes12 = 14 * 4;
// The sizes at a connection's minor.
std::size_t caps_reply_bytes(uint32_t minor);
std::size_t config_bytes(uint32_t minor);
constexpr std::size_t kCacheRequestBytes = 8;       // u64 cache
constexpr std::size_t kAppendRequestBytes = 24;     // u64 cache, u32 seq, layer, n_new, 0
constexpr std::size_t kBatchRequestBytes = 16;      // u64 cache, u32 layer, n_seqs
constexpr std::size_t kReadRequestBytes = 24;       // u64 cache, u32 seq, layer, pos, n
constexpr std::size_t kSeqLengthRequestBytes = 16;  // u64 cache, u32 seq, layer
constexpr std::size_t kPairRequestBytes = 16;       // u64 cache, u32 a, b (fork: parent, child; release: seq, 0)
constexpr std::size_t kCreateReplyBytes = 8;        // u64 cache
constexpr std::size_t kSeqLengthReplyBytes = 8;     // u32 length, 0
constexpr std::size_t kMemoryReplyBytes = 40;       // u32 block_size, 0, u64 live, capacity, pool, workspace

// The model level's fixed sizes (from 1.5).
constexpr std::size_t kModelCapsBytes = 15 * 4;     // kvcm_caps without struct_size, field by field
constexpr std::size_t kModelGetCapsReplyBytes = 8 + 2 * kMaxNameBytes + kModelCapsBytes; // abi major, minor, names
constexpr std::size_t kModelDescBytes = 14 * 4;     // kvcm_model_desc without struct_size, field by field
constexpr std::size_t kModelCreateRequestBytes = kModelDescBytes + 16; // + u32 format, u32 where, u64 size
constexpr uint32_t kWeightsInMemory = 0;            // create's `where`: the bytes follow (kvcm_weights.data)
constexpr uint32_t kWeightsFile = 1;                // the file's path follows, without its NUL (kvcm_weights.path)
constexpr uint32_t kMaxPathBytes = 4096;            // a weights path
constexpr std::size_t kModelForwardRequestBytes = 16; // u64 model, u32 seq, n_tokens; then i32 tokens[n_tokens]
constexpr std::size_t kModelMemoryReplyBytes = 24;  // u64 bytes_per_token, live_bytes, reserved_bytes
constexpr std::size_t kModelCountReplyBytes = 8;    // kv_projections: u64

// What the server and the proxy both know of a cache once it is created: the shapes every array length follows from.
struct Shape {
    uint32_t n_layers = 0, n_q_heads = 0, n_kv_heads = 0, head_dim = 0, cache_dtype = 0, int8_scale_dtype = 0;
    uint32_t max_seqs = 0, max_tokens = 0;
    uint32_t head_dim_v = 0; // V rows and outputs: the config's head_dim_v, or head_dim where it is 0
};
Shape shape_of(const kvc_config& c);
// Byte counts for n tokens (or rows). 64-bit: the caller checks them against kMaxPayloadBytes.
struct Sizes {
    uint64_t q = 0, k = 0, v = 0, out = 0; // the f32 arrays of append_attend
    uint64_t read_k = 0, read_v = 0;       // read_kv's k_out and v_out, as stored
    uint64_t scales_k = 0, scales_v = 0;   // read_kv_scales's
};
Sizes sizes_of(const Shape& s, uint64_t n);
// How many f32 scales each of k_scales and v_scales carries for this config (0 for KVC_SCALE_NONE or a dtype that is
// not fp8); UINT32_MAX for a scale mode that does not exist.
uint32_t config_scale_count(const kvc_config& c);

// Little-endian field access (the wire's byte order whatever the host's).
void put_u32(unsigned char* p, uint32_t v);
void put_u64(unsigned char* p, uint64_t v);
uint32_t get_u32(const unsigned char* p);
uint64_t get_u64(const unsigned char* p);
void put_f32(unsigned char* p, float v);
float get_f32(const unsigned char* p);

// kvc_caps and kvc_config, field by field in abi.h's order (struct_size left out: the protocol's version fixes it),
// caps_reply_bytes(minor) / config_bytes(minor) of them. Below 1.3 the caps' window, sink, eviction, head_dim_v and
// RoPE-range bits are cleared on decoding (the config cannot carry them) and no fixed parameter travels.
void encode_caps(const kvc_caps& c, uint32_t minor, unsigned char out[kCapsReplyBytes]);
kvc_caps decode_caps(const unsigned char in[kCapsReplyBytes], uint32_t minor);
// The config's fixed part. What follows it on the wire: f32 k_scales[n_scales], v_scales[n_scales]
// (n_scales = config_scale_count(c)), then, from 1.3, u32 windows[n_windows] (0 or n_layers).
struct ConfigArrays {
    uint32_t n_scales = 0, n_windows = 0;
    uint64_t bytes() const { return uint64_t{n_scales} * 8 + uint64_t{n_windows} * 4; }
};
void encode_config(const kvc_config& c, const ConfigArrays& a, uint32_t minor, unsigned char out[kConfigBytes]);
kvc_config decode_config(const unsigned char in[kConfigBytes], uint32_t minor, ConfigArrays* a);

// kvcm_caps and kvcm_model_desc, field by field in model_abi.h's order (struct_size left out).
void encode_model_caps(const kvcm_caps& c, unsigned char out[kModelCapsBytes]);
kvcm_caps decode_model_caps(const unsigned char in[kModelCapsBytes]);
void encode_model_desc(const kvcm_model_desc& d, unsigned char out[kModelDescBytes]);
kvcm_model_desc decode_model_desc(const unsigned char in[kModelDescBytes]);
// The bytes of forward's logits (rows: n_tokens with KVCM_FEATURE_ALL_LOGITS, else 1) and of read_kv's k_out or
// v_out (f32, the only cache dtype of the model level's properties: [n][n_kv_heads][head_dim]). Saturating.
uint64_t model_logits_bytes(const kvcm_caps& caps, const kvcm_model_desc& d, uint64_t n_tokens);
uint64_t model_rows_bytes(const kvcm_model_desc& d, uint64_t n);

} // namespace kvc::pipe
