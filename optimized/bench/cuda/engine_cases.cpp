// Decode and prefill of the CUDA engine through the ABI (engine_cases.hpp).
#include "engine_cases.hpp"

#include "kvcheck/abi.hpp"
#include "kvcheck/optimized/cuda_engine.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

namespace kvc::gpubench {
namespace {

double wall_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::size_t bf16_row_bytes(uint32_t n_kv_heads, uint32_t head_dim) { return 2u * n_kv_heads * head_dim * 2u; }

// "" when the engine declares everything the shape needs, else what it lacks.
std::string unsupported(const kvc_caps& caps, uint32_t hq, uint32_t hkv, uint32_t d, uint32_t seqs,
                        uint32_t max_tokens, bool chunked) {
    auto over = [](uint32_t limit, uint32_t v) { return limit != 0 && v > limit; };
    if (!(caps.dtypes & (1u << KVC_DTYPE_BF16))) return "the engine does not declare a bf16 cache";
    if (hq != hkv && !(caps.features & KVC_FEATURE_GQA)) return "the engine does not declare gqa";
    if (chunked && !(caps.features & KVC_FEATURE_CHUNKED)) return "the engine does not declare chunked appends";
    if (over(caps.max_q_heads, hq) || over(caps.max_kv_heads, hkv) || over(caps.max_head_dim, d) ||
        over(caps.max_seqs, seqs) || over(caps.max_tokens, max_tokens))
        return "the shape exceeds the engine's declared limits";
    return "";
}

// One cache of a decode shape, filled, and its decode step.
class DecodeCache {
public:
    DecodeCache(const kvc_plugin_api* api, const DecodeShape& s, int extra_steps)
        : s_(s),
          cache_(api, make_config(1, s.n_q_heads, s.n_kv_heads, s.head_dim, KVC_DTYPE_BF16, s.seqs,
                                  s.tokens + static_cast<uint32_t>(extra_steps) + 1, KVC_ROPE_NONE, s.block)),
          q_(std::size_t(s.seqs) * s.n_q_heads * s.head_dim, 21),
          k_(std::size_t(s.seqs) * s.n_kv_heads * s.head_dim, 22),
          v_(std::size_t(s.seqs) * s.n_kv_heads * s.head_dim, 23),
          out_(std::size_t(s.seqs) * s.n_q_heads * s.head_dim, 24), ids_(s.seqs), offsets_(s.seqs + 1) {
        std::iota(ids_.begin(), ids_.end(), 0u);
        std::iota(offsets_.begin(), offsets_.end(), 0u);
        batched_ = (query_caps(api).features & KVC_FEATURE_BATCH) && KVC_API_HAS(api, append_attend_batch);
    }

    // Appends s.tokens tokens to every sequence, in `order` (FillOrder); returns wall seconds.
    double fill(FillOrder order, uint32_t chunk_tokens) {
        const uint32_t chunk = order == FillOrder::Shuffled ? s_.block : std::min(chunk_tokens, s_.tokens);
        PinnedFloats q(std::size_t(chunk) * s_.n_q_heads * s_.head_dim, 31),
            k(std::size_t(chunk) * s_.n_kv_heads * s_.head_dim, 32),
            v(std::size_t(chunk) * s_.n_kv_heads * s_.head_dim, 33), out(q.count(), 34);
        std::vector<uint32_t> plan; // one entry per call: the sequence it appends `chunk` tokens to
        for (uint32_t seq = 0; seq < s_.seqs; ++seq)
            for (uint32_t t = 0; t < s_.tokens; t += chunk) plan.push_back(seq);
        if (order == FillOrder::Shuffled) std::shuffle(plan.begin(), plan.end(), std::mt19937_64(20261130));
        std::vector<uint32_t> filled(s_.seqs, 0);
        const double t0 = wall_s();
        for (uint32_t seq : plan) {
            const uint32_t n = std::min(chunk, s_.tokens - filled[seq]);
            cache_.append_attend(seq, 0, n, q.get(), k.get(), v.get(), out.get());
            filled[seq] += n;
        }
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after fill");
        length_ = s_.tokens;
        return wall_s() - t0;
    }

