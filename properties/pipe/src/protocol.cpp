#include "kvcheck/pipe/protocol.hpp"

#include <cstring>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "arrays go on the wire as they lie in memory: the protocol is little-endian");

namespace kvc::pipe {

const char* opcode_name(uint16_t op) {
    switch (op & ~kReplyBit) {
    case kHello: return "hello";
    case kGetCaps: return "get_caps";
    case kCreate: return "create";
    case kDestroy: return "destroy";
    case kAppendAttend: return "append_attend";
    case kAppendAttendBatch: return "append_attend_batch";
    case kReadKv: return "read_kv";
    case kReadKvScales: return "read_kv_scales";
    case kSeqLength: return "seq_length";
    case kMemory: return "memory";
    case kFork: return "fork";
    case kRelease: return "release";
    case kModelGetCaps: return "model get_caps";
    case kModelCreate: return "model create";
    case kModelDestroy: return "model destroy";
    case kModelForward: return "model forward";
    case kModelReadKv: return "model read_kv";
    case kModelFork: return "model fork";
    case kModelRelease: return "model release";
    case kModelMemory: return "model memory";
    case kModelKvProjections: return "model kv_projections";
    }
    return "unknown";
}

bool is_model_opcode(uint16_t op) {
    const uint16_t o = op & ~kReplyBit;
    return o >= kModelGetCaps && o <= kModelKvProjections;
}

void put_u32(unsigned char* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
    return v;
}
uint64_t get_u64(const unsigned char* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
    return v;
}
void put_f32(unsigned char* p, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    put_u32(p, bits);
}
float get_f32(const unsigned char* p) {
    const uint32_t bits = get_u32(p);
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
}

void encode_header(const Header& h, unsigned char out[kHeaderBytes]) {
    put_u32(out, h.magic);
    out[4] = static_cast<unsigned char>(h.opcode);
    out[5] = static_cast<unsigned char>(h.opcode >> 8);
    out[6] = static_cast<unsigned char>(h.reserved);
    out[7] = static_cast<unsigned char>(h.reserved >> 8);
    put_u32(out + 8, h.seq);
    put_u32(out + 12, h.length);
}

Header decode_header(const unsigned char in[kHeaderBytes]) {
    Header h;
    h.magic = get_u32(in);
    h.opcode = static_cast<uint16_t>(in[4] | in[5] << 8);
    h.reserved = static_cast<uint16_t>(in[6] | in[7] << 8);
    h.seq = get_u32(in + 8);
    h.length = get_u32(in + 12);
    return h;
}

// Protocol 1.0-1.2 carry ABI 1.0-1.2's fields of those minors, 1.3 and 1.4 all of ABI 1.2, 1.5 ABI 1.3's rules.
uint32_t abi_minor_of(uint32_t protocol_minor) {
    return protocol_minor < 2 ? protocol_minor : protocol_minor < kRulesMinor ? 2u : KVC_ABI_VERSION_MINOR;
}
uint32_t protocol_minor_of(uint32_t abi_minor) { return abi_minor < 2 ? abi_minor : kProtocolMinor; }

std::size_t caps_reply_bytes(uint32_t minor) {
    return minor >= kRulesMinor ? kCapsReplyBytes : minor >= kWholeAbiMinor ? kCapsReplyBytes14 : kCapsReplyBytes12;
}
std::size_t config_bytes(uint32_t minor) { return minor >= kWholeAbiMinor ? kConfigBytes : kConfigBytes12; }

Shape shape_of(const kvc_config& c) {
    Shape s;
    s.n_layers = c.n_layers;
    s.n_q_heads = c.n_q_heads;
    s.n_kv_heads = c.n_kv_heads;
    s.head_dim = c.head_dim;
    s.cache_dtype = c.cache_dtype;
    s.int8_scale_dtype = c.int8_scale_dtype;
    s.max_seqs = c.max_seqs;
    s.max_tokens = c.max_tokens;
    s.head_dim_v = value_dim(c);
    return s;
}

// Products of u32 factors can pass 2^64 only with absurd shapes; saturate instead of wrapping so that a bound check
// refuses them.
static uint64_t mul(uint64_t a, uint64_t b) {
    if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
    return a * b;
}

Sizes sizes_of(const Shape& s, uint64_t n) {
    const uint64_t q_rows = mul(n, s.n_q_heads), kv_rows = mul(n, s.n_kv_heads);
    const uint64_t stored = dtype_size(s.cache_dtype), scale = scale_size(s.cache_dtype, s.int8_scale_dtype);
    Sizes z;
    z.q = mul(mul(q_rows, s.head_dim), 4);
    z.out = mul(mul(q_rows, s.head_dim_v), 4);
    z.k = mul(mul(kv_rows, s.head_dim), 4);
    z.v = mul(mul(kv_rows, s.head_dim_v), 4);
    z.read_k = mul(mul(kv_rows, s.head_dim), stored);
    z.read_v = mul(mul(kv_rows, s.head_dim_v), stored);
    z.scales_k = mul(mul(kv_rows, scales_per_head_row(s.cache_dtype, s.head_dim)), scale);
    z.scales_v = mul(mul(kv_rows, scales_per_head_row(s.cache_dtype, s.head_dim_v)), scale);
    return z;
}

uint32_t config_scale_count(const kvc_config& c) {
    if (!dtype_is_fp8(c.cache_dtype)) return 0;
    switch (c.kv_scale_mode) {
    case KVC_SCALE_NONE: return 0;
    case KVC_SCALE_TENSOR: return c.n_layers;
    case KVC_SCALE_KV_HEAD: {
        const uint64_t n = uint64_t{c.n_layers} * c.n_kv_heads;
        return n > UINT32_MAX - 1 ? UINT32_MAX : static_cast<uint32_t>(n);
    }
    }
    return UINT32_MAX;
}

namespace {

// The words after 1.2's 21: the ABI 1.2 limits of windowed and latent caches, then the fixed parameters.
constexpr uint32_t kLaterFeatures = KVC_FEATURE_WINDOW | KVC_FEATURE_SINKS | KVC_FEATURE_EVICT |
                                    KVC_FEATURE_HEAD_DIM_V | KVC_FEATURE_ROPE_RANGE;

} // namespace

void encode_caps(const kvc_caps& c, uint32_t minor, unsigned char out[kCapsReplyBytes]) {
    const uint32_t f[21] = {c.dtypes,          c.rope_variants,       c.features,         c.precision,
                            c.memory_space,    c.max_layers,          c.max_q_heads,      c.max_kv_heads,
                            c.max_head_dim,    c.max_seqs,            c.max_tokens,       c.head_dim_multiple,
                            c.head_dim_multiple_rope, c.pipeline.q,   c.pipeline.rope,    c.pipeline.scores,
                            c.pipeline.probs,  c.pipeline.accum,      c.pipeline.output,  c.pipeline.flags,
                            c.quant};
    for (int i = 0; i < 21; ++i) put_u32(out + 4 * i, f[i]);
    if (minor < kWholeAbiMinor) return;
    put_u32(out + 84, c.max_window);
    put_u32(out + 88, c.max_sinks);
    put_u32(out + 92, c.max_head_dim_v);
    put_f32(out + 96, c.fixed_rope_theta);
    put_u32(out + 100, c.fixed_scale);
    if (minor < kRulesMinor) return;
    const uint32_t n = c.n_pipeline_rules < KVC_MAX_PIPELINE_RULES ? c.n_pipeline_rules : KVC_MAX_PIPELINE_RULES;
    put_u32(out + 104, c.n_pipeline_rules); // as declared: the harness refuses more than KVC_MAX_PIPELINE_RULES
    for (uint32_t i = 0; i < KVC_MAX_PIPELINE_RULES; ++i) {
        const kvc_pipeline_rule r = i < n ? c.pipeline_rules[i] : kvc_pipeline_rule{};
        const uint32_t w[9] = {r.cache_dtypes,      r.min_new,          r.pipeline.q,     r.pipeline.rope,
                               r.pipeline.scores,   r.pipeline.probs,   r.pipeline.accum, r.pipeline.output,
                               r.pipeline.flags};
        for (int k = 0; k < 9; ++k) put_u32(out + 108 + 36 * i + 4 * k, w[k]);
    }
}

kvc_caps decode_caps(const unsigned char in[kCapsReplyBytes], uint32_t minor) {
    kvc_caps c{};
    c.struct_size = sizeof c;
    uint32_t* f[21] = {&c.dtypes,          &c.rope_variants,     &c.features,        &c.precision,
                       &c.memory_space,    &c.max_layers,        &c.max_q_heads,     &c.max_kv_heads,
                       &c.max_head_dim,    &c.max_seqs,          &c.max_tokens,      &c.head_dim_multiple,
                       &c.head_dim_multiple_rope, &c.pipeline.q, &c.pipeline.rope,   &c.pipeline.scores,
                       &c.pipeline.probs,  &c.pipeline.accum,    &c.pipeline.output, &c.pipeline.flags,
                       &c.quant};
    for (int i = 0; i < 21; ++i) *f[i] = get_u32(in + 4 * i);
    if (minor < kWholeAbiMinor) {
        // A 1.2 create frame carries no windows, sinks, eviction or MLA shape: a client declaring them is judged
        // without them rather than given a config it would read wrongly.
        c.features &= ~kLaterFeatures;
        return c;
    }
    c.max_window = get_u32(in + 84);
    c.max_sinks = get_u32(in + 88);
    c.max_head_dim_v = get_u32(in + 92);
    c.fixed_rope_theta = get_f32(in + 96);
    c.fixed_scale = get_u32(in + 100);
    if (minor < kRulesMinor) return c;
    c.n_pipeline_rules = get_u32(in + 104);
    for (uint32_t i = 0; i < KVC_MAX_PIPELINE_RULES; ++i) {
        kvc_pipeline_rule& r = c.pipeline_rules[i];
        uint32_t* w[9] = {&r.cache_dtypes,      &r.min_new,          &r.pipeline.q,     &r.pipeline.rope,
                          &r.pipeline.scores,   &r.pipeline.probs,   &r.pipeline.accum, &r.pipeline.output,
                          &r.pipeline.flags};
        for (int k = 0; k < 9; ++k) *w[k] = get_u32(in + 108 + 36 * i + 4 * k);
    }
    return c;
}

void encode_config(const kvc_config& c, const ConfigArrays& a, uint32_t minor, unsigned char out[kConfigBytes]) {
    const uint32_t f[7] = {c.n_layers, c.n_q_heads, c.n_kv_heads, c.head_dim, c.cache_dtype, c.max_seqs, c.max_tokens};
    for (int i = 0; i < 7; ++i) put_u32(out + 4 * i, f[i]);
    put_f32(out + 28, c.scale);
    put_u32(out + 32, c.rope);
    put_f32(out + 36, c.rope_theta);
    put_u32(out + 40, c.block_size_hint);
    put_u32(out + 44, c.kv_scale_mode);
    put_u32(out + 48, c.int8_scale_dtype);
    put_u32(out + 52, a.n_scales);
    if (minor < kWholeAbiMinor) return;
    const uint32_t g[6] = {c.n_sinks, c.evict, c.head_dim_v, c.rope_dim_begin, c.rope_dims, a.n_windows};
    for (int i = 0; i < 6; ++i) put_u32(out + 56 + 4 * i, g[i]);
}

kvc_config decode_config(const unsigned char in[kConfigBytes], uint32_t minor, ConfigArrays* a) {
    kvc_config c{};
    c.struct_size = sizeof c;
    uint32_t* f[7] = {&c.n_layers, &c.n_q_heads, &c.n_kv_heads, &c.head_dim, &c.cache_dtype, &c.max_seqs,
                      &c.max_tokens};
    for (int i = 0; i < 7; ++i) *f[i] = get_u32(in + 4 * i);
    c.scale = get_f32(in + 28);
    c.rope = get_u32(in + 32);
    c.rope_theta = get_f32(in + 36);
    c.block_size_hint = get_u32(in + 40);
    c.kv_scale_mode = get_u32(in + 44);
    c.int8_scale_dtype = get_u32(in + 48);
    *a = ConfigArrays{};
    a->n_scales = get_u32(in + 52);
    if (minor < kWholeAbiMinor) return c;
    uint32_t* g[6] = {&c.n_sinks, &c.evict, &c.head_dim_v, &c.rope_dim_begin, &c.rope_dims, &a->n_windows};
    for (int i = 0; i < 6; ++i) *g[i] = get_u32(in + 56 + 4 * i);
    return c;
}

void encode_model_caps(const kvcm_caps& c, unsigned char out[kModelCapsBytes]) {
    const uint32_t f[13] = {c.features, c.weight_formats, c.cache_dtypes, c.rope_variants, c.max_context,
                            c.max_seqs, c.max_layers,     c.max_heads,    c.max_kv_heads,  c.max_head_dim,
                            c.max_dim,  c.max_hidden_dim, c.max_vocab};
    for (int i = 0; i < 13; ++i) put_u32(out + 4 * i, f[i]);
    put_f32(out + 52, c.fixed_rope_theta);
    put_f32(out + 56, c.fixed_rms_eps);
}

kvcm_caps decode_model_caps(const unsigned char in[kModelCapsBytes]) {
    kvcm_caps c{};
    c.struct_size = sizeof c;
    uint32_t* f[13] = {&c.features,  &c.weight_formats, &c.cache_dtypes, &c.rope_variants, &c.max_context,
                       &c.max_seqs,  &c.max_layers,     &c.max_heads,    &c.max_kv_heads,  &c.max_head_dim,
                       &c.max_dim,   &c.max_hidden_dim, &c.max_vocab};
    for (int i = 0; i < 13; ++i) *f[i] = get_u32(in + 4 * i);
    c.fixed_rope_theta = get_f32(in + 52);
    c.fixed_rms_eps = get_f32(in + 56);
    return c;
}

void encode_model_desc(const kvcm_model_desc& d, unsigned char out[kModelDescBytes]) {
    const uint32_t f[7] = {d.dim, d.hidden_dim, d.n_layers, d.n_heads, d.n_kv_heads, d.head_dim, d.vocab_size};
    for (int i = 0; i < 7; ++i) put_u32(out + 4 * i, f[i]);
    put_u32(out + 28, d.rope);
    put_f32(out + 32, d.rope_theta);
    put_f32(out + 36, d.rms_eps);
    put_u32(out + 40, d.tied);
    put_u32(out + 44, d.cache_dtype);
    put_u32(out + 48, d.max_context);
    put_u32(out + 52, d.max_seqs);
}

kvcm_model_desc decode_model_desc(const unsigned char in[kModelDescBytes]) {
    kvcm_model_desc d{};
    d.struct_size = sizeof d;
    uint32_t* f[7] = {&d.dim, &d.hidden_dim, &d.n_layers, &d.n_heads, &d.n_kv_heads, &d.head_dim, &d.vocab_size};
    for (int i = 0; i < 7; ++i) *f[i] = get_u32(in + 4 * i);
    d.rope = get_u32(in + 28);
    d.rope_theta = get_f32(in + 32);
    d.rms_eps = get_f32(in + 36);
    d.tied = get_u32(in + 40);
    d.cache_dtype = get_u32(in + 44);
    d.max_context = get_u32(in + 48);
    d.max_seqs = get_u32(in + 52);
    return d;
}

uint64_t model_logits_bytes(const kvcm_caps& caps, const kvcm_model_desc& d, uint64_t n_tokens) {
    const uint64_t rows = (caps.features & KVCM_FEATURE_ALL_LOGITS) ? n_tokens : 1;
    return mul(mul(rows, d.vocab_size), 4);
}

uint64_t model_rows_bytes(const kvcm_model_desc& d, uint64_t n) {
    return mul(mul(mul(n, d.n_kv_heads), d.head_dim), 4);
}

} // namespace kvc::pipe
