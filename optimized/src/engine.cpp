// The engine's boundary: every input is checked here, before anything changes, and every failure is a status with
// a message. Kernels and the append path below assume valid input.
#include "engine_impl.hpp"

#include "kvcheck/abi.hpp"

#include "attention.hpp"
#include "simd.hpp"
#include "thread_pool.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>

namespace kvc::opt {
namespace {

constexpr uint32_t kMaxBlockSize = 65536;
constexpr uint32_t kMaxCount = 1024; // layers, query heads, KV heads

// A failed call must leave the cache as it was, and exceptions must not cross the C ABI: every public method runs
// its body through here.
template <typename F>
kvc_status guarded(Engine::Impl& im, F&& body) {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return im.fail(KVC_ERR_OUT_OF_MEMORY, "allocation failed");
    } catch (...) {
        return im.fail(KVC_ERR_INTERNAL, "unexpected exception");
    }
}

} // namespace

Engine::Impl::Impl(const kvc_config& c, const EngineOptions& o, uint32_t b, const PoolOptions& p)
    : cfg(c), opt(o), block_size(b), pool(p) {}

kvc_status Engine::Impl::evicted(const char* op, uint32_t seq, uint32_t layer, uint64_t pos, uint64_t n,
                                 const Stream& s) {
    const uint64_t from = uint64_t{sink_blocks} * block_size, to = from + uint64_t{s.dropped} * block_size;
    return fail(KVC_ERR_EVICTED,
                "%s: rows %llu..%llu of sequence %u layer %u include evicted rows (%llu..%llu were dropped: no query "
                "of window %u can see them again)",
                op, static_cast<unsigned long long>(pos), static_cast<unsigned long long>(pos + n - 1), seq, layer,
                static_cast<unsigned long long>(from), static_cast<unsigned long long>(to - 1), window_of(layer));
}

kvc_status Engine::Impl::fail(kvc_status status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(error, sizeof error, fmt, ap);
    va_end(ap);
    return status;
}

