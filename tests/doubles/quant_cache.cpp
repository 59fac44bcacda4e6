// Quantized KV caches behind the plugin ABI (ABI 1.2, docs/quantized.md): a correct one that stores the reference
// quantizer's codes and scales and attends over the rows dequantized, a correct one with a different arithmetic
// order, and the bug classes of issue 39, each failing its property. One source, one library per behaviour
// (KVC_QUANT_DOUBLE, CMakeLists.txt lists them). Attention in f32; RoPE applied by the cache before quantizing.
#include "contiguous_cache.hpp"
#include "kvcheck/abi.hpp"
#include "kvcheck/reference/quantize.hpp"
#include "kvcheck/reference/rope.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#ifndef KVC_QUANT_DOUBLE
#error "define KVC_QUANT_DOUBLE to one of the behaviours below"
#endif

#define QUANT_CORRECT 0         // the reference quantizers, attention over the dequantized rows
#define QUANT_FUSED_SCALE 1     // correct: k_scale folded into the softmax scale, v_scale applied after the sum
#define QUANT_SCALE_TWICE 2     // fp8 code = fp8(x / scale / scale): CACHE-CONTENT
#define QUANT_K_SCALE_FOR_V 3   // V encoded with k_scale: CACHE-CONTENT
#define QUANT_NO_SATURATION 4   // fp8 overflow gives NaN (E4M3FN) or infinity (E5M2): CACHE-CONTENT
#define QUANT_FNUZ 5            // E4M3FNUZ's exponent bias (8) used for E4M3FN: CACHE-CONTENT
#define QUANT_HEAD_BY_QUERY 6   // per-KV-head scale taken at the index of the head's first query head: CACHE-CONTENT
#define QUANT_INT8_TRUNC 7      // int8 codes rounded toward zero: CACHE-CONTENT
#define QUANT_Q8_WRONG_BLOCK 8  // q8_0 block b quantized with block b+1's scale: CACHE-CONTENT
#define QUANT_NEW_ROWS_RAW 9    // a call's own new rows attended before quantization (undeclared): EQUIV
#define QUANT_Q8_X86 10         // correct: q8_0 codes rounded as ggml's x86 kernel, KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN
#define QUANT_Q8_X86_UNDECLARED 11 // the same codes, the flag not declared: CACHE-CONTENT
#define QUANT_Q8_QUERY 12       // correct: q quantized to q8_0 before attention, declared q = KVC_ROUND_Q8_0
#define QUANT_Q8_QUERY_UNDECLARED 13 // the same arithmetic, q declared f32: EQUIV

