// ggml_selftest: checks the ggml plugin on its own, without the harness, so that its verdicts can be trusted
// before kvcheck's are read.
//
//   kvcheck_ggml_selftest path/to/libkvcheck_ggml.so
//
// For a q8_0 cache, every stored block (read_kv codes, read_kv_scales scales) is compared with two quantizers:
//  - an emulation of the quantize_row_q8_0 ggml's CPU backend runs on x86 with AVX/AVX2 (ggml-cpu/arch/x86/quants.c):
//    d = amax / 127, id = 127 / amax, code = the nearest integer to x * id, ties to even. It must match bitwise:
//    that proves the plugin stores and reads back exactly what ggml wrote;
//  - the reference, kvc::ref::quantize_row_q8_0 (ggml's quantize_row_q8_0_ref: id = 1 / d, ties away from zero).
//    Every difference is counted and explained (a tie, or the other reciprocal): these are what CACHE-CONTENT sees.
// Rows with exact ties (x * id = k + 1/2) and rows where only the reciprocal decides a code are appended on purpose
// next to normal random rows.
// Outputs are compared with a plain double-precision attention over the stored (dequantized) rows, with q
// quantized to q8_0 the way ggml does it: the pipeline the plugin declares. The f16 cache (KVCHECK_GGML_CACHE=f16)
// is checked the same way: stored f16 bits against round-to-nearest-even, outputs against attention with q in f16.
// Exit 0 when the plugin matches ggml's quantizer and the attention; 1 otherwise; 77 (skip) off x86-64.
#include "kvcheck/abi.h"
#include "kvcheck/reference/dtype.hpp"
#include "kvcheck/reference/quantize.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kQK = 32;

// ggml's x86 AVX/AVX2 quantize_row_q8_0, written out in scalar form. nearbyintf under the default rounding mode
// is _mm256_round_ps(_MM_ROUND_NEAREST): ties to even.
void quantize_q8_0_ggml_x86(const float* x, int k, kvc::ref::BlockQ8_0* y) {
    for (int b = 0; b < k / kQK; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[b * kQK + j]));
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[b].d = kvc::ref::f16_bits(d);
        for (int j = 0; j < kQK; ++j) y[b].qs[j] = static_cast<int8_t>(std::nearbyintf(x[b * kQK + j] * id));
    }
}

std::vector<float> dequantize(const std::vector<kvc::ref::BlockQ8_0>& blocks) {
    std::vector<float> out(blocks.size() * kQK);
    kvc::ref::dequantize_row_q8_0(blocks.data(), static_cast<int>(out.size()), out.data());
    return out;
}

struct Stream {
    std::vector<float> k, v; // the f32 rows appended, [len][n_kv_heads][head_dim]
};

struct Totals {
    long blocks = 0, codes = 0;
    long emu_code_diff = 0, emu_scale_diff = 0; // against ggml's own quantizer: must stay 0
    long ref_code_diff = 0, ref_scale_diff = 0, ref_tie = 0, ref_reciprocal = 0, ref_other = 0;
    double out_err = 0.0;                       // max |out - expected| / max(1, max |V'|)
    double q_effect = 0.0;                      // max |expected - expected with q unquantized|, same scaling
};

int failures = 0;
void check(bool ok, const std::string& what) {
    if (!ok) {
        std::fprintf(stderr, "FAIL: %s\n", what.c_str());
        ++failures;
    }
}

enum class Rows { Normal, Ties, Reciprocal };

// A value near (k + 1/2) * amax / 127 that the two reciprocals put on different sides of k + 1/2: x * (127 / amax)
// and x * (1 / (amax / 127)) round to different integers, neither product an exact tie. 0 when there is none.
float straddle(float amax, int k) {
    const float ia = 127.f / amax, ib = 1.0f / (amax / 127.f);
    if (ia == ib) return 0.0f;
    float x = (static_cast<float>(k) + 0.5f) * amax / 127.f;
    for (int i = 0; i < 16; ++i) x = std::nextafter(x, 0.0f);
    for (int i = 0; i < 32; ++i, x = std::nextafter(x, INFINITY)) {
        const float a = x * ia, b = x * ib;
        if (std::round(a) != std::round(b) && a - std::trunc(a) != 0.5f && b - std::trunc(b) != 0.5f) return x;
    }
    return 0.0f;
}