std::unique_ptr<Engine> Engine::create(const kvc_config& c, const EngineOptions& o, kvc_status* status,
                                       std::string* error) {
    auto refuse = [&](kvc_status s, const std::string& why) -> std::unique_ptr<Engine> {
        if (status) *status = s;
        if (error) *error = why;
        return nullptr;
    };
    if (const Refusal r = check_config(c, kMaxHeadDim, kMaxCount, /*quantized=*/true, /*windows=*/true,
                                       /*latent=*/true);
        r.refused())
        return refuse(r.status, r.message);
    const bool quantized = is_quantized_dtype(c.cache_dtype);
    const uint32_t dv = kvc::value_dim(c);
    QuantFormat qf, qf_v;
    const bool f16_scale = c.cache_dtype == KVC_DTYPE_INT8_TOKEN && c.int8_scale_dtype == KVC_DTYPE_F16;
    if (quantized) {
        qf = QuantFormat{c.cache_dtype, c.head_dim, f16_scale};
        qf_v = QuantFormat{c.cache_dtype, dv, f16_scale};
    }

    // The hint is a wish: 0 means "yours", and a very large one is capped, at max_tokens too: no stream ever
    // fills a block longer than that, so a longer one would only hold slots no row can use.
    uint32_t b = c.block_size_hint == 0 ? kDefaultBlockSize : std::min(c.block_size_hint, kMaxBlockSize);
    if (c.max_tokens != 0) b = std::min(b, c.max_tokens);
    const uint32_t es = static_cast<uint32_t>(kvc::dtype_size(c.cache_dtype));
    kvc_kv_layout g = kvc_kv_layout_make_scaled(b, c.n_kv_heads, c.head_dim, es, quantized ? row_scale_bytes(qf) : 0);
    const kvc_kv_layout gv = kvc_kv_layout_v(g, dv, quantized ? row_scale_bytes(qf_v) : 0);
    PoolOptions p;
    p.block_bytes = g.plane_bytes + uint64_t{c.n_kv_heads} * gv.head_bytes;
    p.dtype = c.cache_dtype;
    p.seal = o.seal_full_blocks;
    p.poison = o.poison_unused;
    p.max_blocks = o.max_blocks;
    try {
        auto im = std::make_unique<Impl>(c, o, b, p);
        im->cfg.block_size_hint = b;
        if (any_window(c)) { // sinks without a window have no effect (and are accepted: abi_checks.hpp)
            im->windows.assign(c.windows, c.windows + c.n_layers);
            im->n_sinks = c.n_sinks;
            im->evict = c.evict != 0;
            im->sink_blocks = static_cast<uint32_t>((uint64_t{c.n_sinks} + b - 1) / b);
        }
        im->cfg.windows = nullptr; // the harness's array: not kept past create
        im->elem_bytes = es;
        im->quantized = quantized;
        im->quant = qf;
        im->quant_v = qf_v;
        im->head_dim_v = dv;
        if (kvc::dtype_is_fp8(c.cache_dtype)) { // one scale per (layer, KV head), whatever the mode
            expand_fp8_scales(c, im->k_scales, im->v_scales);
            im->cfg.k_scales = im->cfg.v_scales = nullptr; // the harness's arrays: not kept past create
        }
        im->padded = padded_dim(c.head_dim);
        im->max_tokens = c.max_tokens == 0 ? UINT32_MAX : c.max_tokens; // 0: no limit but the 32-bit length
        im->geometry = g;
        im->geometry_v = gv;
        im->rope = Rope(c.rope, c.rope_theta, c.head_dim, c.rope_dim_begin, c.rope_dims);
        im->simd = o.simd && cpu_has_avx2_f16c();
        const bool fp8_fused = fp8_scales_fuse(c.cache_dtype, c.scale, im->k_scales.data(), im->v_scales.data(),
                                               im->k_scales.size());
        const bool simd_shape = simd_serves(c.head_dim, dv);
        im->kernel = split_kernel(c.cache_dtype, im->simd && simd_shape, fp8_fused);
        if (status) *status = KVC_OK;
        return std::unique_ptr<Engine>(new Engine(std::move(im)));
    } catch (const std::bad_alloc&) {
        return refuse(KVC_ERR_OUT_OF_MEMORY, "allocation failed");
    }
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

const char* Engine::last_error() const { return impl_->error; }
const kvc_config& Engine::config() const { return impl_->cfg; }
uint32_t Engine::block_size() const { return impl_->block_size; }
bool Engine::uses_simd() const { return impl_->simd; }
kvc_kv_layout Engine::geometry() const { return impl_->geometry; }
kvc_kv_layout Engine::geometry_v() const { return impl_->geometry_v; }

kvc_status Engine::append_attend(uint32_t seq, uint32_t layer, uint32_t n_new, const float* q, const float* k,
                                 const float* v, float* out) {
    const uint32_t offsets[2] = {0, n_new};
    return guarded(*impl_, [&] { return impl_->run(layer, 1, &seq, offsets, q, k, v, out, true); });
}

kvc_status Engine::append(uint32_t seq, uint32_t layer, uint32_t n_new, const float* k, const float* v) {
    const uint32_t offsets[2] = {0, n_new};
    return guarded(*impl_, [&] { return impl_->run(layer, 1, &seq, offsets, nullptr, k, v, nullptr, false); });
}

kvc_status Engine::append_attend_batch(uint32_t layer, const kvc_batch* b) {
    Impl& im = *impl_;
    bool empty = false;
    if (const Refusal r = check_batch_struct(b, &empty); r.refused()) return im.fail(r);
    if (empty) return KVC_OK;
    return guarded(im, [&] {
        return im.run(layer, b->n_seqs, b->seq_ids, b->token_offsets, b->q, b->k, b->v, b->out, true);
    });
}

kvc_status Engine::Impl::run(uint32_t layer, uint32_t n_seqs, const uint32_t* seq_ids, const uint32_t* offsets,
                             const float* q, const float* k, const float* v, float* out, bool attend) {
    const char* op = attend ? "append_attend" : "append";
    // phase 1: check everything before anything changes
    uint64_t total = 0;
    if (const Refusal r = check_streams(op, layer, n_seqs, seq_ids, offsets, view(), &total); r.refused()) return fail(r);
    if (total == 0) return KVC_OK; // n_new == 0 is a no-op
    if (k == nullptr || v == nullptr || (attend && (q == nullptr || out == nullptr)))
        return fail(KVC_ERR_INVALID_ARGUMENT, "%s: q, k, v and out must not be NULL when tokens are appended", op);

    // int8 and q8_0 store finite rows only (and an f16 int8 scale must not overflow): refused before any change
    if (quantized)
        for (uint64_t t = 0; t < total; ++t)
            for (uint32_t h = 0; h < cfg.n_kv_heads; ++h)
                for (int plane = 0; plane < 2; ++plane) {
                    const float* row = plane == 0 ? k + (offsets[0] + t) * row_elems() + h * cfg.head_dim
                                                  : v + (offsets[0] + t) * row_elems_v() + h * head_dim_v;
                    if (const char* why = unquantizable(row, plane == 0 ? quant : quant_v))
                        return fail(KVC_ERR_INVALID_ARGUMENT, "%s: the %s row of token %llu, KV head %u, has %s", op,
                                    plane == 0 ? "K" : "V", static_cast<unsigned long long>(t), h, why);
                }

    // phase 2: blocks and scratch (may fail; nothing visible has changed yet)
    uint64_t blocks = 0;
    for (uint32_t i = 0; i < n_seqs; ++i)
        if (const Stream* s = find(seq_ids[i], layer)) blocks += blocks_needed(*s, offsets[i + 1] - offsets[i]);
        else blocks += (static_cast<uint64_t>(offsets[i + 1] - offsets[i]) + block_size - 1) / block_size;
    if (!pool.reserve(blocks))
        return fail(KVC_ERR_OUT_OF_MEMORY, "%s: out of blocks (%llu more needed, %llu in use%s)", op,
                    static_cast<unsigned long long>(blocks), static_cast<unsigned long long>(pool.blocks_in_use()),
                    opt.max_blocks ? ", block limit reached" : ", allocation failed");
    const kvc_kv_layout l = layout(), lv = layout_v(); // final block addresses: the pool does not grow again
    std::vector<Pending> pending(n_seqs);
    for (uint32_t i = 0; i < n_seqs; ++i) {
        const uint32_t n = offsets[i + 1] - offsets[i];
        if (n == 0) continue;
        auto it = seqs.find(seq_ids[i]);
        if (it == seqs.end()) {
            Sequence fresh;
            fresh.layers.resize(cfg.n_layers);
            it = seqs.emplace(seq_ids[i], std::move(fresh)).first;
        }
        Stream& s = it->second.layers[layer];
        reserve_table(s, n);
        pending[i] = Pending{&s, layer, n, k + offsets[i] * row_elems(), v + offsets[i] * row_elems_v()};
    }
    std::vector<float> qrot;
    std::vector<StreamCall> calls;
    AttentionPlan plan;
    if (attend) {
        qrot.assign(total * cfg.n_q_heads * padded, 0.0f);
        for (uint32_t i = 0; i < n_seqs; ++i) {
            if (pending[i].n == 0) continue;
            StreamCall c;
            c.len_before = pending[i].stream->length;
            c.n_new = pending[i].n;
            c.q = qrot.data() + static_cast<uint64_t>(offsets[i] - offsets[0]) * cfg.n_q_heads * padded;
            c.out = out + static_cast<uint64_t>(offsets[i]) * cfg.n_q_heads * head_dim_v;
            calls.push_back(c);
        }
        AttentionShape shape;
        shape.n_q_heads = cfg.n_q_heads;
        shape.n_kv_heads = cfg.n_kv_heads;
        shape.scale = cfg.scale;
        shape.kernel = kernel;
        shape.max_threads = opt.threads;
        shape.group_heads = opt.group_heads;
        shape.layout = &l;
        shape.v_layout = separate_v() ? &lv : nullptr;
        shape.k_scales = k_scales_of(layer);
        shape.v_scales = v_scales_of(layer);
        shape.window = window_of(layer);
        shape.sinks = n_sinks;
        plan.build(shape, calls.data(), calls.size());
    }

    // phase 3: write K/V (cannot fail from here on); rotate the queries by their positions
    for (uint32_t i = 0, c = 0; i < n_seqs; ++i) {
        if (pending[i].n == 0) continue;
        write(pending[i]);
        if (!attend) continue;
        calls[c].table = pending[i].stream->blocks.data();
        const uint64_t first = offsets[i];
        for (uint32_t t = 0; t < pending[i].n; ++t) {
            double cs[kMaxHeadDim];
            const uint64_t pos = calls[c].len_before + t;
            if (rope.enabled()) rope.angles(pos, cs);
            for (uint32_t h = 0; h < cfg.n_q_heads; ++h) {
                float* dst = qrot.data() + ((first - offsets[0] + t) * cfg.n_q_heads + h) * padded;
                std::memcpy(dst, q + ((first + t) * cfg.n_q_heads + h) * cfg.head_dim,
                            cfg.head_dim * sizeof(float));
                if (rope.enabled()) rope.apply(dst, cs);
            }
        }
        ++c;
    }
    // phase 4: attention over what is now cached
    if (attend) plan.run();
    // phase 5: free the blocks no later query of the layer can see (after the attention: this call's first queries
    // may still see rows that its last append made dead)
    if (evict)
        for (uint32_t i = 0; i < n_seqs; ++i)
            if (pending[i].n != 0) evict_dead(*pending[i].stream, layer);
    return KVC_OK;
}

kvc_status Engine::read_kv(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    Impl& im = *impl_;
    if (const Refusal r = check_read_kv(seq, layer, pos, n, k_out, v_out, im.view()); r.refused()) return im.fail(r);
    if (n == 0) return KVC_OK;
    const Stream* s = im.find(seq, layer);
    if (im.holds_dropped(*s, pos, n)) return im.evicted("read_kv", seq, layer, pos, n, *s);
    const kvc_kv_layout l = im.layout(), lv = im.layout_v();
    // the elements (codes) only: scales are read_kv_scales'
    const uint64_t row = kvc_kv_scale_offset(&l), row_v = kvc_kv_scale_offset(&lv);
    for (uint32_t i = 0; i < n; ++i)
        for (uint32_t h = 0; h < im.cfg.n_kv_heads; ++h) {
            const uint64_t at = static_cast<uint64_t>(i) * im.cfg.n_kv_heads + h;
            std::memcpy(static_cast<uint8_t*>(k_out) + at * row,
                        kvc_kv_address(&l, s->blocks.data(), pos + i, KVC_PLANE_K, h, 0), row);
            std::memcpy(static_cast<uint8_t*>(v_out) + at * row_v,
                        kvc_kv_address(&lv, s->blocks.data(), pos + i, KVC_PLANE_V, h, 0), row_v);
        }
    return KVC_OK;
}

kvc_status Engine::read_kv_scales(uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out, void* v_out) {
    Impl& im = *impl_;
    if (!im.quantized)
        return im.fail(KVC_ERR_UNSUPPORTED, "read_kv_scales: cache dtype %s has no scales",
                       kvc::dtype_name(im.cfg.cache_dtype));
    if (const Refusal r = check_read_kv(seq, layer, pos, n, k_out, v_out, im.view(), "read_kv_scales"); r.refused())
        return im.fail(r);
    if (n == 0) return KVC_OK;
    const Stream* s = im.find(seq, layer);
    if (im.holds_dropped(*s, pos, n)) return im.evicted("read_kv_scales", seq, layer, pos, n, *s);
    const kvc_kv_layout l = im.layout(), lv = im.layout_v();
    const uint64_t out_row = row_scales_bytes(im.quant), out_row_v = row_scales_bytes(im.quant_v);
    const float* ks = im.k_scales_of(layer);
    const float* vs = im.v_scales_of(layer);
    for (uint32_t i = 0; i < n; ++i)
        for (uint32_t h = 0; h < im.cfg.n_kv_heads; ++h) {
            const uint64_t at = static_cast<uint64_t>(i) * im.cfg.n_kv_heads + h;
            row_scales(kvc_kv_address(&l, s->blocks.data(), pos + i, KVC_PLANE_K, h, 0), im.quant, ks ? ks[h] : 1.0f,
                       static_cast<uint8_t*>(k_out) + at * out_row);
            row_scales(kvc_kv_address(&lv, s->blocks.data(), pos + i, KVC_PLANE_V, h, 0), im.quant_v,
                       vs ? vs[h] : 1.0f, static_cast<uint8_t*>(v_out) + at * out_row_v);
        }
    return KVC_OK;
}

kvc_status Engine::seq_length(uint32_t seq, uint32_t layer, uint32_t* length) {
    Impl& im = *impl_;
    if (const Refusal r = check_seq_length(seq, layer, length, im.view()); r.refused()) return im.fail(r);
    const Stream* s = im.find(seq, layer);
    *length = s ? s->length : 0;
    return KVC_OK;
}

kvc_status Engine::memory(kvc_memory* out) {
    Impl& im = *impl_;
    if (const Refusal r = check_memory_out(out); r.refused()) return im.fail(r);
    // sum over (seq, layer) of the rows read_kv can return (length less the rows of freed blocks): a shared block
    // counts for every sequence
    uint64_t tokens = 0;
    for (const auto& [id, sq] : im.seqs)
        for (const Stream& s : sq.layers) tokens += s.length - uint64_t{s.dropped} * im.block_size;
    const uint64_t capacity = im.pool.blocks_in_use() * im.pool.block_bytes(); // a shared block counts once
    out->block_size = im.block_size;
    // a K and a V head row's elements plus the scales stored with them (fp8's config scales are workspace, below)
    out->live_bytes = tokens * im.cfg.n_kv_heads *
                      (kvc::head_row_bytes(im.cfg.cache_dtype, im.cfg.head_dim, im.cfg.int8_scale_dtype) +
                       kvc::head_row_bytes(im.cfg.cache_dtype, im.head_dim_v, im.cfg.int8_scale_dtype));
    out->capacity_bytes = capacity;
    out->pool_bytes = im.pool.held_bytes() - capacity;
    // Workspace: the fp8 scales copied at create, nothing else. A call's scratch (the attention plan's states, the
    // rotated queries) is freed before it returns.
    // The block tables (4 bytes per block) grow with the tokens, so they are no workspace, which must be constant:
    // they are bookkeeping of the K/V storage, small enough for the harness's heap slack.
    if (kvc_memory_has_workspace(out))
        out->workspace_bytes = (im.k_scales.capacity() + im.v_scales.capacity()) * sizeof(float);
    return KVC_OK;
}

kvc_status Engine::fork(uint32_t parent, uint32_t child) {
    Impl& im = *impl_;
    if (const Refusal r = check_fork(parent, child, im.view()); r.refused()) return im.fail(r);
    return guarded(im, [&] {
        Sequence copy = im.seqs.at(parent);     // may throw: nothing has changed yet
        auto c = im.seqs.try_emplace(child).first;
        c->second = std::move(copy);
        for (const Stream& s : c->second.layers) // full blocks and the partial last block are now shared
            for (uint32_t id : s.blocks)
                if (id != kDroppedBlock) im.pool.retain(id); // freed blocks stay freed in the child too
        return KVC_OK;
    });
}

kvc_status Engine::release(uint32_t seq) {
    Impl& im = *impl_;
    if (const Refusal r = check_release(seq, im.view()); r.refused()) return im.fail(r);
    auto it = im.seqs.find(seq);
    for (const Stream& s : it->second.layers)
        for (uint32_t id : s.blocks)
            if (id != kDroppedBlock) im.pool.drop(id);
    im.seqs.erase(it);
    im.compact();
    return KVC_OK;
}

kvc_status Engine::reserve_blocks(uint64_t n) {
    Impl& im = *impl_;
    if (!im.pool.reserve(n, /*keep=*/true)) return im.fail(KVC_ERR_OUT_OF_MEMORY, "reserve_blocks: %llu blocks refused", static_cast<unsigned long long>(n));
    return KVC_OK;
}

void Engine::shuffle_free_blocks(uint64_t seed) { impl_->pool.shuffle_free(seed); }
void Engine::set_threads(unsigned threads) { impl_->opt.threads = threads; }
void Engine::set_group_heads(bool on) { impl_->opt.group_heads = on; }

const uint8_t* Engine::slot_address(uint32_t seq, uint32_t layer, uint64_t pos, uint32_t plane, uint32_t head) const {
    const Impl& im = *impl_;
    if (layer >= im.cfg.n_layers || plane > 1 || head >= im.cfg.n_kv_heads) return nullptr;
    const Stream* s = im.find(seq, layer);
    if (s == nullptr || pos >= static_cast<uint64_t>(s->blocks.size()) * im.block_size) return nullptr;
    if (s->blocks[pos / im.block_size] == kDroppedBlock) return nullptr;
    const kvc_kv_layout l = plane == KVC_PLANE_V ? im.layout_v() : im.layout();
    return kvc_kv_address(&l, s->blocks.data(), pos, plane, head, 0);
}

} // namespace kvc::opt