namespace {

namespace ref = kvc::ref;

struct Stream {
    std::vector<uint8_t> k, v, ks, vs; // codes [len][Hkv][d]; scale bytes [len][Hkv][scale bytes] (int8, q8_0)
    uint32_t len = 0;
};

struct Cache {
    kvc_config cfg{};
    std::vector<float> k_scales, v_scales; // the config's, copied in create
    std::vector<std::vector<Stream>> streams;
    std::string error;
    bool has(uint32_t seq, uint32_t layer) const { return seq < cfg.max_seqs && layer < cfg.n_layers; }
    kvc_status fail(kvc_status s, const std::string& m) {
        error = m;
        return s;
    }
    size_t sb() const { return kvc::scales_per_head_row(cfg.cache_dtype, cfg.head_dim) * kvc::scale_size(cfg.cache_dtype, cfg.int8_scale_dtype); }
    size_t stored_sb() const { return kvc::dtype_is_fp8(cfg.cache_dtype) ? 0 : sb(); } // fp8: the config's
    float fp8_scale(const std::vector<float>& s, uint32_t layer, uint32_t g) const {
        if (cfg.kv_scale_mode == KVC_SCALE_TENSOR) return s[layer];
        if (cfg.kv_scale_mode == KVC_SCALE_KV_HEAD) return s[static_cast<size_t>(layer) * cfg.n_kv_heads + g];
        return 1.0f;
    }
};

constexpr uint32_t kAllQuantized = (1u << KVC_DTYPE_FP8_E4M3) | (1u << KVC_DTYPE_FP8_E5M2) |
                                   (1u << KVC_DTYPE_INT8_TOKEN) | (1u << KVC_DTYPE_Q8_0);
constexpr uint32_t kFp8 = (1u << KVC_DTYPE_FP8_E4M3) | (1u << KVC_DTYPE_FP8_E5M2);

uint32_t declared_dtypes() {
    switch (KVC_QUANT_DOUBLE) {
    case QUANT_SCALE_TWICE:
    case QUANT_K_SCALE_FOR_V:
    case QUANT_NO_SATURATION:
    case QUANT_HEAD_BY_QUERY: return kFp8;
    case QUANT_FNUZ: return 1u << KVC_DTYPE_FP8_E4M3;
    case QUANT_INT8_TRUNC: return 1u << KVC_DTYPE_INT8_TOKEN;
    case QUANT_Q8_WRONG_BLOCK:
    case QUANT_Q8_X86:
    case QUANT_Q8_X86_UNDECLARED:
    case QUANT_Q8_QUERY:
    case QUANT_Q8_QUERY_UNDECLARED: return 1u << KVC_DTYPE_Q8_0;
    default: return kAllQuantized;
    }
}

void get_caps(kvc_caps* out) {
    kvc_caps c = kvc::dbl::host_caps(declared_dtypes(), KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE |
                                                            KVC_FEATURE_CHUNKED);
    c.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.quant = KVC_QUANT_FP8_SCALE_TENSOR | KVC_QUANT_FP8_SCALE_KV_HEAD | KVC_QUANT_INT8_SCALE_F16;
    if (KVC_QUANT_DOUBLE == QUANT_HEAD_BY_QUERY) c.quant = KVC_QUANT_FP8_SCALE_KV_HEAD;
    if (KVC_QUANT_DOUBLE == QUANT_SCALE_TWICE || KVC_QUANT_DOUBLE == QUANT_K_SCALE_FOR_V)
        c.quant = KVC_QUANT_FP8_SCALE_TENSOR | KVC_QUANT_FP8_SCALE_KV_HEAD;
    if (KVC_QUANT_DOUBLE == QUANT_Q8_X86) {
        c.pipeline.flags = KVC_PIPELINE_DECLARED | KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN; // all stages f32
    }
    if (KVC_QUANT_DOUBLE == QUANT_Q8_QUERY) {
        c.pipeline.q = KVC_ROUND_Q8_0;
        c.pipeline.flags = KVC_PIPELINE_DECLARED;
    }
    kvc::dbl::put_caps(out, c);
}

constexpr bool kX86Codes = KVC_QUANT_DOUBLE == QUANT_Q8_X86 || KVC_QUANT_DOUBLE == QUANT_Q8_X86_UNDECLARED;
constexpr bool kQ8Query = KVC_QUANT_DOUBLE == QUANT_Q8_QUERY || KVC_QUANT_DOUBLE == QUANT_Q8_QUERY_UNDECLARED;

kvc_status create(const kvc_config* cfg, kvc_cache** out) {
    if (!cfg || !out || cfg->n_kv_heads == 0 || cfg->head_dim == 0 || cfg->n_q_heads % cfg->n_kv_heads != 0 ||
        cfg->n_layers == 0 || cfg->max_seqs == 0 || cfg->cache_dtype > KVC_DTYPE_Q8_0 ||
        !(declared_dtypes() >> cfg->cache_dtype & 1u) || cfg->rope > KVC_ROPE_GPTJ ||
        (cfg->rope != KVC_ROPE_NONE && cfg->head_dim % 2) ||
        (cfg->cache_dtype == KVC_DTYPE_Q8_0 && cfg->head_dim % 32)) {
        kvc::dbl::create_error = "unsupported or invalid config";
        return KVC_ERR_UNSUPPORTED;
    }
    auto* c = new Cache;
    c->cfg = *cfg;
    const size_t n = cfg->kv_scale_mode == KVC_SCALE_TENSOR    ? cfg->n_layers
                     : cfg->kv_scale_mode == KVC_SCALE_KV_HEAD ? size_t{cfg->n_layers} * cfg->n_kv_heads
                                                               : 0;
    if (kvc::dtype_is_fp8(cfg->cache_dtype) && n) {
        c->k_scales.assign(cfg->k_scales, cfg->k_scales + n);
        c->v_scales.assign(cfg->v_scales, cfg->v_scales + n);
    }
    c->cfg.k_scales = c->cfg.v_scales = nullptr; // the harness's buffers are not ours to keep
    c->streams.assign(cfg->max_seqs, std::vector<Stream>(cfg->n_layers));
    *out = reinterpret_cast<kvc_cache*>(c);
    return KVC_OK;
}

ref::Fp8 format(uint32_t dtype) { return dtype == KVC_DTYPE_FP8_E5M2 ? ref::Fp8::E5M2 : ref::Fp8::E4M3FN; }

// fp8 without saturation: what a plain conversion (ml_dtypes' astype) writes for an overflow.
uint8_t encode_unsaturated(float x, ref::Fp8 f) {
    if (std::fabs(x) <= ref::fp8_max_finite(f)) return ref::encode_fp8(x, f);
    const uint8_t sign = x < 0 ? 0x80 : 0;
    const uint8_t code = ref::encode_fp8(x, f); // saturated: the rounding decides overflow
    if (std::fabs(ref::decode_fp8(code, f)) == ref::fp8_max_finite(f) &&
        std::fabs(x) >= ref::fp8_max_finite(f) * (f == ref::Fp8::E4M3FN ? 1.0625f : 1.125f))
        return sign | (f == ref::Fp8::E4M3FN ? 0x7f : 0x7c); // NaN, infinity
    return code;
}

// One head row x [d] of `which` (1 K, 2 V) in (layer, g) -> codes, scale bytes.
void quantize(const Cache& c, uint32_t which, uint32_t layer, uint32_t g, const float* x, uint8_t* codes,
              uint8_t* scales) {
    const uint32_t d = c.cfg.head_dim, dt = c.cfg.cache_dtype;
    if (kvc::dtype_is_fp8(dt)) {
        const ref::Fp8 f = format(dt);
        uint32_t idx = g;
        if (KVC_QUANT_DOUBLE == QUANT_HEAD_BY_QUERY) // the bug: KV head g's first query head's index
            idx = g * (c.cfg.n_q_heads / c.cfg.n_kv_heads) % c.cfg.n_kv_heads;
        float s = c.fp8_scale(which == 1 ? c.k_scales : c.v_scales, layer, idx);
        if (KVC_QUANT_DOUBLE == QUANT_K_SCALE_FOR_V) s = c.fp8_scale(c.k_scales, layer, g); // the bug, for V too
        for (uint32_t i = 0; i < d; ++i) {
            const float y = x[i] / s;
            codes[i] = KVC_QUANT_DOUBLE == QUANT_SCALE_TWICE   ? ref::encode_fp8(y / s, f)
                       : KVC_QUANT_DOUBLE == QUANT_NO_SATURATION ? encode_unsaturated(y, f)
                       : KVC_QUANT_DOUBLE == QUANT_FNUZ          ? ref::encode_fp8(2.0f * y, f) // bias 8: 2x the FN bits
                                                                 : ref::encode_fp8(y, f);
        }
        return;
    }
    if (dt == KVC_DTYPE_INT8_TOKEN) {
        const bool f16 = c.cfg.int8_scale_dtype == KVC_DTYPE_F16;
        const float s = ref::quantize_int8_row(x, static_cast<int>(d), f16 ? ref::ScaleDtype::F16 : ref::ScaleDtype::F32,
                                               reinterpret_cast<int8_t*>(codes));
        if (KVC_QUANT_DOUBLE == QUANT_INT8_TRUNC && s != 0) // the bug: truncation
            for (uint32_t i = 0; i < d; ++i)
                codes[i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::trunc(x[i] / s), -127.0f, 127.0f)));
        if (f16) {
            const uint16_t b = ref::f16_bits(s);
            std::memcpy(scales, &b, 2);
        } else {
            std::memcpy(scales, &s, 4);
        }
        return;
    }
    const uint32_t nb = d / ref::QK8_0;
    std::vector<ref::BlockQ8_0> blocks(nb);
    ref::quantize_row_q8_0(x, static_cast<int>(d), blocks.data(),
                           kX86Codes ? ref::Q8_0Rounding::RecipAmaxEven : ref::Q8_0Rounding::GgmlRef);
    if (KVC_QUANT_DOUBLE == QUANT_Q8_WRONG_BLOCK && nb > 1) { // the bug: block b's scale from block b + 1
        std::vector<float> amax(nb, 0.f);
        for (uint32_t b = 0; b < nb; ++b)
            for (uint32_t i = 0; i < ref::QK8_0; ++i) amax[b] = std::max(amax[b], std::fabs(x[b * ref::QK8_0 + i]));
        for (uint32_t b = 0; b < nb; ++b) {
            const float dd = amax[(b + 1) % nb] / 127.0f, id = dd ? 1.0f / dd : 0.0f;
            blocks[b].d = ref::f16_bits(dd);
            for (uint32_t i = 0; i < ref::QK8_0; ++i)
                blocks[b].qs[i] = static_cast<int8_t>(std::clamp(std::round(x[b * ref::QK8_0 + i] * id), -127.0f, 127.0f));
        }
    }
    for (uint32_t b = 0; b < nb; ++b) {
        std::memcpy(codes + b * ref::QK8_0, blocks[b].qs, ref::QK8_0);
        std::memcpy(scales + 2 * b, &blocks[b].d, 2);
    }
}

