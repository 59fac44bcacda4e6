// The AVX2 split kernel's two paths for tiles of several rows (the group path of 2026-12-01, and the direct path it
// replaced; attention_kernel.hpp) must give the same bits, and so must every walk (WalkPlan: how far and where to
// it prefetches, how many keys it reads per visit to a head): the engine's determinism contract does not say which
// path or walk ran, and the benchmark's A/Bs compare their speed assuming equal results. Random shapes (dtype, rows, heads
// per call, block size, head_dim, causal limits, split), seed printed; each path is also checked against the
// portable kernel within a loose bound, so a path that computes garbage identically in both would still fail. The
// AVX-512 kernel must give the AVX2 kernel's bits too, for latent shapes (V rows of another width than K rows) as well.
#include "engine_test_util.hpp"

#include "attention_kernel.hpp"
#include "dtype_convert.hpp"
#include "simd.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace kvc::test {
namespace {

using opt::RowTile;
using opt::SoftmaxState;
using opt::SplitArgs;

// One random case: a pool of blocks in shuffled order, a tile of n rows per head, nh heads per call. A latent case
// has V rows of another width than K rows (multi-head latent attention shapes, up to kMaxHeadDim): each block holds
// its K plane, then the V plane at V's width (kvc_kv_layout_v, engine_impl.hpp).
struct KernelCase {
    uint32_t dtype, block, kv_heads, head_dim, nh, k0;
    uint32_t head_dim_v = 0; // V rows' width (head_dim unless latent)
    float q_scale = 1.0f;
    int n;
    kvc_kv_layout layout{};
    kvc_kv_layout layout_v{}; // latent cases: V's geometry, V plane after K's
    bool latent = false;
    std::vector<uint8_t> pool;
    std::vector<uint8_t*> bases;
    std::vector<uint32_t> table;
    std::vector<float> q; // [nh][n][padded_dim]
    RowTile tiles[opt::kMaxCallRows];

    explicit KernelCase(Rng& rng, bool latent_shape = false) : latent(latent_shape) {
        const uint32_t dtypes[] = {KVC_DTYPE_F16, KVC_DTYPE_BF16, KVC_DTYPE_F32};
        // every way a row can end: d % 8 != 0, chunks of 8 after whole and odd counts of 16 (12, 24, 40), odd
        // counts of 16 (48, 80), and 256
        const uint32_t dims[] = {1, 5, 8, 12, 24, 40, 48, 64, 80, 100, 128, 256};
        // latent: (d_k, d_v) of DeepSeek's MLA decode (576, 512), its small forms (K = the latent plus a RoPE tail),
        // V wider than K, both widths ending mid-chunk, and the widest rows (576 = kMaxHeadDim) on both sides
        const uint32_t latent_dims[][2] = {{576, 512}, {20, 16}, {40, 32}, {16, 24}, {576, 576}, {300, 264},
                                           {72, 64},   {13, 5},  {264, 576}};
        dtype = dtypes[rng.below(3)];
        block = 1 + rng.below(rng.below(2) ? 300 : 40);
        if (latent) {
            const auto& dims_kv = latent_dims[rng.below(sizeof latent_dims / sizeof latent_dims[0])];
            head_dim = dims_kv[0];
            head_dim_v = dims_kv[1];
        } else {
            head_dim = dims[rng.below(sizeof dims / sizeof dims[0])];
        }
        n = 1 + static_cast<int>(rng.below(opt::kTileRows));
        nh = 1 + rng.below(opt::max_call_heads(n));
        kv_heads = nh + rng.below(3);
        const uint32_t first_head = kv_heads - nh; // the call covers the last nh heads
        const uint32_t eb = dtype == KVC_DTYPE_F32 ? 4 : 2;
        layout = kvc_kv_layout_make(block, kv_heads, head_dim, eb);
        if (!latent) head_dim_v = head_dim;
        layout_v = kvc_kv_layout_make(block, kv_heads, head_dim_v, eb);
        layout_v.plane_bytes = layout.plane_bytes; // the V plane starts after K's (kvc_kv_layout_v)
        const uint64_t block_bytes = layout.plane_bytes + uint64_t{kv_heads} * layout_v.head_bytes;
        k0 = opt::kSplitKeys * rng.below(3);
        // limits: non-decreasing (rows in token order), the last reaching into or past the split
        const uint32_t last = k0 + 1 + rng.below(opt::kSplitKeys + 40);
        const uint32_t dq = opt::padded_dim(head_dim);
        q.assign(size_t(nh) * n * dq, 0.0f);
        const uint32_t n_blocks = (last + block - 1) / block;
        pool.resize(size_t(n_blocks) * block_bytes);
        for (uint32_t b = 0; b < n_blocks; ++b) table.push_back(b);
        for (uint32_t b = n_blocks; b > 1; --b) std::swap(table[b - 1], table[rng.below(b)]);
        table.shrink_to_fit(); // a read past the table's end leaves its allocation: the sanitizer build sees it
        for (uint32_t b = 0; b < n_blocks; ++b) bases.push_back(pool.data() + size_t(b) * block_bytes);
        layout.block_base = layout_v.block_base = bases.data();
        const std::vector<float> kv = rng.normal(pool.size() / eb);
        for (size_t i = 0; i < kv.size(); ++i) opt::store_elem(kv[i], dtype, pool.data() + i * eb);
        uint32_t limits[opt::kTileRows];
        for (int r = n - 1; r >= 0; --r) { // each row sees 0 to 2 keys fewer than the next, and at least 1
            const uint32_t fewer = rng.below(3);
            limits[r] = r == n - 1 ? last : limits[r + 1] > fewer ? std::max<uint32_t>(1, limits[r + 1] - fewer) : 1;
        }
        // scores of spread 1, 12 or 100: the last make most exponentials underflow (s - m < -87: exactly 0), the
        // clamp every width of exp must apply alike
        const float q_scales[] = {1.0f, 12.0f, 100.0f};
        q_scale = q_scales[rng.below(3)];
        for (uint32_t h = 0; h < nh; ++h) {
            tiles[h].n = n;
            for (int r = 0; r < n; ++r) {
                float* qr = q.data() + (size_t(h) * n + r) * dq;
                const std::vector<float> v = rng.normal(head_dim);
                for (uint32_t i = 0; i < head_dim; ++i) qr[i] = q_scale * v[i];
                tiles[h].q[r] = qr;
                tiles[h].limit[r] = limits[r];
            }
        }
        first_head_ = first_head;
    }

