// Multi-head latent attention shapes in the CPU engine (ABI 1.2: head_dim_v, rope_dim_begin, rope_dims): outputs
// against kvc::ref::attend_heads<long double>(..., d_v) with K rotated on its RoPE range (kvc::ref::apply_rope_range),
// for every dtype, prefill, chunks and decode, with and without sliding windows; read_kv's V rows have head_dim_v
// dims and are bitwise what was appended (rounded or quantized like the reference); memory() counts a K row at
// head_dim and a V row at head_dim_v.
#include "engine_test_util.hpp"

#include "attention_kernel.hpp"
#include "simd.hpp"

#include "kvcheck/optimized/cpu_engine.h"
#include "kvcheck/reference/quantize.hpp"

namespace kvc::test {
namespace {

struct Shape {
    const char* name;
    uint32_t n_q_heads, n_kv_heads, head_dim, head_dim_v; // head_dim_v 0: head_dim
    uint32_t rope_begin, rope_dims;                      // rope_dims 0: the whole head
};

const Shape kShapes[] = {
    {"mla_576_512_64", 16, 1, 576, 512, 512, 64}, // DeepSeek's decode form: MQA over the latent, RoPE on the tail
    {"mla_c16_r4", 4, 1, 20, 16, 16, 4},
    {"mla_c32_r8", 8, 1, 40, 32, 32, 8},
    {"mla_c32_r32", 6, 1, 64, 32, 32, 32},   // q8_0-friendly: both widths multiples of 32
    {"wide_v", 4, 2, 16, 24, 0, 8},          // V wider than K
    {"partial_rotary", 4, 2, 32, 0, 0, 16},  // GPT-NeoX's partial_rotary_factor 0.5: RoPE on [0, d/2)
};

const uint32_t kDtypes[] = {KVC_DTYPE_F32,      KVC_DTYPE_F16,        KVC_DTYPE_BF16, KVC_DTYPE_FP8_E4M3,
                            KVC_DTYPE_FP8_E5M2, KVC_DTYPE_INT8_TOKEN, KVC_DTYPE_Q8_0};

uint32_t dv_of(const kvc_config& c) { return value_dim(c); }

bool shape_fits(const Shape& s, uint32_t dtype) {
    const uint32_t dv = s.head_dim_v ? s.head_dim_v : s.head_dim;
    return dtype != KVC_DTYPE_Q8_0 || (s.head_dim % 32 == 0 && dv % 32 == 0);
}

kvc_config latent_config(const Shape& s, uint32_t dtype, uint32_t rope, uint32_t block) {
    kvc_config c = make_config(s.n_q_heads, s.n_kv_heads, s.head_dim, dtype, block, rope);
    c.head_dim_v = s.head_dim_v;
    c.rope_dim_begin = s.rope_begin;
    c.rope_dims = s.rope_dims;
    return c;
}

// One stored row as the reference makes it: the element bytes read_kv returns, and the values attention reads.
struct StoredRow {
    std::vector<uint8_t> bytes;
    std::vector<uint8_t> scales; // quantized dtypes: what read_kv_scales returns for the row
    std::vector<float> values;
};

template <typename T>
void put(std::vector<uint8_t>& out, T x) {
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    out.insert(out.end(), p, p + sizeof x);
}

StoredRow store(const float* x, uint32_t d, uint32_t dtype) {
    StoredRow r;
    r.values.resize(d);
    if (dtype == KVC_DTYPE_FP8_E4M3 || dtype == KVC_DTYPE_FP8_E5M2) { // KVC_SCALE_NONE: scale 1
        const auto f = dtype == KVC_DTYPE_FP8_E4M3 ? ref::Fp8::E4M3FN : ref::Fp8::E5M2;
        r.bytes.resize(d);
        ref::quantize_fp8_row(x, static_cast<int>(d), 1.0f, f, r.bytes.data());
        ref::dequantize_fp8_row(r.bytes.data(), static_cast<int>(d), 1.0f, f, r.values.data());
        put(r.scales, 1.0f);
    } else if (dtype == KVC_DTYPE_INT8_TOKEN) { // f32 scale (int8_scale_dtype 0)
        r.bytes.resize(d);
        auto* codes = reinterpret_cast<int8_t*>(r.bytes.data());
        const float s = ref::quantize_int8_row(x, static_cast<int>(d), ref::ScaleDtype::F32, codes);
        ref::dequantize_int8_row(codes, static_cast<int>(d), s, r.values.data());
        put(r.scales, s);
    } else if (dtype == KVC_DTYPE_Q8_0) {
        std::vector<ref::BlockQ8_0> blocks(d / 32);
        ref::quantize_row_q8_0(x, static_cast<int>(d), blocks.data());
        ref::dequantize_row_q8_0(blocks.data(), static_cast<int>(d), r.values.data());
        for (const auto& b : blocks) {
            r.bytes.insert(r.bytes.end(), reinterpret_cast<const uint8_t*>(b.qs),
                           reinterpret_cast<const uint8_t*>(b.qs) + 32);
            put(r.scales, b.d);
        }
    } else {
        const size_t es = esize(dtype);
        r.bytes.resize(d * es);
        for (uint32_t i = 0; i < d; ++i) {
            r.values[i] = ref::round_to_dtype(x[i], dtype);
            ref::store_dtype(x[i], dtype, r.bytes.data() + i * es);
        }
    }
    return r;
}

// One (sequence, layer) as the reference sees it: K rotated on its range by its position (long double, rounded to
// float), then K and V stored like the cache stores them. K: [len][H_kv * d], V: [len][H_kv * d_v].
struct LatentHistory {
    explicit LatentHistory(const kvc_config& config) : c(config) {}
    void add(const std::vector<float>& k, const std::vector<float>& v) {
        const uint32_t d = c.head_dim, dv = dv_of(c), H = c.n_kv_heads;
        const size_t n = k.size() / (size_t{H} * d);
        std::vector<long double> kr(d);
        std::vector<float> kf(d);
        for (size_t t = 0; t < n; ++t, ++len)
            for (uint32_t h = 0; h < H; ++h) {
                for (uint32_t i = 0; i < d; ++i) kr[i] = k[(t * H + h) * d + i];
                rotate(kr.data(), len);
                for (uint32_t i = 0; i < d; ++i) kf[i] = static_cast<float>(kr[i]);
                const StoredRow ks = store(kf.data(), d, c.cache_dtype);
                const StoredRow vs = store(&v[(t * H + h) * dv], dv, c.cache_dtype);
                K.insert(K.end(), ks.values.begin(), ks.values.end());
                V.insert(V.end(), vs.values.begin(), vs.values.end());
                V_bytes.insert(V_bytes.end(), vs.bytes.begin(), vs.bytes.end());
                V_scales.insert(V_scales.end(), vs.scales.begin(), vs.scales.end());
            }
    }
    void rotate(long double* x, long pos) const {
        const int dims = static_cast<int>(c.rope_dims ? c.rope_dims : c.head_dim);
        ref::apply_rope_range(x, static_cast<int>(c.rope_dim_begin), dims, pos, static_cast<ref::Rope>(c.rope),
                              c.rope_theta);
    }
    // The outputs of the last n_q tokens for queries q ([n_q][H_q][d], unrotated) under window w and s sinks.
    std::vector<double> oracle(const std::vector<float>& q, uint32_t w, uint32_t s) const {
        using LD = long double;
        const int d = static_cast<int>(c.head_dim), dv = static_cast<int>(dv_of(c));
        const int Hq = static_cast<int>(c.n_q_heads), Hkv = static_cast<int>(c.n_kv_heads);
        const long n_q = static_cast<long>(q.size() / (static_cast<size_t>(Hq) * d));
        ref::Mat<LD> Km(len, Hkv * d), Vm(len, Hkv * dv), Q(n_q, Hq * d);
        std::copy(K.begin(), K.end(), Km.data());
        std::copy(V.begin(), V.end(), Vm.data());
        for (long t = 0; t < n_q; ++t)
            for (int hh = 0; hh < Hq; ++hh) {
                LD* row = &Q(t, hh * d);
                for (int i = 0; i < d; ++i) row[i] = q[(static_cast<size_t>(t) * Hq + hh) * d + i];
                rotate(row, len - n_q + t);
            }
        const ref::Mat<LD> out = ref::attend_heads<LD>(Q, Km, Vm, Hq, Hkv, d, static_cast<LD>(c.scale),
                                                       ref::Visibility{long(w), long(s)}, dv);
        return std::vector<double>(out.data(), out.data() + out.size());
    }
    kvc_config c;
    std::vector<long double> K, V;
    std::vector<uint8_t> V_bytes;  // read_kv's V elements (codes), [len][H_kv][d_v * element bytes]
    std::vector<uint8_t> V_scales; // read_kv_scales' V scales, [len][H_kv][scales of a d_v row]
    long len = 0;
};

// Quantized rows carry up to one step of their format's rounding in every element: outputs are compared with a
// tolerance for the f32 arithmetic only, since the oracle reads the same dequantized rows.
void run_case(const Shape& s, uint32_t dtype, uint32_t rope, uint32_t window, uint32_t sinks, uint64_t seed,
              const opt::EngineOptions& o = {}) {
    const std::string what = std::string(s.name) + " " + kvc::dtype_name(dtype) + " rope " + std::to_string(rope) +
                             " window " + std::to_string(window);
    SCOPED_TRACE(what);
    std::vector<uint32_t> windows = {window};
    kvc_config c = latent_config(s, dtype, rope, 7);
    if (window) {
        c.windows = windows.data();
        c.n_sinks = sinks;
        c.evict = 1;
    }
    auto e = make_engine(c, o);
    ASSERT_TRUE(e);
    Rng rng(seed);
    LatentHistory h(c);
    const uint32_t d = c.head_dim, dv = dv_of(c), H = c.n_kv_heads, Hq = c.n_q_heads;
    const uint32_t chunks[] = {11, 1, 9, 1, 1, 5, 1};   // prefill, decode, a chunk, decodes, a chunk, a decode
    for (uint32_t n : chunks) {
        const auto q = rng.normal(size_t{n} * Hq * d), k = rng.normal(size_t{n} * H * d);
        const auto v = rng.normal(size_t{n} * H * dv);
        std::vector<float> out(size_t{n} * Hq * dv, NAN);
        ASSERT_EQ(e->append_attend(0, 0, n, q.data(), k.data(), v.data(), out.data()), KVC_OK) << e->last_error();
        h.add(k, v);
        expect_close(out, h.oracle(q, window, window ? sinks : 0), what + " after " + std::to_string(h.len));
    }
    // read_kv of the rows still held: V rows of d_v elements, bitwise the reference's
    const size_t vrow = h.V_bytes.size() / (static_cast<size_t>(h.len) * H);
    EXPECT_EQ(vrow, size_t{dv} * kvc::dtype_size(dtype));
    // with a window, the rows a later query can still see (the older ones may be evicted)
    const uint32_t from = window ? static_cast<uint32_t>(h.len) - window + 1 : 0;
    const uint32_t n = static_cast<uint32_t>(h.len) - from;
    const size_t krow = size_t{d} * kvc::dtype_size(dtype);
    std::vector<uint8_t> kb(size_t{n} * H * krow + 1, 0xAB), vb(size_t{n} * H * vrow + 1, 0xAB);
    ASSERT_EQ(e->read_kv(0, 0, from, n, kb.data(), vb.data()), KVC_OK) << e->last_error();
    EXPECT_EQ(0, std::memcmp(vb.data(), h.V_bytes.data() + size_t{from} * H * vrow, size_t{n} * H * vrow));
    EXPECT_EQ(vb.back(), 0xAB) << "read_kv wrote past n * H * d_v elements";
    EXPECT_EQ(kb.back(), 0xAB) << "read_kv wrote past n * H * d elements";
    if (!h.V_scales.empty()) { // quantized: V rows' own scales (q8_0: d_v / 32 of them), bitwise the reference's
        const size_t vs = h.V_scales.size() / (static_cast<size_t>(h.len) * H);
        std::vector<uint8_t> ks(size_t{n} * H * 64 + 1), vsb(size_t{n} * H * vs + 1, 0xAB);
        ASSERT_EQ(e->read_kv_scales(0, 0, from, n, ks.data(), vsb.data()), KVC_OK) << e->last_error();
        EXPECT_EQ(0, std::memcmp(vsb.data(), h.V_scales.data() + size_t{from} * H * vs, size_t{n} * H * vs));
        EXPECT_EQ(vsb.back(), 0xAB) << "read_kv_scales wrote past the V rows' scales";
    }
    if (window == 0) { // memory: a K row at d, a V row at d_v (with its scales)
        kvc_memory m{};
        m.struct_size = sizeof m;
        ASSERT_EQ(e->memory(&m), KVC_OK);
        const uint64_t per_token = uint64_t{H} * (kvc::head_row_bytes(dtype, d, c.int8_scale_dtype) +
                                                  kvc::head_row_bytes(dtype, dv, c.int8_scale_dtype));
        EXPECT_EQ(m.live_bytes, static_cast<uint64_t>(h.len) * per_token);
        EXPECT_GE(m.capacity_bytes, m.live_bytes);
    }
}

TEST(Latent, EveryShapeDtypeAndRopeAgainstTheReference) {
    const uint64_t seed = test_seed(20261206);
    for (const Shape& s : kShapes)
        for (uint32_t dtype : kDtypes) {
            if (!shape_fits(s, dtype)) continue;
            for (uint32_t rope : {KVC_ROPE_NEOX, KVC_ROPE_GPTJ}) run_case(s, dtype, rope, 0, 0, seed);
        }
}

TEST(Latent, WindowsSinksAndEviction) {
    const uint64_t seed = test_seed(20261207);
    for (const Shape& s : kShapes)
        for (uint32_t dtype : kDtypes)
            if (shape_fits(s, dtype)) run_case(s, dtype, KVC_ROPE_GPTJ, 9, 2, seed);
}

// The portable kernel for every shape, then the x86 ones (where the CPU has them), one thread, in test mode: full
// blocks read-only (a write into a V plane past its width would fault) and fresh slots NaN (a read of a slot never
// written would show).
TEST(Latent, PortableKernelSealedAndPoisoned) {
    const uint64_t seed = test_seed(20261210);
    opt::EngineOptions o;
    o.threads = 1;
    o.seal_full_blocks = true;
    o.poison_unused = true;
    for (const bool simd : {false, true}) {
        o.simd = simd;
        for (const Shape& s : kShapes)
            for (uint32_t dtype : {KVC_DTYPE_F32, KVC_DTYPE_BF16, KVC_DTYPE_INT8_TOKEN, KVC_DTYPE_Q8_0})
                if (shape_fits(s, dtype)) {
                    run_case(s, dtype, KVC_ROPE_NEOX, 0, 0, seed, o);
                    run_case(s, dtype, KVC_ROPE_GPTJ, 9, 2, seed, o);
                }
    }
}

// Restores the x86 kernels' process-wide path switches however the test ends.
struct PathsRestored {
    bool avx2_group = opt::avx2_group_path(), avx512_group = opt::avx512_group_path();
    ~PathsRestored() {
        opt::set_avx2_group_path(avx2_group);
        opt::set_avx512_group_path(avx512_group);
    }
};

// Every latent shape and the wide MHA head go through the x86 kernels (the engine asks simd_serves), and on a CPU
// with AVX-512 the MLA decode's tiles of 8 query heads reach that kernel's group path: its count of scored splits
// moves. The other tests then check those kernels' outputs against the reference.
TEST(Latent, SimdKernelsServeTheLatentShapes) {
    for (const Shape& s : kShapes)
        EXPECT_TRUE(opt::simd_serves(s.head_dim, s.head_dim_v ? s.head_dim_v : s.head_dim)) << s.name;
    EXPECT_TRUE(opt::simd_serves(576, 576));
    if (!opt::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 here: the group path's counts cannot witness the dispatch";
    PathsRestored restore;
    opt::set_avx2_group_path(true);
    opt::set_avx512_group_path(true);
    const opt::ScoreLayoutSplits before = opt::avx512_score_layout_splits();
    run_case(kShapes[0], KVC_DTYPE_BF16, KVC_ROPE_NEOX, 0, 0, test_seed(20261211));
    const opt::ScoreLayoutSplits after = opt::avx512_score_layout_splits();
    EXPECT_GT(after.key_pairs + after.row_pairs, before.key_pairs + before.row_pairs)
        << "the MLA decode did not reach the AVX-512 kernel's group path";
}

// The AVX2 kernel (the AVX-512 kernel's own paths off) and the x86 direct path (group paths off) for every latent
// shape and dtype, windows, sinks and eviction included: whichever x86 kernel and path a machine runs matches the
// reference.
TEST(Latent, Avx2KernelAndDirectPathAgainstTheReference) {
    if (!opt::cpu_has_avx2_f16c()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C";
    PathsRestored restore;
    const uint64_t seed = test_seed(20261212);
    opt::set_avx512_group_path(false);
    for (const bool group : {true, false}) {
        opt::set_avx2_group_path(group);
        SCOPED_TRACE(group ? "AVX2 kernel, group path" : "AVX2 kernel, direct path");
        for (const Shape& s : kShapes)
            for (uint32_t dtype : kDtypes)
                if (shape_fits(s, dtype)) {
                    run_case(s, dtype, KVC_ROPE_NEOX, 0, 0, seed);
                    run_case(s, dtype, KVC_ROPE_GPTJ, 9, 2, seed);
                }
    }
}

// Decode steps of a wide MHA head (576 = 576, the x86 kernels' widest rows) through the default kernel.
TEST(Latent, WideHeadWithoutSeparateV) {
    const uint64_t seed = test_seed(20261208);
    const Shape wide{"wide_576", 4, 2, 576, 0, 0, 0};
    for (uint32_t dtype : {KVC_DTYPE_F32, KVC_DTYPE_BF16, KVC_DTYPE_Q8_0})
        run_case(wide, dtype, KVC_ROPE_NEOX, 0, 0, seed);
}

// Fork shares the blocks; the child's copy-on-write of the partial last block copies V rows at d_v.
TEST(Latent, ForkCopiesVRowsAtTheirWidth) {
    const uint64_t seed = test_seed(20261209);
    const Shape& s = kShapes[1];
    const kvc_config c = latent_config(s, KVC_DTYPE_F16, KVC_ROPE_GPTJ, 7);
    auto e = make_engine(c);
    ASSERT_TRUE(e);
    Rng rng(seed);
    const uint32_t d = c.head_dim, dv = dv_of(c), Hq = c.n_q_heads;
    LatentHistory h(c);
    auto step = [&](uint32_t seq, uint32_t n, LatentHistory& hist) {
        const auto q = rng.normal(size_t{n} * Hq * d), k = rng.normal(size_t{n} * d), v = rng.normal(size_t{n} * dv);
        std::vector<float> out(size_t{n} * Hq * dv, NAN);
        ASSERT_EQ(e->append_attend(seq, 0, n, q.data(), k.data(), v.data(), out.data()), KVC_OK) << e->last_error();
        hist.add(k, v);
        expect_close(out, hist.oracle(q, 0, 0), "seq " + std::to_string(seq));
    };
    step(0, 10, h); // a partial second block
    ASSERT_EQ(e->fork(0, 1), KVC_OK) << e->last_error();
    LatentHistory child = h;
    step(1, 3, child);
    step(0, 2, h);
    step(1, 1, child);
    std::vector<uint8_t> kb(size_t{13} * d * 2), vb(size_t{13} * dv * 2);
    ASSERT_EQ(e->read_kv(1, 0, 0, 13, kb.data(), vb.data()), KVC_OK);
    EXPECT_EQ(0, std::memcmp(vb.data(), child.V_bytes.data(), vb.size()));
    ASSERT_EQ(e->read_kv(0, 0, 0, 12, kb.data(), vb.data()), KVC_OK);
    EXPECT_EQ(0, std::memcmp(vb.data(), h.V_bytes.data(), size_t{12} * dv * 2));
}

TEST(Latent, CapsDeclareTheLatentFeatures) {
    const kvc_caps caps = kvc::query_caps(kvc_cpu_engine_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR));
    EXPECT_TRUE(caps.features & KVC_FEATURE_HEAD_DIM_V);
    EXPECT_TRUE(caps.features & KVC_FEATURE_ROPE_RANGE);
    EXPECT_GE(caps.max_head_dim, 576u);
    EXPECT_GE(caps.max_head_dim_v, 512u);
}

TEST(Latent, BadLatentConfigsAreRefused) {
    const Shape& s = kShapes[1];
    auto refused = [](kvc_config c) {
        kvc_status st = KVC_OK;
        std::string err;
        auto e = opt::Engine::create(c, {}, &st, &err);
        return e == nullptr && st != KVC_OK;
    };
    kvc_config c = latent_config(s, KVC_DTYPE_F32, KVC_ROPE_NEOX, 7);
    c.rope_dims = 5; // odd
    EXPECT_TRUE(refused(c));
    c = latent_config(s, KVC_DTYPE_F32, KVC_ROPE_NEOX, 7);
    c.rope_dim_begin = 18; // [18, 22) past head_dim 20
    EXPECT_TRUE(refused(c));
    c = latent_config(s, KVC_DTYPE_F32, KVC_ROPE_NEOX, 7);
    c.head_dim_v = 577;
    EXPECT_TRUE(refused(c));
    c = latent_config(kShapes[0], KVC_DTYPE_Q8_0, KVC_ROPE_NEOX, 7);
    c.head_dim_v = 48; // not a multiple of 32
    EXPECT_TRUE(refused(c));
    c = latent_config(s, KVC_DTYPE_F32, KVC_ROPE_NEOX, 7);
    c.head_dim = 21; // odd head, even range inside it: accepted
    c.rope_dim_begin = 17;
    EXPECT_FALSE(refused(c));
}

} // namespace
} // namespace kvc::test