// The scale bytes of a stored head row, as read_kv_scales returns them.
void scale_bytes(const Cache& c, const Stream& s, uint32_t which, uint32_t layer, size_t head_row, uint8_t* out) {
    if (kvc::dtype_is_fp8(c.cfg.cache_dtype)) {
        const float v = c.fp8_scale(which == 1 ? c.k_scales : c.v_scales, layer,
                                    static_cast<uint32_t>(head_row % c.cfg.n_kv_heads));
        std::memcpy(out, &v, 4);
        return;
    }
    std::memcpy(out, (which == 1 ? s.ks : s.vs).data() + head_row * c.sb(), c.sb());
}

// A stored head row dequantized; `unscaled` leaves an fp8 row's scale out (the fused-scale double applies it later).
void dequantize(const Cache& c, const Stream& s, uint32_t which, uint32_t layer, size_t head_row, bool unscaled,
                float* out) {
    const uint32_t d = c.cfg.head_dim, dt = c.cfg.cache_dtype;
    const uint8_t* codes = (which == 1 ? s.k : s.v).data() + head_row * d;
    std::vector<uint8_t> sc(c.sb());
    scale_bytes(c, s, which, layer, head_row, sc.data());
    if (kvc::dtype_is_fp8(dt)) {
        float scale;
        std::memcpy(&scale, sc.data(), 4);
        if (KVC_QUANT_DOUBLE == QUANT_K_SCALE_FOR_V && which == 2) // consistent with its own encoding
            scale = c.fp8_scale(c.k_scales, layer, static_cast<uint32_t>(head_row % c.cfg.n_kv_heads));
        ref::dequantize_fp8_row(codes, static_cast<int>(d), unscaled ? 1.0f : scale, format(dt), out);
        return;
    }
    if (dt == KVC_DTYPE_INT8_TOKEN) {
        float scale;
        if (c.cfg.int8_scale_dtype == KVC_DTYPE_F16) {
            uint16_t b;
            std::memcpy(&b, sc.data(), 2);
            scale = ref::f16_value(b);
        } else {
            std::memcpy(&scale, sc.data(), 4);
        }
        ref::dequantize_int8_row(reinterpret_cast<const int8_t*>(codes), static_cast<int>(d), scale, out);
        return;
    }
    std::vector<ref::BlockQ8_0> blocks(d / ref::QK8_0);
    for (size_t b = 0; b < blocks.size(); ++b) {
        std::memcpy(blocks[b].qs, codes + b * ref::QK8_0, ref::QK8_0);
        std::memcpy(&blocks[b].d, sc.data() + 2 * b, 2);
    }
    ref::dequantize_row_q8_0(blocks.data(), static_cast<int>(d), out);
}