    // The states of every row of every head, flattened: m, l, then o[head_dim_v], per (head, row).
    std::vector<float> run(opt::SplitKernel kernel) const {
        const uint32_t dq = opt::padded_dim(head_dim_v);
        std::vector<float> o(size_t(nh) * opt::kTileRows * dq, NAN);
        SoftmaxState st[opt::kMaxCallRows * opt::kTileRows];
        for (uint32_t h = 0; h < nh; ++h)
            for (int r = 0; r < opt::kTileRows; ++r) st[h * opt::kTileRows + r].o = o.data() + (h * opt::kTileRows + r) * dq;
        SplitArgs args{&layout, table.data(), first_head_, 1.0f / std::sqrt(float(head_dim))};
        if (latent) args.v_layout = &layout_v;
        kernel(args, nh, tiles, k0, st);
        std::vector<float> flat;
        for (uint32_t h = 0; h < nh; ++h)
            for (int r = 0; r < n; ++r) {
                const SoftmaxState& s = st[h * opt::kTileRows + r];
                flat.push_back(s.m);
                flat.push_back(s.l);
                flat.insert(flat.end(), s.o, s.o + head_dim_v);
            }
        return flat;
    }

    // A sliding window of w keys for every row (each row's own: from = limit - w) and s sinks.
    void set_window(uint32_t w, uint32_t s) {
        window = w;
        sinks = s;
        for (uint32_t h = 0; h < nh; ++h) {
            tiles[h].sinks = s;
            for (int r = 0; r < n; ++r) tiles[h].from[r] = tiles[h].limit[r] > w ? tiles[h].limit[r] - w : 0;
        }
    }
    // The same case with only row r of every head (a one-row tile).
    KernelCase only_row(int r) const {
        KernelCase one = *this;
        one.layout.block_base = one.layout_v.block_base = one.bases.data();
        for (uint32_t h = 0; h < nh; ++h) {
            one.tiles[h].n = 1;
            one.tiles[h].q[0] = tiles[h].q[r];
            one.tiles[h].limit[0] = tiles[h].limit[r];
            one.tiles[h].from[0] = tiles[h].from[r];
        }
        one.n = 1;
        return one;
    }
    uint32_t window = 0, sinks = 0;

