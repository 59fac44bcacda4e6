#include "kvcheck/properties/output_grade.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/properties/oracle.hpp"
#include "kvcheck/properties/quant_rows.hpp"
#include "kvcheck/reference/quantize.hpp"

#include <algorithm>
#include <stdexcept>

namespace kvc::prop {

namespace {

// The rows the graded queries attend with the call's new rows as given (rotated by the oracle, unrounded): what a
// pipeline that declares new_rows_unrounded computes with, and the hypothesis the diagnosis of a failure tries.
Expected expected_with_unrounded_new_rows(const CacheModel& model, const CacheModel::Stream& s, uint32_t layer,
                                          const GradedRows& rows) {
    const CaseConfig& cfg = model.config();
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
    const size_t vrow = static_cast<size_t>(cfg.n_kv_heads) * cfg.dv();
    const uint32_t n_unrounded = rows.history - rows.call_begin;
    std::vector<float> k(s.k_eff.begin(), s.k_eff.begin() + static_cast<std::ptrdiff_t>(rows.history * row));
    std::vector<float> v(s.v_eff.begin(), s.v_eff.begin() + static_cast<std::ptrdiff_t>(rows.history * vrow));
    const size_t first = static_cast<size_t>(rows.call_begin) * row;
    for (uint32_t i = 0; i < n_unrounded; ++i)
        expected_rotated_key(cfg, rows.call_k + i * row, rows.call_begin + i, k.data() + first + i * row);
    std::copy(rows.call_v, rows.call_v + n_unrounded * vrow,
              v.begin() + static_cast<std::ptrdiff_t>(rows.call_begin * vrow));
    return expect_outputs(cfg, rows.q, rows.n_rows, k, v, rows.history, HeadMap::Repeat, n_unrounded, layer);
}

} // namespace

Expected expected_outputs(const CacheModel& model, uint32_t seq, uint32_t layer, const GradedRows& rows,
                          HeadMap map) {
    const CacheModel::Stream& s = model.stream(seq, layer);
    return expect_outputs(model.config(), rows.q, rows.n_rows, s.k_eff, s.v_eff, rows.history, map, 0, layer);
}

std::vector<float> queries_as_rounded(const Pipeline& declared, const float* q, size_t n) {
    std::vector<float> r(q, q + n);
    if (declared.q == KVC_ROUND_Q8_0) { // whole blocks of 32 along each head: head_dim % 32 == 0 (head_dim_multiple)
        if (n % ref::QK8_0 != 0)
            throw std::invalid_argument("q8_0 query rounding needs whole blocks of 32 values per head");
        std::vector<ref::BlockQ8_0> blocks(n / ref::QK8_0);
        ref::quantize_row_q8_0(r.data(), static_cast<int>(n), blocks.data(), q8_0_rounding(declared.q8_0_rounding));
        ref::dequantize_row_q8_0(blocks.data(), static_cast<int>(n), r.data());
        return r;
    }
    if (declared.q != KVC_ROUND_FP8_E4M3 && declared.q != KVC_ROUND_FP8_E5M2) return r;
    const ref::Fp8 f = declared.q == KVC_ROUND_FP8_E5M2 ? ref::Fp8::E5M2 : ref::Fp8::E4M3FN;
    for (float& x : r) x = ref::decode_fp8(ref::encode_fp8(x, f), f); // unscaled, saturating: abi.h
    return r;
}

OutputVerdict grade_call_outputs(const CacheModel& model, uint32_t seq, uint32_t layer, const Pipeline& declared,
                                 const GradedRows& given, const std::optional<Mismatch>& storage_mismatch) {
    const CaseConfig& cfg = model.config();
    // a q declared quantized to fp8 or q8_0 is rounded here exactly, before RoPE, and graded with the rest of the
    // pipeline
    const std::vector<float> q =
        queries_as_rounded(declared, given.q, static_cast<size_t>(given.n_rows) * cfg.n_q_heads * cfg.head_dim);
    GradedRows rows = given;
    rows.q = q.data();
    const CacheModel::Stream& s = model.stream(seq, layer);
    const bool narrow_cache = cfg.cache_dtype != KVC_DTYPE_F32;
    // an implementation is graded for the pipeline it declares, new rows attended unrounded included
    const bool declared_unrounded = declared.new_rows_unrounded && narrow_cache;
    const Expected e = declared_unrounded ? expected_with_unrounded_new_rows(model, s, layer, rows)
                                          : expected_outputs(model, seq, layer, rows);
    const bool stored_right = !storage_mismatch; // else the storage, not a pipeline, is named
    OutputVerdict v;
    v.grade = grade_outputs(cfg, declared, rows.out, e, nullptr, stored_right);
    if (v.grade.pass) return v;
    if (narrow_cache && !declared_unrounded && !v.grade.nan) { // is it the new rows attended before rounding?
        const Expected alt = expected_with_unrounded_new_rows(model, s, layer, rows);
        const double headroom = v.grade.headroom;
        const bool fails_f32 = v.grade.fails_f32_class;
        v.grade = grade_outputs(cfg, declared, rows.out, e, &alt, stored_right);
        v.grade.headroom = headroom; // what the case reports is the first grading's
        v.grade.fails_f32_class = fails_f32;
    }
    v.where.what = "output";
    v.where.seq = static_cast<int>(seq);
    v.where.layer = static_cast<int>(layer);
    v.where.pos = static_cast<int>(rows.history - rows.n_rows + v.grade.worst.token);
    v.where.head = static_cast<int>(v.grade.worst.head);
    v.where.dim = static_cast<int>(v.grade.worst.dim);
    v.where.expected = v.grade.worst.expected;
    v.where.actual = v.grade.worst.actual;
    v.reason = v.grade.message;
    if (storage_mismatch) v.reason += storage_error_clause(cfg.cache_dtype, cfg.rope, *storage_mismatch);
    return v;
}

// What a windowed layer's failed outputs match instead, told at the first row that fails: a window one key too
// wide or too narrow, the window of the call's first row used for every row, or the sinks left out. Each is
// graded with the bound of the declared pipeline, as the outputs were.
std::string window_diagnosis(const CacheModel& model, uint32_t seq, uint32_t layer, const Pipeline& declared,
                             const GradedRows& rows) {
    const CaseConfig& cfg = model.config();
    const CacheModel::Stream& s = model.stream(seq, layer);
    if (cfg.window(layer) == 0) return "";
    const uint32_t W = cfg.window(layer), S = cfg.n_sinks;
    const size_t qrow = static_cast<size_t>(cfg.n_q_heads) * cfg.head_dim;
    const size_t orow = static_cast<size_t>(cfg.n_q_heads) * cfg.dv();
    const auto row_matches = [&](uint32_t i, uint32_t w, uint32_t sinks) {
        CaseConfig alt = cfg;
        alt.windows[layer] = w;
        alt.n_sinks = sinks;
        const uint32_t history = rows.history - rows.n_rows + i + 1;
        const Expected e = expect_outputs(alt, rows.q + i * qrow, 1, s.k_eff, s.v_eff, history, HeadMap::Repeat,
                                          0, layer);
        return grade_outputs(cfg, declared, rows.out + i * orow, e).pass;
    };
    for (uint32_t i = 0; i < rows.n_rows; ++i) {
        if (row_matches(i, W, S)) continue;
        const uint32_t P = rows.history - rows.n_rows + i, first = rows.call_begin;
        const std::string at = "query at position " + std::to_string(P);
        const std::string w = std::to_string(W);
        // the call's last row tells the first row's window apart from a window one key too wide
        const uint32_t last = rows.history - 1;
        if (last > first + 1 && row_matches(rows.n_rows - 1, W + (last - first), S) &&
            !row_matches(rows.n_rows - 1, W + 1, S))
            return "; the outputs match the window of the call's first row used for every row: query at position " +
                   std::to_string(last) + " attended keys from " +
                   std::to_string(first + 1 >= W ? first + 1 - W : 0) + " (those of position " +
                   std::to_string(first) + "); its own window of " + w + " starts at " +
                   std::to_string(last + 1 >= W ? last + 1 - W : 0);
        if (row_matches(i, W + 1, S))
            return "; the outputs match a window of " + std::to_string(W + 1) + " keys: " + at +
                   (P >= W && P - W >= S ? " attended key " + std::to_string(P - W) + ", outside its window of " + w
                                         : " (window " + w + ")");
        if (W > 1 && row_matches(i, W - 1, S))
            return "; the outputs match a window of " + std::to_string(W - 1) + " keys: " + at +
                   (P + 1 >= W && P + 1 - W >= S
                        ? " did not attend key " + std::to_string(P + 1 - W) + ", inside its window of " + w
                        : " (window " + w + ")");
        if (S > 0 && row_matches(i, W, 0))
            return "; the outputs match attention without the " + std::to_string(S) + " sinks: " + at +
                   " did not attend positions 0.." + std::to_string(S - 1) + ", which stay visible in a windowed "
                   "layer";
        // a window of no key at all: the softmax of an empty row, taken as zeros (a left window of W - 1 with W = 1)
        const float* o = rows.out + i * orow;
        if (std::all_of(o, o + orow, [](float x) { return x == 0.0f; })) {
            const std::string held = W == 1 ? std::string("its own key")
                                            : "keys " + std::to_string(P + 1 >= W ? P + 1 - W : 0) + ".." +
                                                  std::to_string(P);
            return "; the outputs of " + at + " are all zero, as if it attended no key: its window of " + w +
                   " holds " + held;
        }
        return "";
    }
    return "";
}

} // namespace kvc::prop