// One head row of f32 values: normal random values; or (Ties) half-integers in a block whose amax is 127, so that
// id is exactly 1 in both quantizers and x * id is an exact tie; or (Reciprocal) values that only the choice of
// reciprocal rounds differently, in blocks whose amax makes 127 / amax and 1 / (amax / 127) differ.
void fill_row(std::mt19937& rng, Rows kind, float* x, int d) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> half(-120, 119), level(1, 120);
    std::uniform_real_distribution<float> scale(0.5f, 8.0f);
    for (int b = 0; b < d / kQK; ++b) {
        float* block = x + b * kQK;
        float amax = 0.0f;
        if (kind == Rows::Reciprocal)
            do amax = scale(rng);
            while (127.f / amax == 1.0f / (amax / 127.f));
        for (int i = 0; i < kQK; ++i) {
            if (kind == Rows::Normal) block[i] = normal(rng);
            if (kind == Rows::Ties) block[i] = i == 0 ? 127.0f : static_cast<float>(half(rng)) + 0.5f;
            if (kind == Rows::Reciprocal) {
                const float y = i == 0 ? amax : straddle(amax, level(rng));
                block[i] = y != 0.0f ? y : std::min(std::fabs(normal(rng)) * amax / 4, amax);
                if (i > 0 && i % 2 == 1) block[i] = -block[i];
            }
        }
    }
}

// q as ggml's flash attention sees it: quantized with K's vec_dot_type (q8_0, or f16) and widened again.
std::vector<float> q_as_ggml(const float* q, int d, bool f16) {
    std::vector<float> out(q, q + d);
    if (f16) {
        for (float& x : out) x = kvc::ref::f16_value(kvc::ref::f16_bits(x));
        return out;
    }
    std::vector<kvc::ref::BlockQ8_0> blocks(d / kQK);
    quantize_q8_0_ggml_x86(q, d, blocks.data());
    return dequantize(blocks);
}