    // Every sequence decodes one token.
    void step() {
        const std::size_t qrow = std::size_t(s_.n_q_heads) * s_.head_dim, krow = std::size_t(s_.n_kv_heads) * s_.head_dim;
        if (batched_) {
            kvc_batch b{};
            b.struct_size = sizeof b;
            b.n_seqs = s_.seqs;
            b.seq_ids = ids_.data();
            b.token_offsets = offsets_.data();
            b.q = q_.get();
            b.k = k_.get();
            b.v = v_.get();
            b.out = out_.get();
            cache_.append_attend_batch(0, b);
        } else {
            for (uint32_t seq = 0; seq < s_.seqs; ++seq)
                cache_.append_attend(seq, 0, 1, q_.get() + seq * qrow, k_.get() + seq * krow, v_.get() + seq * krow,
                                     out_.get() + seq * qrow);
        }
        ++length_;
    }

    bool batched() const { return batched_; }
    uint32_t block_size() { return cache_.memory().block_size; }
    std::size_t step_in_bytes() const { return (q_.count() + k_.count() + v_.count()) * sizeof(float); }
    std::size_t step_out_bytes() const { return out_.count() * sizeof(float); }

private:
    DecodeShape s_;
    Cache cache_;
    PinnedFloats q_, k_, v_, out_;
    std::vector<uint32_t> ids_, offsets_;
    bool batched_ = false;
    uint32_t length_ = 0;
};

// K/V bytes the timed steps read on average: step i (after `warmup` untimed steps) reads tokens + warmup + i + 1
// rows of every sequence.
double mean_step_bytes(const DecodeShape& s, int warmup, int repeats) {
    const double rows = s.tokens + warmup + (repeats - 1) / 2.0 + 1.0;
    return rows * s.seqs * static_cast<double>(bf16_row_bytes(s.n_kv_heads, s.head_dim));
}

void finish(DecodeResult& r, DecodeCache& c, const DecodeShape& s, int warmup, int repeats) {
    r.kv_bytes = mean_step_bytes(s, warmup, repeats);
    r.bytes_per_s = r.kv_bytes / (r.step.median_ms * 1e-3);
    r.host_io_ms = host_to_device_ms(c.step_in_bytes(), 2, 9).median_ms + device_to_host_ms(c.step_out_bytes(), 2, 9).median_ms;
    const double device_ms = r.step.median_ms - r.host_io_ms;
    r.device_bytes_per_s = device_ms > 0 ? r.kv_bytes / (device_ms * 1e-3) : 0;
    r.batched = c.batched();
    r.block_size = c.block_size();
    r.ran = true;
}

constexpr uint32_t kFillChunk = 1024; // tokens per append while filling contiguously (bounded host buffers)

} // namespace

const kvc_plugin_api* cuda_engine(std::string& why) {
    const kvc_plugin_api* api = kvc_cuda_engine_entry(KVC_ABI_VERSION_MAJOR, KVC_ABI_VERSION_MINOR);
    if (!api) why = "kvc_cuda_engine_entry returned NULL (ABI version mismatch)";
    return api;
}

DecodeResult decode(const kvc_plugin_api* api, const DecodeShape& s, int warmup, int repeats) {
    DecodeResult r;
    r.shape = s.name;
    r.order = "contiguous";
    r.why_not = unsupported(query_caps(api), s.n_q_heads, s.n_kv_heads, s.head_dim, s.seqs,
                            s.tokens + warmup + repeats + 1, s.tokens > kFillChunk);
    if (!r.why_not.empty()) return r;
    try {
        DecodeCache c(api, s, warmup + repeats);
        r.fill_s = c.fill(FillOrder::Contiguous, kFillChunk);
        r.step = time_ms([&] { c.step(); }, warmup, repeats);
        finish(r, c, s, warmup, repeats);
    } catch (const std::exception& e) {
        r.why_not = e.what();
    }
    return r;
}

std::pair<DecodeResult, DecodeResult> decode_contiguous_vs_shuffled(const kvc_plugin_api* api, const DecodeShape& s,
                                                                    int warmup, int repeats) {
    DecodeResult a, b;
    a.shape = b.shape = s.name;
    a.order = "contiguous";
    b.order = "shuffled";
    a.why_not = unsupported(query_caps(api), s.n_q_heads, s.n_kv_heads, s.head_dim, s.seqs,
                            s.tokens + warmup + repeats + 1, true);
    if (!a.why_not.empty()) {
        b.why_not = a.why_not;
        return {a, b};
    }
    try {
        DecodeCache ca(api, s, warmup + repeats), cb(api, s, warmup + repeats);
        a.fill_s = ca.fill(FillOrder::Contiguous, kFillChunk);
        b.fill_s = cb.fill(FillOrder::Shuffled, kFillChunk);
        std::tie(a.step, b.step) = time_pair_ms([&] { ca.step(); }, [&] { cb.step(); }, warmup, repeats);
        finish(a, ca, s, warmup, repeats);
        finish(b, cb, s, warmup, repeats);
    } catch (const std::exception& e) {
        a.why_not = b.why_not = e.what();
        a.ran = b.ran = false;
    }
    return {a, b};
}

PrefillResult prefill(const kvc_plugin_api* api, uint32_t tokens, uint32_t hq, uint32_t hkv, uint32_t d, int warmup,
                      int repeats) {
    PrefillResult r;
    r.tokens = tokens;
    r.n_q_heads = hq;
    r.n_kv_heads = hkv;
    r.head_dim = d;
    r.flops = 4.0 * d * hq * (static_cast<double>(tokens) * (tokens + 1) / 2.0);
    r.why_not = unsupported(query_caps(api), hq, hkv, d, 1, tokens, false);
    if (!r.why_not.empty()) return r;
    try {
        const kvc_config cfg = make_config(1, hq, hkv, d, KVC_DTYPE_BF16, 1, tokens, KVC_ROPE_NONE, 16);
        const bool can_release = (query_caps(api).features & KVC_FEATURE_RELEASE) && KVC_API_HAS(api, release);
        PinnedFloats q(std::size_t(tokens) * hq * d, 41), k(std::size_t(tokens) * hkv * d, 42),
            v(std::size_t(tokens) * hkv * d, 43), out(q.count(), 44);
        std::unique_ptr<Cache> cache;
        bool started = false;
        // Untimed, before every call: an empty sequence (release it, or a new cache when release is not declared).
        auto reset = [&] {
            if (cache && started && can_release) {
                cache->release(0);
            } else {
                cache.reset();
                cache = std::make_unique<Cache>(api, cfg);
            }
            started = false;
        };
        r.call = time_ms(
            [&] {
                cache->append_attend(0, 0, tokens, q.get(), k.get(), v.get(), out.get());
                started = true;
            },
            warmup, repeats, reset);
        r.tflops = r.flops / (r.call.median_ms * 1e-3) / 1e12;
        r.host_io_ms = host_to_device_ms((q.count() + k.count() + v.count()) * sizeof(float), 1, 5).median_ms +
                       device_to_host_ms(out.count() * sizeof(float), 1, 5).median_ms;
        const double device_ms = r.call.median_ms - r.host_io_ms;
        r.device_tflops = device_ms > 0 ? r.flops / (device_ms * 1e-3) / 1e12 : 0;
        r.ran = true;
    } catch (const std::exception& e) {
        r.why_not = e.what();
    }
    return r;
}

} // namespace kvc::gpubench