void rotate(const Cache& c, float* x, uint32_t pos) {
    if (c.cfg.rope != KVC_ROPE_NONE)
        ref::apply_rope(x, static_cast<int>(c.cfg.head_dim), pos, static_cast<ref::Rope>(c.cfg.rope), c.cfg.rope_theta);
}

kvc_status append_attend(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                         const float* v, float* out) {
    Cache* c = kvc::dbl::self<Cache>(h);
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    Stream& s = c->streams[seq][layer];
    if (s.len + n_new > c->cfg.max_tokens) return c->fail(KVC_ERR_OUT_OF_MEMORY, "max_tokens");
    const uint32_t d = c->cfg.head_dim, Hq = c->cfg.n_q_heads, Hkv = c->cfg.n_kv_heads, before = s.len;
    const size_t R = static_cast<size_t>(Hkv) * d, ssb = c->stored_sb();
    // the new rows, keys rotated, then quantized
    std::vector<float> kr(k, k + n_new * R);
    for (uint32_t i = 0; i < n_new; ++i)
        for (uint32_t g = 0; g < Hkv; ++g) rotate(*c, kr.data() + i * R + g * d, before + i);
    s.k.resize((before + n_new) * R);
    s.v.resize((before + n_new) * R);
    s.ks.resize((before + n_new) * Hkv * ssb);
    s.vs.resize((before + n_new) * Hkv * ssb);
    std::vector<uint8_t> scratch(c->sb());
    for (uint32_t i = 0; i < n_new; ++i)
        for (uint32_t g = 0; g < Hkv; ++g) {
            const size_t hr = static_cast<size_t>(before + i) * Hkv + g;
            quantize(*c, 1, layer, g, kr.data() + i * R + g * d, s.k.data() + hr * d, ssb ? s.ks.data() + hr * ssb : scratch.data());
            quantize(*c, 2, layer, g, v + i * R + g * d, s.v.data() + hr * d, ssb ? s.vs.data() + hr * ssb : scratch.data());
        }
    s.len += n_new;
    const bool fused = KVC_QUANT_DOUBLE == QUANT_FUSED_SCALE && kvc::dtype_is_fp8(c->cfg.cache_dtype);
    std::vector<float> K(static_cast<size_t>(s.len) * d), V(K.size()), qh(d), w;
    for (uint32_t g = 0; g < Hkv; ++g) {
        for (uint32_t j = 0; j < s.len; ++j) { // KV head g's history, dequantized for this call only
            const size_t hr = static_cast<size_t>(j) * Hkv + g;
            dequantize(*c, s, 1, layer, hr, fused, K.data() + j * d);
            dequantize(*c, s, 2, layer, hr, fused, V.data() + j * d);
            if (KVC_QUANT_DOUBLE == QUANT_NEW_ROWS_RAW && j >= before) { // the bug: the new rows as given
                std::memcpy(K.data() + j * d, kr.data() + (j - before) * R + g * d, d * sizeof(float));
                std::memcpy(V.data() + j * d, v + (j - before) * R + g * d, d * sizeof(float));
            }
        }
        const float ks = fused ? c->fp8_scale(c->k_scales, layer, g) : 1.0f;
        const float vs = fused ? c->fp8_scale(c->v_scales, layer, g) : 1.0f;
        const float score_scale = c->cfg.scale * ks; // FlashInfer: sm_scale * k_scale in one factor
        for (uint32_t hq = g * (Hq / Hkv); hq < (g + 1) * (Hq / Hkv); ++hq)
            for (uint32_t i = 0; i < n_new; ++i) {
                std::memcpy(qh.data(), q + (static_cast<size_t>(i) * Hq + hq) * d, d * sizeof(float));
                if (kQ8Query) { // ggml's CPU flash attention: q to the K type's vec_dot_type, before RoPE
                    std::vector<ref::BlockQ8_0> qb(d / ref::QK8_0);
                    ref::quantize_row_q8_0(qh.data(), static_cast<int>(d), qb.data());
                    ref::dequantize_row_q8_0(qb.data(), static_cast<int>(d), qh.data());
                }
                rotate(*c, qh.data(), before + i);
                const uint32_t n = before + i + 1;
                w.assign(n, 0.f);
                float m = -INFINITY, sum = 0.f;
                for (uint32_t j = 0; j < n; ++j) {
                    float dot = 0.f;
                    for (uint32_t x = 0; x < d; ++x) dot += qh[x] * K[j * d + x];
                    m = std::max(m, w[j] = dot * score_scale);
                }
                for (uint32_t j = 0; j < n; ++j) sum += (w[j] = std::exp(w[j] - m));
                float* o = out + (static_cast<size_t>(i) * Hq + hq) * d;
                for (uint32_t x = 0; x < d; ++x) {
                    float acc = 0.f;
                    for (uint32_t j = 0; j < n; ++j) acc += w[j] * V[j * d + x];
                    o[x] = acc / sum * vs;
                }
            }
    }
    return KVC_OK;
}