int run(const kvc_plugin_api* api, bool f16) {
    kvc_caps caps{};
    caps.struct_size = sizeof caps;
    api->get_caps(&caps);
    const uint32_t dtype = f16 ? KVC_DTYPE_F16 : KVC_DTYPE_Q8_0;
    check(caps.dtypes == (1u << dtype), "get_caps declares exactly the served dtype");

    kvc_config cfg{};
    cfg.struct_size = sizeof cfg;
    cfg.n_layers = 2;
    cfg.n_q_heads = 6;
    cfg.n_kv_heads = 2;
    cfg.head_dim = 64;
    cfg.cache_dtype = dtype;
    cfg.max_seqs = 3;
    cfg.max_tokens = 80;
    cfg.scale = 0.125f;
    kvc_cache* cache = nullptr;
    if (api->create(&cfg, &cache) != KVC_OK) {
        std::fprintf(stderr, "create failed: %s\n", api->last_error(nullptr));
        return 1;
    }
    const int d = static_cast<int>(cfg.head_dim), hkv = static_cast<int>(cfg.n_kv_heads);
    const int hq = static_cast<int>(cfg.n_q_heads), group = hq / hkv;
    std::mt19937 rng(20261206);
    std::vector<Stream> streams(cfg.max_seqs * cfg.n_layers);
    Totals t;
    const std::vector<uint32_t> chunks = {7, 1, 1, 13, 1, 32, 2};

    for (uint32_t seq = 0; seq < 2; ++seq)
        for (uint32_t c = 0; c < chunks.size(); ++c)
            for (uint32_t layer = 0; layer < cfg.n_layers; ++layer) {
                Stream& s = streams[seq * cfg.n_layers + layer];
                const uint32_t n = chunks[c], len = static_cast<uint32_t>(s.k.size() / (hkv * d));
                std::vector<float> q(n * hq * d), k(n * hkv * d), v(n * hkv * d), out(n * hq * d);
                // every other chunk: exact ties (sequence 1) or reciprocal boundaries (sequence 0)
                const Rows kind = c % 2 == 0 ? Rows::Normal : seq == 1 ? Rows::Ties : Rows::Reciprocal;
                for (uint32_t i = 0; i < n * hq; ++i) fill_row(rng, Rows::Normal, &q[i * d], d);
                for (uint32_t i = 0; i < n * hkv; ++i) fill_row(rng, kind, &k[i * d], d);
                for (uint32_t i = 0; i < n * hkv; ++i) fill_row(rng, kind, &v[i * d], d);
                if (api->append_attend(cache, seq, layer, n, q.data(), k.data(), v.data(), out.data()) != KVC_OK) {
                    std::fprintf(stderr, "append_attend failed: %s\n", api->last_error(cache));
                    return 1;
                }
                s.k.insert(s.k.end(), k.begin(), k.end());
                s.v.insert(s.v.end(), v.begin(), v.end());

                // The stored rows, as the cache holds them: ggml's quantizer (checked bitwise below) or f16.
                const uint32_t total = len + n;
                std::vector<float> ks(s.k.size()), vs(s.v.size());
                for (size_t r = 0; r < size_t{total} * hkv; ++r) {
                    std::vector<kvc::ref::BlockQ8_0> kb(d / kQK), vb(d / kQK);
                    if (f16) {
                        for (int i = 0; i < d; ++i) {
                            ks[r * d + i] = kvc::ref::f16_value(kvc::ref::f16_bits(s.k[r * d + i]));
                            vs[r * d + i] = kvc::ref::f16_value(kvc::ref::f16_bits(s.v[r * d + i]));
                        }
                        continue;
                    }
                    quantize_q8_0_ggml_x86(&s.k[r * d], d, kb.data());
                    quantize_q8_0_ggml_x86(&s.v[r * d], d, vb.data());
                    const std::vector<float> kd = dequantize(kb), vd = dequantize(vb);
                    std::copy(kd.begin(), kd.end(), ks.begin() + static_cast<long>(r * d));
                    std::copy(vd.begin(), vd.end(), vs.begin() + static_cast<long>(r * d));
                }
                double vmax = 1.0;
                for (float x : vs) vmax = std::max(vmax, static_cast<double>(std::fabs(x)));
                for (uint32_t i = 0; i < n; ++i)
                    for (int h = 0; h < hq; ++h) {
                        const float* qrow = &q[(i * hq + h) * d];
                        const std::vector<float> qg = q_as_ggml(qrow, d, f16);
                        const int g = h / group;
                        const uint32_t visible = len + i + 1;
                        for (int variant = 0; variant < 2; ++variant) { // 0: q as ggml rounds it, 1: q as given
                            std::vector<double> sc(visible), acc(d, 0.0);
                            double mx = -INFINITY, sum = 0.0;
                            for (uint32_t j = 0; j < visible; ++j) {
                                double dot = 0.0;
                                for (int e = 0; e < d; ++e)
                                    dot += static_cast<double>(variant == 0 ? qg[e] : qrow[e]) *
                                           ks[(size_t{j} * hkv + g) * d + e];
                                sc[j] = dot * cfg.scale;
                                mx = std::max(mx, sc[j]);
                            }
                            for (uint32_t j = 0; j < visible; ++j) {
                                const double w = std::exp(sc[j] - mx);
                                sum += w;
                                for (int e = 0; e < d; ++e) acc[e] += w * vs[(size_t{j} * hkv + g) * d + e];
                            }
                            for (int e = 0; e < d; ++e) {
                                const double want = acc[e] / sum;
                                const double got = out[(i * hq + h) * d + e];
                                if (variant == 0)
                                    t.out_err = std::max(t.out_err, std::fabs(got - want) / vmax);
                                else
                                    t.q_effect = std::max(t.q_effect, std::fabs(got - want) / vmax);
                            }
                        }
                    }
            }

    // Stored rows against both quantizers, block by block.
    for (uint32_t seq = 0; seq < 2; ++seq)
        for (uint32_t layer = 0; layer < cfg.n_layers; ++layer) {
            const Stream& s = streams[seq * cfg.n_layers + layer];
            const uint32_t len = static_cast<uint32_t>(s.k.size() / (hkv * d));
            uint32_t got_len = 0;
            check(api->seq_length(cache, seq, layer, &got_len) == KVC_OK && got_len == len, "seq_length");
            const size_t elem = f16 ? 2 : 1;
            std::vector<unsigned char> kc(size_t{len} * hkv * d * elem), vc(kc.size());
            std::vector<uint16_t> ksc(size_t{len} * hkv * d / kQK), vsc(ksc.size());
            check(api->read_kv(cache, seq, layer, 0, len, kc.data(), vc.data()) == KVC_OK, "read_kv");
            if (f16) {
                check(api->read_kv_scales(cache, seq, layer, 0, len, ksc.data(), vsc.data()) == KVC_ERR_UNSUPPORTED,
                      "read_kv_scales refuses an f16 cache");
                for (size_t i = 0; i < s.k.size(); ++i) {
                    uint16_t kb, vb;
                    std::memcpy(&kb, &kc[i * 2], 2);
                    std::memcpy(&vb, &vc[i * 2], 2);
                    t.emu_code_diff += kb != kvc::ref::f16_bits(s.k[i]);
                    t.emu_code_diff += vb != kvc::ref::f16_bits(s.v[i]);
                    t.codes += 2;
                }
                continue;
            }
            check(api->read_kv_scales(cache, seq, layer, 0, len, ksc.data(), vsc.data()) == KVC_OK,
                  "read_kv_scales");
            for (int which = 0; which < 2; ++which) {
                const std::vector<float>& x = which == 0 ? s.k : s.v;
                const std::vector<unsigned char>& codes = which == 0 ? kc : vc;
                const std::vector<uint16_t>& scales = which == 0 ? ksc : vsc;
                for (size_t r = 0; r < size_t{len} * hkv; ++r) {
                    std::vector<kvc::ref::BlockQ8_0> ref(d / kQK), emu(d / kQK);
                    kvc::ref::quantize_row_q8_0(&x[r * d], d, ref.data());
                    quantize_q8_0_ggml_x86(&x[r * d], d, emu.data());
                    for (int b = 0; b < d / kQK; ++b) {
                        const uint16_t got_d = scales[r * (d / kQK) + b];
                        ++t.blocks;
                        t.emu_scale_diff += got_d != emu[b].d;
                        t.ref_scale_diff += got_d != ref[b].d;
                        float amax = 0.0f;
                        for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[r * d + b * kQK + j]));
                        const float id_ref = amax / 127.f != 0.0f ? 1.0f / (amax / 127.f) : 0.0f;
                        for (int j = 0; j < kQK; ++j) {
                            const int8_t got = static_cast<int8_t>(codes[r * d + b * kQK + j]);
                            ++t.codes;
                            t.emu_code_diff += got != emu[b].qs[j];
                            if (got == ref[b].qs[j]) continue;
                            ++t.ref_code_diff;
                            const float p = x[r * d + b * kQK + j] * id_ref;
                            if (p - std::trunc(p) == 0.5f || p - std::trunc(p) == -0.5f)
                                ++t.ref_tie;
                            else if (id_ref != 127.f / amax)
                                ++t.ref_reciprocal;
                            else
                                ++t.ref_other;
                        }
                    }
                }
            }
        }

    // Memory: the ABI's formula, and fork/release moving it.
    kvc_memory m{};
    m.struct_size = sizeof m;
    check(api->memory(cache, &m) == KVC_OK, "memory");
    uint64_t rows = 0;
    for (const Stream& s : streams) rows += s.k.size() / d;
    const uint64_t row_bytes = f16 ? 2u * d : static_cast<uint64_t>(d) + 2u * d / kQK;
    check(m.live_bytes == 2 * rows * row_bytes, "live_bytes = 2 * rows * (head_dim + 2 * head_dim / 32)");
    check(api->fork(cache, 0, 2) == KVC_OK, "fork");
    std::vector<unsigned char> a(static_cast<size_t>(hkv * d * (f16 ? 2 : 1))), b(a.size()), a2(a.size()), b2(a.size());
    check(api->read_kv(cache, 0, 1, 5, 1, a.data(), b.data()) == KVC_OK &&
              api->read_kv(cache, 2, 1, 5, 1, a2.data(), b2.data()) == KVC_OK && a == a2 && b == b2,
          "fork copies the stored rows");
    check(api->release(cache, 2) == KVC_OK, "release");
    api->destroy(cache);

    const char* what = f16 ? "f16" : "q8_0";
    if (f16)
        std::printf("[%s] %ld stored values: %ld differ from f16 round-to-nearest-even\n", what, t.codes,
                    t.emu_code_diff);
    else
        std::printf("[%s] %ld stored codes, %ld blocks: against ggml's x86 quantizer %ld codes and %ld scales differ\n",
                    what, t.codes, t.blocks, t.emu_code_diff, t.emu_scale_diff);
    if (!f16)
        std::printf("[%s] against the reference quantizer (quantize_row_q8_0_ref): %ld codes differ (%ld exact ties "
                    "rounded to even, %ld from 127/amax instead of 1/d, %ld other), %ld scales differ\n",
                    what, t.ref_code_diff, t.ref_tie, t.ref_reciprocal, t.ref_other, t.ref_scale_diff);
    std::printf("[%s] outputs: max |out - attention over the stored rows, q as ggml rounds it| = %.3g (relative to "
                "max(1, |V|)); with q as given instead: %.3g\n",
                what, t.out_err, t.q_effect);
    check(t.emu_code_diff == 0 && t.emu_scale_diff == 0, std::string(what) + ": stored bits are ggml's quantizer's");
    check(f16 || t.ref_other == 0, "q8_0: every difference from the reference is a tie or the reciprocal");
    check(f16 || (t.ref_tie > 0 && t.ref_reciprocal > 0), "q8_0: the constructed rows hit both differences");
    // q8_0: f32 arithmetic over exact dequantized rows; the tie rows hold values up to 127, so scores reach ~60
    // and one f32 ulp of a score (~4e-6) moves a probability by that much. f16: ggml rounds its V accumulator to
    // f16 at every row (~5e-4 each).
    check(t.out_err < (f16 ? 1e-2 : 5e-5), std::string(what) + ": outputs match the declared pipeline");
    return 0;
}

} // namespace

int main(int argc, char** argv) {
#if !defined(__x86_64__)
    // The emulated quantizer is ggml's x86 kernel; NEON and generic builds round differently (ties, reciprocal).
    (void)argv;
    std::printf("SKIP: the emulated ggml quantizer is its x86 AVX kernel; this is not an x86-64 build\n");
    return argc == 2 ? 77 : 2;
#endif
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s path/to/libkvcheck_ggml.so\n", argv[0]);
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        std::fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    const auto entry = reinterpret_cast<kvc_entry_fn>(dlsym(lib, KVC_ENTRY_SYMBOL));
    const kvc_plugin_api* api = entry ? entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR) : nullptr;
    if (api == nullptr) {
        std::fprintf(stderr, "no plugin table in %s\n", argv[1]);
        return 1;
    }
    std::printf("plugin %s %s\n", api->name, api->version);
    unsetenv("KVCHECK_GGML_CACHE");
    if (run(api, false) != 0) return 1;
    setenv("KVCHECK_GGML_CACHE", "f16", 1);
    if (run(api, true) != 0) return 1;
    return failures == 0 ? 0 : 1;
}