    std::string describe() const {
        return "dtype " + std::to_string(dtype) + ", block " + std::to_string(block) + ", head_dim " +
               std::to_string(head_dim) + ", head_dim_v " + std::to_string(head_dim_v) + ", rows " + std::to_string(n) + ", heads per call " + std::to_string(nh) +
               ", k0 " + std::to_string(k0) + ", last limit " + std::to_string(tiles[0].limit[n - 1]) +
               ", q scale " + std::to_string(q_scale) + ", window " + std::to_string(window) + ", sinks " +
               std::to_string(sinks);
    }

private:
    uint32_t first_head_ = 0;
};

// Restores the kernels' process-wide switches (group paths, walk) however the test ends.
struct SwitchesRestored {
    bool avx2_group = opt::avx2_group_path(), avx512_group = opt::avx512_group_path();
    bool score_row_pairs = opt::avx512_score_row_pairs();
    opt::WalkPlan walk = opt::avx2_walk();
    ~SwitchesRestored() {
        opt::set_avx2_group_path(avx2_group);
        opt::set_avx512_group_path(avx512_group);
        opt::set_avx512_score_row_pairs(score_row_pairs);
        opt::set_avx2_walk(walk);
    }
};

TEST(KernelPaths, GroupPathMatchesDirectPathBitwise) {
    if (!opt::cpu_has_avx2_f16c()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C: the AVX2 kernel cannot run here";
    SwitchesRestored restore;
    Rng rng(test_seed(20261201));
    int cases_with_group_rows = 0;
    for (int c = 0; c < 300; ++c) {
        const KernelCase kc(rng);
        const opt::SplitKernel avx2 = opt::split_kernel_avx2(kc.dtype);
        opt::set_avx2_group_path(true);
        const std::vector<float> group = kc.run(avx2);
        opt::set_avx2_group_path(false);
        const std::vector<float> direct = kc.run(avx2);
        const std::vector<float> portable = kc.run(opt::split_kernel_scalar(kc.dtype));
        ASSERT_EQ(group.size(), direct.size());
        ASSERT_EQ(0, std::memcmp(group.data(), direct.data(), group.size() * sizeof(float)))
            << "case " << c << ": " << kc.describe();
        // against the portable kernel (another order of additions): the same state up to rounding. m is a
        // maximum of scores, l a sum of up to 256 terms <= 1, o a sum of p * v with |v| a few units.
        for (size_t i = 0; i < group.size(); ++i) {
            const float a = group[i], b = portable[i];
            if (std::isinf(a) || std::isinf(b)) {
                ASSERT_EQ(a, b) << "case " << c << ", value " << i << ": " << kc.describe();
                continue;
            }
            ASSERT_NEAR(a, b, 1e-3f * (1.0f + std::fabs(b))) << "case " << c << ", value " << i << ": " << kc.describe();
        }
        if (kc.n >= 4) ++cases_with_group_rows;
    }
    EXPECT_GT(cases_with_group_rows, 50) << "the random shapes must exercise tiles of 4 rows or more";
}

TEST(KernelPaths, EveryWalkGivesTheSameBits) {
    if (!opt::cpu_has_avx2_f16c()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C: the AVX2 kernel cannot run here";
    SwitchesRestored restore;
    // kDefaultWalk first; visits of 1, 3, 4, 16 and 100 keys, whole runs, prefetching into L1 or L2 (or nothing
    // ahead), the visits as long as the prefetch or not; pages primed 1, 8 or 255 KiB ahead (the primer reads the
    // block table far ahead, into the next split: the sanitizer build checks that it stays inside the table)
    const opt::WalkPlan walks[] = {{16, true, true, 16},           {1, true, true, 1},    {3, false, true, 3},
                                   {100, true, true, 100},         {16, true, false, 16}, {0, false, false, 16},
                                   {16, true, true, 4},            {4, true, true, 4},    {2, true, true, 8},
                                   {16, true, true, 0},            {16, true, true, 4, true, 8},
                                   {1, false, false, 16, false, 1}, {0, true, true, 4, true, 255}};
    Rng rng(test_seed(20261202));
    int cases_with_short_visits = 0;
    for (int c = 0; c < 200; ++c) {
        const KernelCase kc(rng);
        const opt::SplitKernel avx2 = opt::split_kernel_avx2(kc.dtype);
        opt::set_avx2_walk(walks[0]);
        const std::vector<float> first = kc.run(avx2);
        for (size_t w = 1; w < sizeof walks / sizeof walks[0]; ++w) {
            opt::set_avx2_walk(walks[w]);
            const std::vector<float> other = kc.run(avx2);
            ASSERT_EQ(first.size(), other.size());
            ASSERT_EQ(0, std::memcmp(first.data(), other.data(), first.size() * sizeof(float)))
                << "case " << c << ", walk " << w << ": " << kc.describe();
        }
        // a visit shorter than a run needs a tile of 1-3 rows, several heads or not, and runs longer than 3 keys
        if (kc.n < 4 && kc.block > 3) ++cases_with_short_visits;
    }
    EXPECT_GT(cases_with_short_visits, 40) << "the random shapes must cut runs into several visits";
}

// The AVX-512 kernel (its 512-bit group path for tiles of 4+ rows; for smaller tiles the direct path with 32
// registers, whose one-row V passes are twice as wide) must give the AVX2 kernel's bits: a machine's results must not
// depend on which of the two it runs.
TEST(KernelPaths, Avx512MatchesAvx2Bitwise) {
    if (!opt::cpu_has_avx512())
        GTEST_SKIP() << "this CPU has no AVX-512 F/DQ/VL/BW: the AVX-512 kernel cannot run here";
    SwitchesRestored restore;
    opt::set_avx512_group_path(true);
    Rng rng(test_seed(20261203));
    int cases_widened = 0, cases_one_row_wide = 0, cases_odd_group = 0;
    for (int c = 0; c < 300; ++c) {
        const KernelCase kc(rng);
        // the group paths (score blocks of key pairs, with the V prefetch spread over the passes or not, and of row
        // pairs: same bits), then the direct path compiled for AVX-512
        for (const int path : {0, 1, 2, 3}) {
            const bool group = path < 3;
            opt::WalkPlan walk = opt::avx2_walk();
            walk.spread_prefetch = path == 1;
            opt::set_avx2_walk(walk);
            opt::set_avx2_group_path(group);
            opt::set_avx512_score_row_pairs(path == 2);
            const opt::ScoreLayoutSplits before = opt::avx512_score_layout_splits();
            const std::vector<float> wide = kc.run(opt::split_kernel_avx512(kc.dtype));
            // the results cannot tell the layouts apart: the kernel's counts say which one scored this call's heads
            const opt::ScoreLayoutSplits after = opt::avx512_score_layout_splits();
            const bool grouped = group && kc.n >= 4, pairs = grouped && path == 2;
            EXPECT_EQ(grouped && !pairs ? kc.nh : 0u, after.key_pairs - before.key_pairs)
                << "splits scored in key pairs, case " << c << ", path " << path << ": " << kc.describe();
            EXPECT_EQ(pairs ? kc.nh : 0u, after.row_pairs - before.row_pairs)
                << "splits scored in row pairs, case " << c << ", path " << path << ": " << kc.describe();
            const std::vector<float> avx2 = kc.run(opt::split_kernel_avx2(kc.dtype));
            ASSERT_EQ(wide.size(), avx2.size());
            for (size_t i = 0; i < wide.size(); ++i)
                ASSERT_EQ(0, std::memcmp(&wide[i], &avx2[i], sizeof(float)))
                    << "case " << c << (group ? ", group path" : ", direct path")
                    << (group && path == 2 ? ", row pairs" : "")
                    << (walk.spread_prefetch ? ", V prefetch spread" : "") << ", value " << i << " (AVX-512 "
                    << wide[i] << ", AVX2 " << avx2[i] << "): " << kc.describe();
        }
        if (kc.n > 4 && kc.dtype != KVC_DTYPE_F32) ++cases_widened;
        if (kc.n >= 4 && kc.n % 2 == 1) ++cases_odd_group;
        if (kc.n == 1 && kc.head_dim >= 128) ++cases_one_row_wide;
    }
    EXPECT_GT(cases_widened, 50) << "the random shapes must exercise the widened V path (f16/bf16, 5+ rows)";
    EXPECT_GT(cases_one_row_wide, 5) << "the random shapes must exercise one row's 16-chunk V passes (d >= 128)";
    EXPECT_GT(cases_odd_group, 20) << "the random shapes must exercise row pairs with a row of zeros (5 or 7 rows)";
}

// Latent shapes (V rows of another width than K rows, rows up to kMaxHeadDim = 576 wide), with and without windows and
// sinks: the AVX2 kernel's group and direct paths give the same bits, the AVX-512 kernel's paths (key pairs, row
// pairs, direct) the AVX2 kernel's bits, and the portable kernel the same states up to rounding.
TEST(KernelPaths, LatentShapesOnEveryKernel) {
    if (!opt::cpu_has_avx2_f16c()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C: the AVX2 kernel cannot run here";
    SwitchesRestored restore;
    Rng rng(test_seed(20261211));
    int cases_mla_group = 0, cases_windowed = 0;
    for (int c = 0; c < 120; ++c) {
        KernelCase kc(rng, true);
        if (rng.below(2)) {
            kc.set_window(1 + rng.below(300), rng.below(2) ? 0 : 1 + rng.below(40));
            ++cases_windowed;
        }
        const std::string what = "case " + std::to_string(c) + ": " + kc.describe();
        const opt::SplitKernel avx2 = opt::split_kernel_avx2(kc.dtype);
        opt::set_avx512_group_path(true);
        opt::set_avx2_group_path(true);
        const std::vector<float> group = kc.run(avx2);
        opt::set_avx2_group_path(false);
        ASSERT_TRUE(bitwise_equal(group, kc.run(avx2))) << "AVX2 group and direct paths differ, " << what;
        if (opt::cpu_has_avx512())
            for (const int path : {0, 1, 2}) { // key pairs, row pairs, the direct path with 32 registers
                opt::set_avx2_group_path(path < 2);
                opt::set_avx512_score_row_pairs(path == 1);
                ASSERT_TRUE(bitwise_equal(group, kc.run(opt::split_kernel_avx512(kc.dtype))))
                    << "AVX-512 (path " << path << ") and AVX2 differ, " << what;
            }
        const std::vector<float> portable = kc.run(opt::split_kernel_scalar(kc.dtype));
        ASSERT_EQ(group.size(), portable.size());
        for (size_t i = 0; i < group.size(); ++i) {
            const float a = group[i], b = portable[i];
            if (std::isinf(a) || std::isinf(b)) {
                ASSERT_EQ(a, b) << "value " << i << ", " << what;
                continue;
            }
            ASSERT_NEAR(a, b, 1e-3f * (1.0f + std::fabs(b))) << "value " << i << ", " << what;
        }
        if (kc.head_dim == 576 && kc.head_dim_v == 512 && kc.n >= 4) ++cases_mla_group;
    }
    EXPECT_GT(cases_mla_group, 0) << "the random shapes must run DeepSeek's 576/512 on the group path";
    EXPECT_GT(cases_windowed, 30);
}

// The machine's kernel choices name core generations by CPUID family (cpu_family): it must be the family the kernel
// reports, read here from an independent source, and the AVX-512 score layout's default must follow it.
TEST(KernelPaths, CpuFamilyIsTheKernelsAndChoosesTheScoreLayout) {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    int family = -1;
    while (family < 0 && std::getline(cpuinfo, line))
        if (line.rfind("cpu family", 0) == 0 && line.find(':') != std::string::npos)
            family = std::stoi(line.substr(line.find(':') + 1));
    if (family < 0) GTEST_SKIP() << "no 'cpu family' line in /proc/cpuinfo: nothing to compare cpu_family() with";
    EXPECT_EQ(static_cast<unsigned>(family), opt::cpu_family());
    EXPECT_EQ(opt::cpu_is_amd() && family == 25, opt::avx512_score_row_pairs())
        << "row pairs by default on AMD family 25 (Zen 4) only (attention_kernel.hpp)";
}

} // namespace
} // namespace kvc::test

namespace kvc::test {
namespace {

// Windows and sinks in one split: every row's state is, bitwise, the state of that row alone in a one-row tile (the
// keys a neighbour sees and the row does not change none of its bits), on every kernel; AVX-512 equals AVX2; the
// portable kernel is close; and the normalized state equals the softmax over exactly the row's visible keys.
TEST(KernelPaths, WindowedRowsDependOnTheirOwnKeysOnly) {
    SwitchesRestored restore;
    Rng rng(test_seed(20261210));
    const bool avx2 = opt::cpu_has_avx2_f16c(), avx512 = opt::cpu_has_avx512();
    int cases_split_by_gap = 0;
    for (int c = 0; c < 300; ++c) {
        KernelCase kc(rng);
        const uint32_t windows[] = {1, 2, 7, 30, 100, 255, 256, 300};
        const uint32_t w = windows[rng.below(8)], s = rng.below(2) ? 0 : 1 + rng.below(40);
        kc.set_window(w, s);
        if (s > 0 && kc.tiles[0].from[0] > s) ++cases_split_by_gap;
        const std::string what = "case " + std::to_string(c) + ": " + kc.describe();
        std::vector<std::pair<const char*, opt::SplitKernel>> kernels = {{"portable", opt::split_kernel_scalar(kc.dtype)}};
        if (avx2) kernels.push_back({"avx2", opt::split_kernel_avx2(kc.dtype)});
        if (avx512) kernels.push_back({"avx512", opt::split_kernel_avx512(kc.dtype)});
        std::vector<std::vector<float>> results;
        for (const auto& [name, kernel] : kernels)
            for (bool group : {true, false}) {
                opt::set_avx2_group_path(group);
                opt::set_avx512_group_path(group);
                const std::vector<float> all = kc.run(kernel);
                const size_t per = 2 + kc.head_dim;
                for (int r = 0; r < kc.n; ++r) {
                    const std::vector<float> alone = kc.only_row(r).run(kernel);
                    for (uint32_t h = 0; h < kc.nh; ++h)
                        ASSERT_EQ(0, std::memcmp(&all[(h * kc.n + r) * per], &alone[h * per], per * sizeof(float)))
                            << name << (group ? ", group path" : ", direct path") << ", row " << r << ", head " << h
                            << ": " << what;
                }
                if (group) results.push_back(all);
            }
        if (avx512) {
            ASSERT_TRUE(bitwise_equal(results[2], results[1])) << "AVX-512 and AVX2 differ: " << what;
        }
        // against the softmax over the visible keys (double), per row: m is their maximum, o / l their average
        const std::vector<float>& got = results.size() > 1 ? results[1] : results[0];
        for (uint32_t h = 0; h < kc.nh; ++h)
            for (int r = 0; r < kc.n; ++r) {
                const RowTile& t = kc.tiles[h];
                std::vector<double> sc;
                std::vector<uint32_t> keys;
                for (uint32_t j = kc.k0; j < kc.k0 + opt::kSplitKeys; ++j)
                    if (j < t.limit[r] && (j >= t.from[r] || j < t.sinks)) keys.push_back(j);
                const float* st = &got[(h * kc.n + r) * (2 + kc.head_dim)];
                if (keys.empty()) {
                    EXPECT_EQ(st[0], -INFINITY) << what;
                    EXPECT_EQ(st[1], 0.0f) << what;
                    continue;
                }
                const uint32_t head = kc.layout.n_kv_heads - kc.nh + h;
                double m = -INFINITY;
                for (uint32_t j : keys) {
                    const uint8_t* kp = kvc_kv_address(&kc.layout, kc.table.data(), j, KVC_PLANE_K, head, 0);
                    double dot = 0;
                    for (uint32_t i = 0; i < kc.head_dim; ++i)
                        dot += double(t.q[r][i]) * opt::load_elem(kp + i * kc.layout.elem_bytes, kc.dtype);
                    sc.push_back(dot / std::sqrt(double(kc.head_dim)));
                    m = std::max(m, sc.back());
                }
                double l = 0;
                std::vector<double> o(kc.head_dim, 0.0);
                for (size_t i = 0; i < keys.size(); ++i) {
                    const double p = std::exp(sc[i] - m);
                    l += p;
                    const uint8_t* vp = kvc_kv_address(&kc.layout, kc.table.data(), keys[i], KVC_PLANE_V, head, 0);
                    for (uint32_t x = 0; x < kc.head_dim; ++x)
                        o[x] += p * opt::load_elem(vp + x * kc.layout.elem_bytes, kc.dtype);
                }
                ASSERT_NEAR(st[0], m, 1e-3 * (1 + std::abs(m))) << "row " << r << ": " << what;
                for (uint32_t x = 0; x < kc.head_dim; ++x) {
                    const double want = o[x] / l, have = double(st[2 + x]) / st[1] * std::exp(double(st[0]) - m);
                    ASSERT_NEAR(have, want, 1e-3 * (1 + std::abs(want))) << "row " << r << ", dim " << x << ": " << what;
                }
            }
    }
    EXPECT_GT(cases_split_by_gap, 20) << "the random shapes must exercise sinks apart from the windows";
}

} // namespace
} // namespace kvc::test