kvc_status read_kv(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    Cache* c = kvc::dbl::self<Cache>(h);
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    const Stream& s = c->streams[seq][layer];
    if (static_cast<uint64_t>(pos) + n > s.len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "read past the end");
    const size_t R = static_cast<size_t>(c->cfg.n_kv_heads) * c->cfg.head_dim;
    std::memcpy(k_out, s.k.data() + pos * R, n * R);
    std::memcpy(v_out, s.v.data() + pos * R, n * R);
    return KVC_OK;
}

kvc_status read_kv_scales(kvc_cache* h, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                          void* v_out) {
    Cache* c = kvc::dbl::self<Cache>(h);
    if (!c->has(seq, layer)) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq/layer");
    const Stream& s = c->streams[seq][layer];
    if (static_cast<uint64_t>(pos) + n > s.len) return c->fail(KVC_ERR_INVALID_ARGUMENT, "read past the end");
    const size_t sb = c->sb(), Hkv = c->cfg.n_kv_heads;
    for (size_t r = 0; r < n * Hkv; ++r) {
        scale_bytes(*c, s, 1, layer, pos * Hkv + r, static_cast<uint8_t*>(k_out) + r * sb);
        scale_bytes(*c, s, 2, layer, pos * Hkv + r, static_cast<uint8_t*>(v_out) + r * sb);
    }
    return KVC_OK;
}

