// What a wrong stored row is consistent with, and the reason CACHE-CONTENT gives for it: keys within the bound of a
// 16-bit RoPE stage the pipeline does not declare, keys rotated over the whole head where a RoPE range is declared,
// and V rows of a latent shape read with K's row stride. The cache model's stored-row check (cache_model.cpp) asks
// these once it has found a wrong element, so that a report names the likely cause rather than a bare mismatch.
#include "stored_keys.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/reference/dtype.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace kvc::prop {

// The narrowest 16-bit RoPE stage within whose bound every wrong key of a call lies (f16, then bf16), in words, or
// "" when none holds them all. Real kernels keep cos/sin tables in 16 bits; an implementation that declares an f32
// rotation but computes one of these is told what to declare rather than suspected of a storage error. Only for an
// f32 cache: in a 16-bit cache a 16-bit rotation's error is a few of the stored dtype's units and cannot be told
// from a wrong rounding of the stored value (a cache that truncates f16 keys fits an f16 or a bf16 stage's bound).
// k_in: the call's keys as appended [n][Hkv*d]; pos0: the position of its first row; wrong: element indices.
std::string rope_stage_fitting(const CaseConfig& cfg, const float* k_in, uint32_t pos0, const uint8_t* got_k,
                               const StoredRows& want, const std::vector<size_t>& wrong) {
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim, es = dtype_size(cfg.cache_dtype);
    for (const uint32_t stage : {KVC_ROUND_F16, KVC_ROUND_BF16}) {
        if (cfg.cache_dtype != KVC_DTYPE_F32) break;
        const bool all = std::all_of(wrong.begin(), wrong.end(), [&](size_t e) {
            const size_t i = e / row;
            const KeyInterval iv = rotated_key_interval(cfg, stage, k_in + i * row, pos0 + static_cast<uint32_t>(i),
                                                        static_cast<uint32_t>(e % row), want.rotated[e]);
            const float got = ref::load_dtype(got_k + e * es, cfg.cache_dtype);
            return ref::round_to_dtype(iv.lo, cfg.cache_dtype) <= got && got <= ref::round_to_dtype(iv.hi, cfg.cache_dtype);
        });
        if (all)
            return std::string("a RoPE stage in ") + (stage == KVC_ROUND_F16 ? "f16" : "bf16") +
                   " (cos and sin, or the rotation's products, rounded to it): declare that stage in the pipeline "
                   "if it is what the implementation computes";
    }
    return "";
}

// Whether every wrong key of a call is what a rotation over the whole head gives (each within what an f32 rotation
// may differ from it) while the case declares RoPE on a range of the dims: the range ignored. "" otherwise.
std::string rope_over_all_dims(const CaseConfig& cfg, const float* k_in, uint32_t pos0, const uint8_t* got_k,
                               const std::vector<size_t>& wrong) {
    if (cfg.rope == KVC_ROPE_NONE || cfg.rope_dims == 0 || cfg.rope_dims == cfg.head_dim) return "";
    CaseConfig whole = cfg;
    whole.rope_dim_begin = whole.rope_dims = 0;
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim, es = dtype_size(cfg.cache_dtype);
    std::vector<float> rotated(row);
    const bool all = std::all_of(wrong.begin(), wrong.end(), [&](size_t e) {
        const size_t i = e / row;
        const uint32_t pos = pos0 + static_cast<uint32_t>(i);
        expected_rotated_key(whole, k_in + i * row, pos, rotated.data());
        const float got = ref::load_dtype(got_k + e * es, cfg.cache_dtype);
        return stored_key_acceptable(whole, KVC_ROUND_F32, k_in + i * row, pos, static_cast<uint32_t>(e % row),
                                     rotated[e % row], got);
    });
    if (!all) return "";
    return "a RoPE over all " + std::to_string(cfg.head_dim) + " dims of the head: RoPE over all dims when a range is "
           "declared (rope_dim_begin " + std::to_string(cfg.rope_dim_begin) + ", rope_dims " +
           std::to_string(cfg.rope_dims) + ": only dims [" + std::to_string(cfg.rope_dim_begin) + ", " +
           std::to_string(cfg.rope_dim_begin + cfg.rope_dims) + ") rotate)";
}

// Whether every V element a call stored is the call's v read with K's row stride (head_dim elements a KV head where
// the ABI lays v out in head_dim_v), counted modulo the call's v: the V head dim taken from K's. "" otherwise.
std::string v_with_k_stride(const CaseConfig& cfg, uint32_t n, const float* v_in, const uint8_t* got_v) {
    if (cfg.dv() == cfg.head_dim) return "";
    const size_t heads = static_cast<size_t>(n) * cfg.n_kv_heads, dv = cfg.dv(), total = heads * dv;
    const size_t es = dtype_size(cfg.cache_dtype);
    for (size_t hr = 0; hr < heads; ++hr)
        for (size_t x = 0; x < dv; ++x) {
            const float want = ref::round_to_dtype(v_in[(hr * cfg.head_dim + x) % total], cfg.cache_dtype);
            const float got = ref::load_dtype(got_v + (hr * dv + x) * es, cfg.cache_dtype);
            if (std::memcmp(&want, &got, sizeof want) != 0) return "";
        }
    return "the appended v read with K's row stride (" + std::to_string(cfg.head_dim) + " values a KV head, not " +
           "head_dim_v " + std::to_string(dv) + "): the V head dim taken from K's";
}

std::string stored_row_reason(const CaseConfig& cfg, const char* source, const Mismatch& m) {
    return std::string(source) + " " + m.what + " differs from the appended value rounded to " +
           dtype_name(cfg.cache_dtype) +
           (cfg.rope != KVC_ROPE_NONE && m.what == "k"
                ? " and rotated (not the rounding of an f32 rotation, nor within the bound of the declared RoPE stage)"
                : " (bitwise)");
}

} // namespace kvc::prop
