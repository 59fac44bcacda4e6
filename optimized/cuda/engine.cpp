// The CUDA engine's host side: every input is checked here before anything changes; blocks, tables and reference
// counts live on the host; each call uploads what its kernels need (its streams' block tables, its rows, its work
// list) and runs append, attention and merge on the engine's own CUDA stream. docs/cuda-engine.md.
#include "engine.hpp"

#include "kernels.hpp"
#include "kvcheck/abi.hpp"
#include "kvcheck/optimized/quant_math.hpp"
#include "kvcheck/optimized/rope_math.hpp"
#include "kvcheck/optimized/window_rule.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>

namespace kvc::cuda {
namespace {

constexpr uint32_t kDefaultBlockSize = 16, kMaxBlockSize = 65536;
constexpr uint32_t kMaxCount = 1024; // layers, query heads, KV heads
constexpr uint64_t kFirstArenaBytes = 64 * 1024; // the first arena: 64 KiB of blocks, at most 256 blocks
constexpr uint64_t kAlign = 256;
constexpr uint32_t kDecodeMaxNew = 4; // a stream of at most this many new tokens is a decode: its segments spread out

uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the parts of one call's scratch.
struct Carve {
    uint64_t size = 0;
    uint64_t take(uint64_t bytes) {
        const uint64_t at = size;
        size = align_up(size + bytes);
        return at;
    }
};

} // namespace

namespace {
std::atomic<bool> g_probed{false};
}

bool probed_in_this_process() { return g_probed.load(); }

std::string unavailable_reason() {
    static const std::string reason = [] {
        g_probed = true;
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess)
            return std::string("no CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e) + " (" +
                   cudaGetErrorName(e) + ")";
        if (n == 0) return std::string("no CUDA device: cudaGetDeviceCount found none");
        const cudaError_t k = kernels_loadable();
        if (k != cudaSuccess)
            return std::string("CUDA device unusable by this build: ") + cudaGetErrorString(k) + " (" +
                   cudaGetErrorName(k) + "; kernels built for CMAKE_CUDA_ARCHITECTURES)";
        return std::string();
    }();
    return reason;
}

Engine::Scratch::~Scratch() {
    if (owned && base) cudaFree(base);
}

kvc_status Engine::fail(kvc_status status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(error_, sizeof error_, fmt, ap);
    va_end(ap);
    return status;
}

kvc_status Engine::cuda_fail(cudaError_t e, const char* op, const char* what) {
    return fail(e == cudaErrorMemoryAllocation ? KVC_ERR_OUT_OF_MEMORY : KVC_ERR_INTERNAL, "%s: %s: %s (%s)", op, what,
                cudaGetErrorString(e), cudaGetErrorName(e));
}

std::unique_ptr<Engine> Engine::create(const kvc_config& c, kvc_status* status, std::string* error) {
    auto refuse = [&](kvc_status s, const std::string& why) -> std::unique_ptr<Engine> {
        if (status) *status = s;
        if (error) *error = why;
        return nullptr;
    };
    // the CPU engine's checks (abi_checks.hpp, shared), the quantized dtypes', the windows' and the latent shapes'
    // included; before the device is asked for, so that a config is judged the same with or without one
    if (const opt::Refusal r = opt::check_config(c, kMaxHeadDim, kMaxCount, /*quantized=*/true, /*windows=*/true,
                                                 /*latent=*/true);
        r.refused())
        return refuse(r.status, r.message);
    if (const std::string why = unavailable_reason(); !why.empty()) return refuse(KVC_ERR_UNSUPPORTED, why);

    std::unique_ptr<Engine> e(new (std::nothrow) Engine());
    if (!e) return refuse(KVC_ERR_OUT_OF_MEMORY, "allocation failed");
    e->cfg_ = c;
    e->block_size_ = c.block_size_hint == 0 ? kDefaultBlockSize : std::min(c.block_size_hint, kMaxBlockSize);
    e->cfg_.block_size_hint = e->block_size_;
    e->elem_bytes_ = static_cast<uint32_t>(kvc::dtype_size(c.cache_dtype));
    e->group_ = c.n_q_heads / c.n_kv_heads;
    e->max_tokens_ = c.max_tokens == 0 ? UINT32_MAX : c.max_tokens;
    e->quantized_ = opt::math::is_quantized(c.cache_dtype);
    e->f16_scale_ = c.cache_dtype == KVC_DTYPE_INT8_TOKEN && c.int8_scale_dtype == KVC_DTYPE_F16;
    e->geometry_ = kvc_kv_layout_make_scaled(e->block_size_, c.n_kv_heads, c.head_dim, e->elem_bytes_,
                                             opt::math::row_scale_bytes(c.cache_dtype, c.head_dim, e->f16_scale_));
    e->head_dim_v_ = kvc::value_dim(c);
    e->geometry_v_ = kvc_kv_layout_make_v(&e->geometry_, e->head_dim_v_,
                                          opt::math::row_scale_bytes(c.cache_dtype, e->head_dim_v_, e->f16_scale_));
    e->block_bytes_ = kvc_kv_block_bytes_kv(&e->geometry_, &e->geometry_v_);
    if (opt::any_window(c)) { // sinks without a window have no effect (and are accepted: abi_checks.hpp)
        e->windows_.assign(c.windows, c.windows + c.n_layers);
        e->n_sinks_ = c.n_sinks;
        e->evict_ = c.evict != 0;
        e->sink_blocks_ = opt::sink_blocks(c.n_sinks, e->block_size_);
    }
    e->cfg_.windows = nullptr; // the harness's array: not kept past create
    e->rope_dims_ = c.rope_dims != 0 ? c.rope_dims : c.head_dim;
    if (opt::math::is_fp8(c.cache_dtype)) { // one scale per (layer, KV head), whatever the mode
        opt::expand_fp8_scales(c, e->k_scales_, e->v_scales_);
        e->cfg_.k_scales = e->cfg_.v_scales = nullptr; // the harness's arrays: not kept past create
    }
    auto cuda_refuse = [&](cudaError_t err, const char* what) {
        return refuse(err == cudaErrorMemoryAllocation ? KVC_ERR_OUT_OF_MEMORY : KVC_ERR_INTERNAL,
                      std::string(what) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
    };
    cudaError_t err = cudaGetDevice(&e->device_);
    if (err != cudaSuccess) return cuda_refuse(err, "cudaGetDevice");
    if ((err = prepare_attention()) != cudaSuccess) return cuda_refuse(err, "attention kernel shared memory");
    if ((err = cudaStreamCreateWithFlags(&e->stream_, cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_refuse(err, "cudaStreamCreate");
    if ((err = cudaMalloc(&e->workspace_, kWorkspaceBytes)) != cudaSuccess) return cuda_refuse(err, "workspace");
    if (c.rope != KVC_ROPE_NONE) {
        std::vector<double> f(e->rope_dims_ / 2); // the range turns as a head of rope_dims dims
        for (uint32_t j = 0; j < e->rope_dims_ / 2; ++j)
            f[j] = kvc::opt::math::rope_inv_freq(c.rope_theta, e->rope_dims_, j);
        if ((err = cudaMalloc(&e->inv_freq_, f.size() * sizeof(double))) != cudaSuccess)
            return cuda_refuse(err, "RoPE frequencies");
        if ((err = cudaMemcpy(e->inv_freq_, f.data(), f.size() * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess)
            return cuda_refuse(err, "RoPE frequencies");
    }
    if (!e->k_scales_.empty()) {
        const uint64_t n = e->k_scales_.size();
        if ((err = cudaMalloc(&e->fp8_scales_, 2 * n * sizeof(float))) != cudaSuccess)
            return cuda_refuse(err, "fp8 scales");
        if ((err = cudaMemcpy(e->fp8_scales_, e->k_scales_.data(), n * sizeof(float), cudaMemcpyHostToDevice)) !=
                cudaSuccess ||
            (err = cudaMemcpy(e->fp8_scales_ + n, e->v_scales_.data(), n * sizeof(float), cudaMemcpyHostToDevice)) !=
                cudaSuccess)
            return cuda_refuse(err, "fp8 scales");
    }
    if (status) *status = KVC_OK;
    return e;
}

Engine::~Engine() {
    if (stream_) cudaStreamSynchronize(stream_);
    cudaFree(arena_);
    cudaFree(workspace_);
    cudaFree(inv_freq_);
    cudaFree(fp8_scales_);
    if (stream_) cudaStreamDestroy(stream_);
}

const Engine::Stream* Engine::find(uint32_t seq, uint32_t layer) const {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? nullptr : &it->second.layers[layer];
}

opt::CacheView Engine::view() const {
    return opt::CacheView{&cfg_, max_tokens_,
                          [this](uint32_t seq, uint32_t layer) -> uint64_t {
                              const Stream* s = find(seq, layer);
                              return s ? s->length : 0;
                          },
                          [this](uint32_t seq) { return seqs_.count(seq) != 0; }};
}

uint64_t Engine::blocks_needed(const Stream& s, uint32_t n) const {
    const uint64_t have = s.blocks.size(), need = (static_cast<uint64_t>(s.length) + n + block_size_ - 1) / block_size_;
    const bool shared_partial = s.length % block_size_ != 0 && refcount_[s.blocks.back()] > 1;
    return need - have + (shared_partial && n > 0 ? 1 : 0);
}

// The arena holds its blocks, then the array of their addresses, which starts on 16 bytes: blocks * bb alone need
// not be a multiple of 8 (an odd head_dim without RoPE), and a misaligned pointer load is a device fault.
static uint64_t address_array_at(uint64_t blocks, uint64_t block_bytes) {
    return (blocks * block_bytes + 15) / 16 * 16;
}

// What the kernels read of this engine: the layouts with the device's block addresses, and the config. Rows start
// at arena_ + id * block_bytes + (a multiple of K's row_bytes, or K's plane plus a multiple of V's): every row starts
// on 16 bytes when arena_ (cudaMalloc aligns to 256) and both row sizes do, and the kernels may then read 16-byte
// pieces. An int8 or q8_0 row ends in its scales, so it is never read in 16-byte pieces of codes.
Geometry Engine::device_geometry(uint32_t layer) const {
    kvc_kv_layout l = geometry_, lv = geometry_v_;
    l.block_base = lv.block_base =
        reinterpret_cast<uint8_t* const*>(arena_ + address_array_at(arena_blocks_, block_bytes_));
    const bool wide = geometry_.row_bytes % 16 == 0 && geometry_v_.row_bytes % 16 == 0 &&
                      geometry_.scale_bytes == 0 && reinterpret_cast<uintptr_t>(arena_) % 16 == 0;
    const uint64_t fp8_at = static_cast<uint64_t>(layer) * cfg_.n_kv_heads, fp8_n = k_scales_.size();
    Geometry g{};
    g.layout = l;
    g.layout_v = lv;
    g.dtype = cfg_.cache_dtype;
    g.rope = cfg_.rope;
    g.n_q_heads = cfg_.n_q_heads;
    g.n_kv_heads = cfg_.n_kv_heads;
    g.head_dim = cfg_.head_dim;
    g.head_dim_v = head_dim_v_;
    g.group = group_;
    g.scale = cfg_.scale;
    g.inv_freq = inv_freq_;
    g.rope_begin = cfg_.rope_dim_begin;
    g.rope_dims = rope_dims_;
    g.window = window_of(layer);
    g.n_sinks = n_sinks_;
    g.wide_rows = wide ? 1u : 0u;
    g.f16_scale = f16_scale_ ? 1u : 0u;
    g.k_scales = fp8_scales_ ? fp8_scales_ + fp8_at : nullptr;
    g.v_scales = fp8_scales_ ? fp8_scales_ + fp8_n + fp8_at : nullptr;
    return g;
}

// Grows the arena to hold n more blocks than are in use: a new arena (double, or what is needed), the old blocks
// copied into it at the same ids, the address array rebuilt. Ids never change, so tables stay valid.
bool Engine::reserve_blocks(uint64_t n) {
    if (free_.size() >= n) return true;
    const uint64_t bb = block_bytes_;
    uint64_t want = std::max<uint64_t>(arena_blocks_ * 2, in_use_ + n);
    if (arena_blocks_ == 0) want = std::max<uint64_t>(want, std::min<uint64_t>(256, std::max<uint64_t>(1, kFirstArenaBytes / bb)));
    if (want > UINT32_MAX) want = UINT32_MAX;
    if (want < in_use_ + n) return false;
    const uint64_t bytes = address_array_at(want, bb) + want * sizeof(uint8_t*);
    uint8_t* fresh = nullptr;
    if (cudaMalloc(&fresh, bytes) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky-free allocation error
        return false;
    }
    std::vector<uint8_t*> bases(want);
    for (uint64_t b = 0; b < want; ++b) bases[b] = fresh + b * bb;
    if ((arena_ && cudaMemcpyAsync(fresh, arena_, arena_blocks_ * bb, cudaMemcpyDeviceToDevice, stream_) != cudaSuccess) ||
        cudaMemcpyAsync(fresh + address_array_at(want, bb), bases.data(), want * sizeof(uint8_t*),
                        cudaMemcpyHostToDevice, stream_) !=
            cudaSuccess ||
        cudaStreamSynchronize(stream_) != cudaSuccess) {
        cudaFree(fresh);
        return false;
    }
    cudaFree(arena_);
    for (uint64_t b = arena_blocks_; b < want; ++b) free_.insert(static_cast<uint32_t>(b));
    refcount_.resize(want, 0);
    arena_ = fresh;
    arena_blocks_ = want;
    arena_bytes_ = bytes;
    return true;
}

uint32_t Engine::take_block() {
    const uint32_t id = *free_.begin();
    free_.erase(free_.begin());
    refcount_[id] = 1;
    ++in_use_;
    return id;
}

void Engine::drop_block(uint32_t id) {
    if (--refcount_[id] == 0) {
        free_.insert(id);
        --in_use_;
    }
}

void Engine::evict_dead(Stream& s, uint32_t layer) {
    if (!evict_) return;
    // shared after fork: only this table's reference goes
    opt::evict_dead_blocks(s.blocks.data(), &s.dropped, s.length, window_of(layer), block_size_, sink_blocks_,
                           [this](uint32_t id) { drop_block(id); });
}

kvc_status Engine::check_evicted(const char* op, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n) {
    const Stream* s = find(seq, layer);
    if (s == nullptr || !opt::range_holds_dropped(pos, n, block_size_, sink_blocks_, s->dropped)) return KVC_OK;
    const uint64_t from = uint64_t{sink_blocks_} * block_size_, to = from + uint64_t{s->dropped} * block_size_;
    return fail(KVC_ERR_EVICTED,
                "%s: rows %llu..%llu of sequence %u layer %u include evicted rows (%llu..%llu were dropped: no query "
                "of window %u can see them again)",
                op, static_cast<unsigned long long>(pos), static_cast<unsigned long long>(pos) + n - 1, seq, layer,
                static_cast<unsigned long long>(from), static_cast<unsigned long long>(to - 1), window_of(layer));
}

kvc_status Engine::get_scratch(uint64_t bytes, Scratch& s, const char* op) {
    if (bytes <= kWorkspaceBytes) {
        s.base = workspace_;
        return KVC_OK;
    }
    if (const cudaError_t e = cudaMalloc(&s.base, bytes); e != cudaSuccess) {
        cudaGetLastError();
        s.base = nullptr;
        return fail(KVC_ERR_OUT_OF_MEMORY, "%s: %llu bytes of device scratch refused: %s", op,
                    static_cast<unsigned long long>(bytes), cudaGetErrorString(e));
    }
    s.owned = true;
    return KVC_OK;
}

kvc_status Engine::append_attend_batch(uint32_t layer, uint32_t n_seqs, const uint32_t* seq_ids,
                                       const uint32_t* offsets, const float* q, const float* k, const float* v,
                                       float* out) {
    const char* op = "append_attend";
    // phase 1: check everything before anything changes
    uint64_t total = 0;
    if (const opt::Refusal r = opt::check_streams(op, layer, n_seqs, seq_ids, offsets, view(), &total); r.refused())
        return fail(r);
    if (total == 0) return KVC_OK;
    if (q == nullptr || k == nullptr || v == nullptr || out == nullptr)
        return fail(KVC_ERR_INVALID_ARGUMENT, "%s: q, k, v and out must not be NULL when tokens are appended", op);
    // int8 and q8_0 store finite rows only (and an f16 int8 scale must not overflow): refused before any change
    if (quantized_)
        for (uint64_t t = 0; t < total; ++t)
            for (uint32_t h = 0; h < cfg_.n_kv_heads; ++h)
                for (int plane = 0; plane < 2; ++plane) {
                    const uint32_t dim = plane == 0 ? cfg_.head_dim : head_dim_v_;
                    const float* row = (plane == 0 ? k : v) + ((offsets[0] + t) * cfg_.n_kv_heads + h) * uint64_t{dim};
                    if (const int why = opt::math::unquantizable(row, cfg_.cache_dtype, dim, f16_scale_))
                        return fail(KVC_ERR_INVALID_ARGUMENT, "%s: the %s row of token %llu, KV head %u, has %s", op,
                                    plane == 0 ? "K" : "V", static_cast<unsigned long long>(t), h,
                                    why == 1 ? "a non-finite value (int8 and q8_0 store finite values only)"
                                             : "its int8 scale absmax / 127 overflows f16");
                }
    if (cudaSetDevice(device_) != cudaSuccess) return fail(KVC_ERR_INTERNAL, "%s: cudaSetDevice failed", op);

    // phase 2: blocks and scratch (may fail; nothing visible has changed yet)
    uint64_t blocks = 0;
    for (uint32_t i = 0; i < n_seqs; ++i) {
        const uint32_t n = offsets[i + 1] - offsets[i];
        if (const Stream* s = find(seq_ids[i], layer)) blocks += blocks_needed(*s, n);
        else blocks += (static_cast<uint64_t>(n) + block_size_ - 1) / block_size_;
    }
    if (!reserve_blocks(blocks))
        return fail(KVC_ERR_OUT_OF_MEMORY, "%s: out of device memory for blocks (%llu more needed, %llu in use)", op,
                    static_cast<unsigned long long>(blocks), static_cast<unsigned long long>(in_use_));

    // the plan: one CallDesc per stream with new tokens, its work items (tiles of rows per KV head)
    const uint32_t d = cfg_.head_dim, dv = head_dim_v_, tile = tile_rows(d, dv), window = window_of(layer);
    std::vector<CallDesc> calls;
    std::vector<uint32_t> call_seq; // index into seq_ids
    uint64_t table_entries = 0;
    for (uint32_t i = 0; i < n_seqs; ++i) {
        const uint32_t n = offsets[i + 1] - offsets[i];
        if (n == 0) continue;
        const Stream* s = find(seq_ids[i], layer);
        CallDesc c{};
        c.len_before = s ? s->length : 0;
        c.n_new = n;
        c.token_base = offsets[i] - offsets[0];
        c.table_offset = table_entries;
        table_entries += (static_cast<uint64_t>(c.len_before) + n + block_size_ - 1) / block_size_;
        calls.push_back(c);
        call_seq.push_back(i);
    }
    std::vector<WorkItem> items;
    std::vector<MergeItem> merges;
    uint64_t partials = 0;
    uint32_t rows_cap = 0; // the most rows of any item: the attention kernel's shared memory is sized for it
    std::vector<uint32_t> seen; // the segments some row of a tile sees: with a window, the sinks' and the windows'
    for (uint32_t ci = 0; ci < calls.size(); ++ci) {
        const CallDesc& c = calls[ci];
        const uint32_t rows = c.n_new * group_;
        for (uint32_t row0 = 0; row0 < rows; row0 += tile) {
            const uint32_t nr = std::min(tile, rows - row0);
            rows_cap = std::max(rows_cap, nr);
            segments_seen(c.len_before, row0, nr, group_, window, n_sinks_, seen);
            for (uint32_t h = 0; h < cfg_.n_kv_heads; ++h) {
                if (c.n_new <= kDecodeMaxNew && seen.size() > 1) { // spread the segments over CUDA blocks, merge after
                    const uint32_t n = static_cast<uint32_t>(seen.size());
                    merges.push_back(MergeItem{ci, h, row0, nr, static_cast<uint32_t>(partials), n});
                    for (uint32_t i = 0; i < n; ++i)
                        items.push_back(WorkItem{ci, h, row0, nr, seen[i], seen[i] + 1, 0,
                                                 static_cast<uint32_t>(partials + static_cast<uint64_t>(i) * nr)});
                    partials += static_cast<uint64_t>(n) * nr;
                } else { // the kernel skips the splits no row sees
                    items.push_back(WorkItem{ci, h, row0, nr, seen.front(), seen.back() + 1, 1, 0});
                }
            }
        }
    }
    if (partials > UINT32_MAX) return fail(KVC_ERR_UNSUPPORTED, "%s: too many partial states in one call", op);
    // the biggest items first: under the causal mask the last tiles of a prefill see the most keys
    std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) {
        return a.seg_end - a.seg_begin > b.seg_end - b.seg_begin;
    });

    Carve cv;
    const uint64_t kv_elems = total * cfg_.n_kv_heads * d, v_elems = total * cfg_.n_kv_heads * dv;
    const uint64_t q_elems = total * cfg_.n_q_heads * d, out_elems = total * cfg_.n_q_heads * dv;
    const uint64_t at_calls = cv.take(calls.size() * sizeof(CallDesc));
    const uint64_t at_token = cv.take(total * sizeof(uint32_t));
    const uint64_t at_tables = cv.take(table_entries * sizeof(uint32_t));
    const uint64_t at_items = cv.take(items.size() * sizeof(WorkItem));
    const uint64_t at_merges = cv.take(merges.size() * sizeof(MergeItem));
    const uint64_t meta_bytes = cv.size; // the above go up in one copy
    const uint64_t at_k = cv.take(kv_elems * sizeof(float));
    const uint64_t at_v = cv.take(v_elems * sizeof(float));
    const uint64_t at_q = cv.take(q_elems * sizeof(float));
    const uint64_t at_out = cv.take(out_elems * sizeof(float));
    const uint64_t at_pm = cv.take(partials * sizeof(float));
    const uint64_t at_pl = cv.take(partials * sizeof(float));
    const uint64_t at_po = cv.take(partials * dv * sizeof(float));
    Scratch scratch;
    if (const kvc_status st = get_scratch(cv.size, scratch, op); st != KVC_OK) return st;
    std::vector<uint8_t> meta(meta_bytes);

    // phase 3: the host state changes (cannot fail from here on but for the device itself)
    std::vector<std::pair<uint32_t, uint32_t>> cow; // (from, to): copy-on-write of shared partial last blocks
    for (uint32_t ci = 0; ci < calls.size(); ++ci) {
        const uint32_t seq = seq_ids[call_seq[ci]];
        auto it = seqs_.find(seq);
        if (it == seqs_.end()) {
            Sequence fresh;
            fresh.layers.resize(cfg_.n_layers);
            it = seqs_.emplace(seq, std::move(fresh)).first;
        }
        Stream& s = it->second.layers[layer];
        if (s.length % block_size_ != 0 && refcount_[s.blocks.back()] > 1) {
            const uint32_t copy = take_block();
            cow.emplace_back(s.blocks.back(), copy);
            drop_block(s.blocks.back());
            s.blocks.back() = copy;
        }
        const uint64_t need = (static_cast<uint64_t>(s.length) + calls[ci].n_new + block_size_ - 1) / block_size_;
        while (s.blocks.size() < need) s.blocks.push_back(take_block());
        std::memcpy(meta.data() + at_tables + calls[ci].table_offset * sizeof(uint32_t), s.blocks.data(),
                    s.blocks.size() * sizeof(uint32_t));
        for (uint32_t t = 0; t < calls[ci].n_new; ++t)
            std::memcpy(meta.data() + at_token + (static_cast<uint64_t>(calls[ci].token_base) + t) * sizeof(uint32_t),
                        &ci, sizeof ci);
        s.length += calls[ci].n_new;
    }
    std::memcpy(meta.data() + at_calls, calls.data(), calls.size() * sizeof(CallDesc));
    std::memcpy(meta.data() + at_items, items.data(), items.size() * sizeof(WorkItem));
    std::memcpy(meta.data() + at_merges, merges.data(), merges.size() * sizeof(MergeItem));

    // phase 4: the device work, in order on the engine's stream
    uint8_t* base = scratch.base;
    const uint64_t first = offsets[0];
    const uint64_t bb = block_bytes_;
    const Geometry g = device_geometry(layer);
    cudaError_t e = cudaMemcpyAsync(base, meta.data(), meta_bytes, cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(base + at_k, k + first * cfg_.n_kv_heads * d, kv_elems * sizeof(float),
                            cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(base + at_v, v + first * cfg_.n_kv_heads * dv, v_elems * sizeof(float),
                            cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(base + at_q, q + first * cfg_.n_q_heads * d, q_elems * sizeof(float),
                            cudaMemcpyHostToDevice, stream_);
    for (const auto& [from, to] : cow) // the whole block: slots past the fill are never read
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(arena_ + to * bb, arena_ + from * bb, bb, cudaMemcpyDeviceToDevice, stream_);
    const auto* dcalls = reinterpret_cast<const CallDesc*>(base + at_calls);
    const auto* dtables = reinterpret_cast<const uint32_t*>(base + at_tables);
    if (e == cudaSuccess)
        e = launch_append(g, dcalls, reinterpret_cast<const uint32_t*>(base + at_token), static_cast<uint32_t>(total),
                          dtables, reinterpret_cast<const float*>(base + at_k),
                          reinterpret_cast<const float*>(base + at_v), stream_);
    if (e == cudaSuccess)
        e = launch_attention(g, dcalls, dtables, reinterpret_cast<const float*>(base + at_q),
                             reinterpret_cast<float*>(base + at_out), reinterpret_cast<const WorkItem*>(base + at_items),
                             static_cast<uint32_t>(items.size()), rows_cap,
                             reinterpret_cast<const MergeItem*>(base + at_merges),
                             static_cast<uint32_t>(merges.size()), reinterpret_cast<float*>(base + at_pm),
                             reinterpret_cast<float*>(base + at_pl), reinterpret_cast<float*>(base + at_po), stream_);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(out + first * cfg_.n_q_heads * dv, base + at_out, out_elems * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_);
    const cudaError_t sync = cudaStreamSynchronize(stream_);
    if (e == cudaSuccess) e = sync;
    if (e != cudaSuccess) return cuda_fail(e, op, "device work failed (the cache is no longer usable)");
    // the device is done with this call's blocks: those no later query sees go back to the free list
    for (uint32_t ci = 0; ci < calls.size(); ++ci) evict_dead(seqs_.at(seq_ids[call_seq[ci]]).layers[layer], layer);
    return KVC_OK;
}

// read_kv: a row's elements (the codes of a quantized dtype; its scales are read_kv_scales').
kvc_status Engine::read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    if (const opt::Refusal r = opt::check_read_kv(seq, layer, pos, n, k_out, v_out, view()); r.refused()) return fail(r);
    if (const kvc_status st = check_evicted("read_kv", seq, layer, pos, n); st != KVC_OK) return st;
    const RowBytes rb{0, static_cast<uint32_t>(kvc_kv_scale_offset(&geometry_)), 0,
                      static_cast<uint32_t>(kvc_kv_scale_offset(&geometry_v_))};
    return gather("read_kv", seq, layer, pos, n, rb, k_out, v_out);
}

// read_kv_scales: fp8 the f32 scale of the row's (layer, KV head), from the host copy; int8 and q8_0 the scale
// bytes stored after the row's codes, gathered on the device.
kvc_status Engine::read_kv_scales(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    if (!quantized_)
        return fail(KVC_ERR_UNSUPPORTED, "read_kv_scales: cache dtype %s has no scales",
                    kvc::dtype_name(cfg_.cache_dtype));
    if (const opt::Refusal r = opt::check_read_kv(seq, layer, pos, n, k_out, v_out, view(), "read_kv_scales");
        r.refused())
        return fail(r);
    if (const kvc_status st = check_evicted("read_kv_scales", seq, layer, pos, n); st != KVC_OK) return st;
    if (!k_scales_.empty()) {
        const uint64_t H = cfg_.n_kv_heads;
        for (uint64_t i = 0; i < n; ++i)
            for (uint64_t h = 0; h < H; ++h) {
                std::memcpy(static_cast<uint8_t*>(k_out) + (i * H + h) * sizeof(float), &k_scales_[layer * H + h],
                            sizeof(float));
                std::memcpy(static_cast<uint8_t*>(v_out) + (i * H + h) * sizeof(float), &v_scales_[layer * H + h],
                            sizeof(float));
            }
        return KVC_OK;
    }
    const RowBytes rb{static_cast<uint32_t>(kvc_kv_scale_offset(&geometry_)), geometry_.scale_bytes,
                      static_cast<uint32_t>(kvc_kv_scale_offset(&geometry_v_)), geometry_v_.scale_bytes};
    return gather("read_kv_scales", seq, layer, pos, n, rb, k_out, v_out);
}

kvc_status Engine::gather(const char* op, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, RowBytes rb,
                          void* k_out, void* v_out) {
    if (n == 0) return KVC_OK;
    const Stream* s = find(seq, layer);
    if (cudaSetDevice(device_) != cudaSuccess) return fail(KVC_ERR_INTERNAL, "%s: cudaSetDevice failed", op);
    const uint64_t bytes = static_cast<uint64_t>(n) * geometry_.n_kv_heads * rb.bytes;
    const uint64_t bytes_v = static_cast<uint64_t>(n) * geometry_.n_kv_heads * rb.bytes_v;
    Carve cv;
    const uint64_t at_table = cv.take(s->blocks.size() * sizeof(uint32_t));
    const uint64_t at_k = cv.take(bytes), at_v = cv.take(bytes_v);
    Scratch scratch;
    if (const kvc_status st = get_scratch(cv.size, scratch, op); st != KVC_OK) return st;
    uint8_t* base = scratch.base;
    const Geometry g = device_geometry(layer);
    cudaError_t e = cudaMemcpyAsync(base + at_table, s->blocks.data(), s->blocks.size() * sizeof(uint32_t),
                                    cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess)
        e = launch_gather(g, reinterpret_cast<const uint32_t*>(base + at_table), pos, n, rb, base + at_k, base + at_v,
                          stream_);
    if (e == cudaSuccess) e = cudaMemcpyAsync(k_out, base + at_k, bytes, cudaMemcpyDeviceToHost, stream_);
    if (e == cudaSuccess) e = cudaMemcpyAsync(v_out, base + at_v, bytes_v, cudaMemcpyDeviceToHost, stream_);
    const cudaError_t sync = cudaStreamSynchronize(stream_);
    if (e == cudaSuccess) e = sync;
    if (e != cudaSuccess) return cuda_fail(e, op, "device work failed");
    return KVC_OK;
}

kvc_status Engine::seq_length(uint32_t seq, uint32_t layer, uint32_t* length) {
    if (const opt::Refusal r = opt::check_seq_length(seq, layer, length, view()); r.refused()) return fail(r);
    const Stream* s = find(seq, layer);
    *length = s ? s->length : 0;
    return KVC_OK;
}

kvc_status Engine::memory(kvc_memory* out) {
    if (const opt::Refusal r = opt::check_memory_out(out); r.refused()) return fail(r);
    uint64_t tokens = 0; // sum over (seq, layer) of the rows held: a shared block counts for every sequence
    for (const auto& [id, sq] : seqs_)
        for (const Stream& s : sq.layers) tokens += s.length - uint64_t{s.dropped} * block_size_;
    const uint64_t capacity = in_use_ * block_bytes_; // a shared block counts once
    out->block_size = block_size_;
    // a K and a V row's elements plus the scales stored with them (fp8's config scales are workspace, below)
    out->live_bytes = tokens * geometry_.n_kv_heads *
                      (kvc::head_row_bytes(cfg_.cache_dtype, cfg_.head_dim, cfg_.int8_scale_dtype) +
                       kvc::head_row_bytes(cfg_.cache_dtype, head_dim_v_, cfg_.int8_scale_dtype));
    out->capacity_bytes = capacity;
    out->pool_bytes = arena_bytes_ - capacity; // free blocks and the arena's block-address array
    if (opt::kvc_memory_has_workspace(out))
        out->workspace_bytes = kWorkspaceBytes + (inv_freq_ ? rope_dims_ / 2 * sizeof(double) : 0) +
                               (k_scales_.size() + v_scales_.size()) * sizeof(float); // fp8 scales, from create
    return KVC_OK;
}

kvc_status Engine::fork(uint32_t parent, uint32_t child) {
    if (const opt::Refusal r = opt::check_fork(parent, child, view()); r.refused()) return fail(r);
    Sequence copy = seqs_.at(parent); // may throw: nothing has changed yet
    seqs_[child] = std::move(copy);
    for (const Stream& s : seqs_[child].layers) // full blocks and the partial last block are now shared
        for (uint32_t id : s.blocks)
            if (id != opt::kDroppedBlock) ++refcount_[id]; // freed blocks stay freed in the child too
    return KVC_OK;
}

kvc_status Engine::release(uint32_t seq) {
    if (const opt::Refusal r = opt::check_release(seq, view()); r.refused()) return fail(r);
    auto it = seqs_.find(seq);
    for (const Stream& s : it->second.layers)
        for (uint32_t id : s.blocks)
            if (id != opt::kDroppedBlock) drop_block(id);
    seqs_.erase(it);
    return KVC_OK;
}

} // namespace kvc::cuda