kvc_status memory(kvc_cache* h, kvc_memory* out) {
    const Cache* c = kvc::dbl::self<Cache>(h);
    uint64_t live = 0, held = 0;
    const uint64_t row = kvc::head_row_bytes(c->cfg.cache_dtype, c->cfg.head_dim, c->cfg.int8_scale_dtype);
    for (const auto& layers : c->streams)
        for (const Stream& s : layers) {
            live += 2ull * s.len * c->cfg.n_kv_heads * row;
            held += s.k.capacity() + s.v.capacity() + s.ks.capacity() + s.vs.capacity();
        }
    kvc_memory m{};
    m.struct_size = sizeof m;
    m.block_size = 1;
    m.live_bytes = live;
    m.capacity_bytes = live;
    m.pool_bytes = held - std::min(held, live);
    m.workspace_bytes = (c->k_scales.capacity() + c->v_scales.capacity()) * sizeof(float);
    kvc::dbl::put_memory(out, m);
    return KVC_OK;
}

kvc_status fork(kvc_cache* h, uint32_t parent, uint32_t child) {
    Cache* c = kvc::dbl::self<Cache>(h);
    if (const kvc_status st = kvc::dbl::check_fork(c, parent, child); st != KVC_OK) return st;
    for (uint32_t l = 0; l < c->cfg.n_layers; ++l) c->streams[child][l] = c->streams[parent][l];
    return KVC_OK;
}

kvc_status release(kvc_cache* h, uint32_t seq) {
    Cache* c = kvc::dbl::self<Cache>(h);
    if (seq >= c->cfg.max_seqs) return c->fail(KVC_ERR_INVALID_ARGUMENT, "bad seq");
    for (Stream& s : c->streams[seq]) s = Stream{};
    return KVC_OK;
}

const kvc_plugin_api kApi = {
    sizeof(kvc_plugin_api), KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR, "quant-double", "0", get_caps, create,
    kvc::dbl::destroy<Cache>, kvc::dbl::last_error<Cache>, append_attend, nullptr, read_kv,
    kvc::dbl::seq_length<Cache>, memory, fork, release, read_kv_scales,
};

} // namespace

extern "C" __attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t, uint32_t) {
    return &kApi;
}
