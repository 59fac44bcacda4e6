/*
 * ggml_plugin.c: llama.cpp's quantized KV cache, built from ggml's own operations, behind the kvcheck plugin ABI.
 *
 * What it is: the cache llama.cpp keeps under `-ctk q8_0 -ctv q8_0 -fa on` (and, with f16, its default cache),
 * reduced to what one attention layer does with it. Per (layer, sequence) K and V are ggml tensors of
 * GGML_TYPE_Q8_0 (or F16), [head_dim, n_kv_heads, max_tokens]. An append writes the new f32 rows with
 * ggml_set_rows, as llama.cpp's llama_kv_cache::cpy_k/cpy_v do, so the stored blocks come out of ggml's own CPU
 * quantize_row_q8_0; attention is ggml_flash_attn_ext over views of the cache (q f32, the f16 causal mask llama.cpp
 * builds, output f32), computed by ggml's CPU backend. No arithmetic on K, V or q is ours: this file only moves bytes.
 *
 * What it proves: kvcheck judges a real quantized cache from a public library bit for bit (read_kv returns the
 * stored codes, read_kv_scales the stored f16 block scales) and its attention under the pipeline ggml really has.
 * That pipeline, read from ggml-cpu's ggml_compute_forward_flash_attn_ext_f16_one_chunk:
 *  - q is converted with the K type's vec_dot_type: quantized to q8_0 blocks (ggml's CPU quantize_row_q8_0) for a
 *    q8_0 cache, rounded to f16 for an f16 cache;
 *  - scores: q8_0 x q8_0 block dot products (exact int32 sums, scaled by the two f16 scales, summed in f32) or
 *    f16 x f16 products summed in f32; times scale, in f32; the mask is added in f32;
 *  - softmax: online, expf in f32, running max and sum in f32;
 *  - V: a q8_0 row is dequantized to f32 (code * scale, exact) and accumulated in an f32 vector; an f16 V row is
 *    accumulated in an f16 vector (ggml_vec_mad_f16 rounds every partial sum to f16);
 *  - output: accumulator * (1 / sum) in f32.
 * A q8_0 cache always takes that path. An f16 cache takes ggml's tiled path for 64 or more new tokens, with q and
 * the accumulator in f32, more precise than declared. get_caps declares the q8_0 pipeline, or the f16 one when
 * KVCHECK_GGML_CACHE=f16 (the ABI has one pipeline per plugin), and for q8_0 how ggml's kernel of this architecture
 * rounds q8_0 codes (GP_Q8_0_ROUNDING: x86 ties to even of x * 127/amax, NEON ties to even of x * 1/d). ggml runs
 * on one thread here: the result does not depend on the thread count on this path (each query row is one thread's
 * loop), and the harness machine is shared.
 *
 * Memory: every K/V tensor lives in one ggml context whose buffer we calloc at create (on the malloc heap, where
 * the NO-Q watch sees it), sized for max_seqs x n_layers x max_tokens rows. Rows holding live tokens are capacity,
 * the rest pool, ggml's tensor headers and our bookkeeping workspace. Each append_attend builds its graph in a
 * temporary context that is freed before the call returns. Fork copies rows; release resets lengths.
 */
#include "kvcheck/abi.h"

#include <ggml-cpu.h>
#include <ggml.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GP_MAX_LAYERS 64u
#define GP_MAX_Q_HEADS 128u
#define GP_MAX_KV_HEADS 64u
#define GP_MAX_HEAD_DIM 512u
#define GP_MAX_SEQS 64u
#define GP_MAX_TOKENS 16384u
#define GP_MAX_CACHE_BYTES ((uint64_t)1 << 30) /* K and V together, allocated up front */
#define GP_QK8_0 32u                           /* values per block_q8_0 */
#define GP_Q8_0_BLOCK_BYTES 34u                /* block_q8_0: f16 d, then 32 int8 codes */
#define GP_CTX_STRUCT_BYTES 256u /* at least what ggml_init mallocs for a context (its sizeof is private) */
#define GP_ERROR_CAPACITY 256

struct kvc_cache {
    kvc_config cfg;
    enum ggml_type type;       /* GGML_TYPE_Q8_0 or GGML_TYPE_F16 */
    size_t head_row_bytes;     /* one token's K (or V) in one KV head: ggml_row_size(type, head_dim) */
    size_t token_bytes;        /* n_kv_heads head rows */
    void* storage_buffer;      /* the storage context's memory, ours (calloc) */
    size_t storage_buffer_bytes;
    uint64_t kv_bytes;         /* the K/V tensors' data in it */
    struct ggml_context* storage;
    struct ggml_tensor** k;    /* [max_seqs][n_layers]: [head_dim, n_kv_heads, max_tokens] of type */
    struct ggml_tensor** v;
    uint32_t* length;          /* [max_seqs][n_layers] */
    uint64_t workspace_bytes;  /* everything besides K/V data that create allocated, constant */
    char error[GP_ERROR_CAPACITY];
};

static _Thread_local char g_create_error[GP_ERROR_CAPACITY] = "no error";

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static kvc_status fail(kvc_cache* c, kvc_status status, const char* fmt, ...) {
    char* buf = c ? c->error : g_create_error;
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf, GP_ERROR_CAPACITY, fmt, args);
    va_end(args);
    return status;
}

static size_t stream_index(const kvc_cache* c, uint32_t seq, uint32_t layer) {
    return (size_t)seq * c->cfg.n_layers + layer;
}

/* The ABI has one pipeline per plugin, and ggml's differs by cache type (q takes the K type's vec_dot_type; an f16
   V is accumulated in f16), so one process serves one of the two: q8_0, or f16 when KVCHECK_GGML_CACHE=f16. */
static int serve_f16(void) {
    const char* want = getenv("KVCHECK_GGML_CACHE");
    return want != NULL && strcmp(want, "f16") == 0;
}

/* How ggml's CPU quantize_row_q8_0 rounds the codes it stores (and q, under KVC_ROUND_Q8_0): its x86 AVX/AVX2
   kernel (arch/x86/quants.c) multiplies by 127 / amax and rounds ties to even, its ARM NEON kernel (arch/arm/quants.c)
   multiplies by 1 / d and rounds ties to even; ggml's generic build runs the reference (no flag). tools/setup-ggml.sh
   builds the x86 kernel on x86-64 (GGML_NATIVE=OFF: AVX2) and the NEON one on aarch64. */
#if defined(__x86_64__) || defined(__i386__)
#define GP_Q8_0_ROUNDING KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define GP_Q8_0_ROUNDING KVC_PIPELINE_Q8_0_RECIP_D_EVEN
#else
#define GP_Q8_0_ROUNDING 0u
#endif

static void gp_get_caps(kvc_caps* out) {
    const int f16 = serve_f16();
    kvc_caps caps;
    size_t n;
    if (out == NULL) return;
    memset(&caps, 0, sizeof caps);
    caps.struct_size = out->struct_size;
    caps.dtypes = f16 ? 1u << KVC_DTYPE_F16 : 1u << KVC_DTYPE_Q8_0;
    caps.rope_variants = 0; /* llama.cpp rotates with ggml_rope_ext before the cache; the harness passes q, k rotated */
    caps.features = KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED;
    caps.precision = KVC_PRECISION_F32;
    caps.memory_space = KVC_MEMORY_HOST;
    caps.max_layers = GP_MAX_LAYERS;
    caps.max_q_heads = GP_MAX_Q_HEADS;
    caps.max_kv_heads = GP_MAX_KV_HEADS;
    caps.max_head_dim = GP_MAX_HEAD_DIM;
    caps.max_seqs = GP_MAX_SEQS;
    caps.max_tokens = GP_MAX_TOKENS;
    caps.head_dim_multiple = GP_QK8_0; /* whole q8_0 blocks per head, as llama.cpp requires of a q8_0 cache */
    caps.pipeline.q = f16 ? KVC_ROUND_F16 : KVC_ROUND_Q8_0;
    caps.pipeline.scores = KVC_ROUND_F32;
    caps.pipeline.probs = KVC_ROUND_F32;
    caps.pipeline.accum = f16 ? KVC_ROUND_F16 : KVC_ROUND_F32;
    caps.pipeline.output = KVC_ROUND_F32;
    caps.pipeline.flags = KVC_PIPELINE_DECLARED | (f16 ? 0u : GP_Q8_0_ROUNDING);
    n = out->struct_size < sizeof caps ? out->struct_size : sizeof caps;
    memcpy(out, &caps, n);
}

static void gp_destroy(kvc_cache* c) {
    if (c == NULL) return;
    if (c->storage) ggml_free(c->storage);
    free(c->storage_buffer);
    free(c->k);
    free(c->v);
    free(c->length);
    free(c);
}

static kvc_status check_config(const kvc_config* cfg) {
    const uint32_t served = serve_f16() ? KVC_DTYPE_F16 : KVC_DTYPE_Q8_0;
    if (cfg->cache_dtype != served)
        return fail(NULL, KVC_ERR_UNSUPPORTED, "create: cache_dtype %u is not the one served, %s%s",
                    (unsigned)cfg->cache_dtype, served == KVC_DTYPE_F16 ? "f16" : "q8_0",
                    served == KVC_DTYPE_F16 ? "" : " (KVCHECK_GGML_CACHE=f16 serves f16)");
    if (cfg->rope != KVC_ROPE_NONE)
        return fail(NULL, KVC_ERR_UNSUPPORTED, "create: rope %u: this cache takes q and k already rotated",
                    (unsigned)cfg->rope);
    if (cfg->n_layers == 0 || cfg->n_q_heads == 0 || cfg->n_kv_heads == 0 || cfg->head_dim == 0 ||
        cfg->max_seqs == 0 || cfg->max_tokens == 0)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT,
                    "create: n_layers, n_q_heads, n_kv_heads, head_dim, max_seqs and max_tokens must be positive");
    if (cfg->n_q_heads % cfg->n_kv_heads != 0)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: n_q_heads (%u) is not a multiple of n_kv_heads (%u)",
                    (unsigned)cfg->n_q_heads, (unsigned)cfg->n_kv_heads);
    if (cfg->head_dim % GP_QK8_0 != 0)
        return fail(NULL, KVC_ERR_UNSUPPORTED, "create: head_dim %u is not a multiple of 32 (one q8_0 block)",
                    (unsigned)cfg->head_dim);
    if (!isfinite(cfg->scale))
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: scale (%g) must be finite", (double)cfg->scale);
    if (cfg->n_layers > GP_MAX_LAYERS || cfg->n_q_heads > GP_MAX_Q_HEADS || cfg->n_kv_heads > GP_MAX_KV_HEADS ||
        cfg->head_dim > GP_MAX_HEAD_DIM || cfg->max_seqs > GP_MAX_SEQS || cfg->max_tokens > GP_MAX_TOKENS)
        return fail(NULL, KVC_ERR_UNSUPPORTED, "create: config exceeds the declared limits");
    return KVC_OK;
}

static kvc_status gp_create(const kvc_config* config, kvc_cache** out) {
    const size_t v11_size = offsetof(kvc_config, kv_scale_mode); /* a 1.1 config ends here */
    kvc_config cfg;
    kvc_cache* c;
    kvc_status s;
    size_t n_streams, i, tensor_bytes;
    uint64_t total;
    struct ggml_init_params params;

    if (out != NULL) *out = NULL;
    if (config == NULL || out == NULL)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: config and out must not be NULL");
    if (config->struct_size < v11_size)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: config struct_size %u is too small",
                    (unsigned)config->struct_size);
    memset(&cfg, 0, sizeof cfg);
    memcpy(&cfg, config, config->struct_size < sizeof cfg ? config->struct_size : sizeof cfg);
    cfg.struct_size = sizeof cfg;
    cfg.k_scales = cfg.v_scales = NULL; /* fp8 only; not ours to keep */
    s = check_config(&cfg);
    if (s != KVC_OK) return s;

    /* One-time ggml state (time base, lookup tables) is set up here, inside create's window of the heap watch. */
    ggml_cpu_init();

    c = (kvc_cache*)calloc(1, sizeof *c);
    if (c == NULL) return fail(NULL, KVC_ERR_OUT_OF_MEMORY, "create: out of memory");
    c->cfg = cfg;
    c->type = cfg.cache_dtype == KVC_DTYPE_Q8_0 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    if (c->type == GGML_TYPE_Q8_0 &&
        (ggml_blck_size(GGML_TYPE_Q8_0) != GP_QK8_0 || ggml_type_size(GGML_TYPE_Q8_0) != GP_Q8_0_BLOCK_BYTES)) {
        gp_destroy(c);
        return fail(NULL, KVC_ERR_INTERNAL, "create: this ggml's block_q8_0 is not 32 codes + an f16 scale");
    }
    c->head_row_bytes = ggml_row_size(c->type, cfg.head_dim);
    c->token_bytes = c->head_row_bytes * cfg.n_kv_heads;
    n_streams = (size_t)cfg.max_seqs * cfg.n_layers;
    tensor_bytes = c->token_bytes * cfg.max_tokens;
    total = 2u * (uint64_t)n_streams * tensor_bytes;
    if (total > GP_MAX_CACHE_BYTES) {
        gp_destroy(c);
        return fail(NULL, KVC_ERR_OUT_OF_MEMORY,
                    "create: K and V would take %llu bytes; this plugin allocates them up front and stops at %llu",
                    (unsigned long long)total, (unsigned long long)GP_MAX_CACHE_BYTES);
    }
    c->kv_bytes = total;
    /* Each tensor costs its header (ggml_tensor_overhead) and its data padded to GGML_MEM_ALIGN. */
    c->storage_buffer_bytes =
        2 * n_streams * (ggml_tensor_overhead() + tensor_bytes + GGML_MEM_ALIGN) + GGML_MEM_ALIGN;
    /* calloc: the pages of rows never written are never touched, and for a buffer this size glibc maps it. */
    c->storage_buffer = calloc(c->storage_buffer_bytes, 1);
    c->k = (struct ggml_tensor**)calloc(n_streams, sizeof *c->k);
    c->v = (struct ggml_tensor**)calloc(n_streams, sizeof *c->v);
    c->length = (uint32_t*)calloc(n_streams, sizeof *c->length);
    if (!c->storage_buffer || !c->k || !c->v || !c->length) {
        gp_destroy(c);
        return fail(NULL, KVC_ERR_OUT_OF_MEMORY, "create: could not allocate %llu bytes of K/V storage",
                    (unsigned long long)total);
    }
    params.mem_size = c->storage_buffer_bytes;
    params.mem_buffer = c->storage_buffer;
    params.no_alloc = false;
    c->storage = ggml_init(params);
    if (c->storage == NULL) {
        gp_destroy(c);
        return fail(NULL, KVC_ERR_OUT_OF_MEMORY, "create: ggml_init failed");
    }
    for (i = 0; i < n_streams; ++i) {
        c->k[i] = ggml_new_tensor_3d(c->storage, c->type, cfg.head_dim, cfg.n_kv_heads, cfg.max_tokens);
        c->v[i] = ggml_new_tensor_3d(c->storage, c->type, cfg.head_dim, cfg.n_kv_heads, cfg.max_tokens);
    }
    c->workspace_bytes = sizeof *c + 2 * n_streams * sizeof *c->k + n_streams * sizeof *c->length +
                         (c->storage_buffer_bytes - total) + GP_CTX_STRUCT_BYTES;
    strcpy(c->error, "no error");
    *out = c;
    return KVC_OK;
}

static const char* gp_last_error(const kvc_cache* c) { return c ? c->error : g_create_error; }

static kvc_status check_stream(kvc_cache* c, const char* op, uint32_t seq, uint32_t layer) {
    if (seq >= c->cfg.max_seqs)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "%s: seq %u is out of range (max_seqs is %u)", op, (unsigned)seq,
                    (unsigned)c->cfg.max_seqs);
    if (layer >= c->cfg.n_layers)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "%s: layer %u is out of range (n_layers is %u)", op,
                    (unsigned)layer, (unsigned)c->cfg.n_layers);
    return KVC_OK;
}

/*
 * append_attend, as one ggml graph of a llama.cpp attention layer:
 *   k_cache[len .. len+n_new) = set_rows(k_new), likewise V          (quantized by ggml as it is written)
 *   out = flash_attn_ext(q, k_cache[0 .. len+n_new), v_cache[...], causal mask, scale)
 * The attention reads views of set_rows' results, so it runs after the writes and sees the chunk's own rows as
 * the cache stores them (quantized), exactly as llama.cpp's later layers and steps do.
 */
static kvc_status gp_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                   const float* k, const float* v, float* out) {
    const uint32_t d = c ? c->cfg.head_dim : 0;
    uint32_t len, n_kv, i, j;
    size_t mem, n_q_elems, n_kv_elems, work_bytes;
    struct ggml_tensor *cache_k, *cache_v, *q_in, *k_in, *v_in, *rows, *mask, *kw, *vw, *kview, *vview, *att;
    struct ggml_init_params params;
    struct ggml_context* ctx;
    struct ggml_cgraph* graph;
    struct ggml_cplan plan;
    void *buffer, *work = NULL;
    enum ggml_status status;
    kvc_status s;

    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "append_attend: cache is NULL");
    s = check_stream(c, "append_attend", seq, layer);
    if (s != KVC_OK) return s;
    if (n_new == 0) return KVC_OK;
    if (!q || !k || !v || !out)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "append_attend: q, k, v and out must not be NULL when n_new > 0");
    len = c->length[stream_index(c, seq, layer)];
    if (n_new > c->cfg.max_tokens - len)
        return fail(c, KVC_ERR_OUT_OF_MEMORY, "append_attend: seq %u layer %u holds %u tokens; %u more exceed %u",
                    (unsigned)seq, (unsigned)layer, (unsigned)len, (unsigned)n_new, (unsigned)c->cfg.max_tokens);
    n_kv = len + n_new;
    cache_k = c->k[stream_index(c, seq, layer)];
    cache_v = c->v[stream_index(c, seq, layer)];

    /* The graph's own context: 16 tensors, a small graph, the inputs, the mask and the output. */
    n_q_elems = (size_t)n_new * c->cfg.n_q_heads * d;
    n_kv_elems = (size_t)n_new * c->cfg.n_kv_heads * d;
    mem = 16 * (ggml_tensor_overhead() + GGML_MEM_ALIGN) + ggml_graph_overhead_custom(16, false) +
          sizeof(float) * (2 * n_q_elems + 2 * n_kv_elems) + sizeof(int64_t) * n_new +
          sizeof(ggml_fp16_t) * (size_t)n_kv * n_new;
    buffer = malloc(mem);
    if (buffer == NULL) return fail(c, KVC_ERR_OUT_OF_MEMORY, "append_attend: out of memory (%zu bytes)", mem);
    params.mem_size = mem;
    params.mem_buffer = buffer;
    params.no_alloc = false;
    ctx = ggml_init(params);
    if (ctx == NULL) {
        free(buffer);
        return fail(c, KVC_ERR_OUT_OF_MEMORY, "append_attend: ggml_init failed");
    }

    /* Inputs in the ABI's layout [n_new][heads][head_dim], which is ggml's [head_dim, heads, n_new]. */
    q_in = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, c->cfg.n_q_heads, n_new);
    k_in = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, (int64_t)d * c->cfg.n_kv_heads, n_new);
    v_in = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, (int64_t)d * c->cfg.n_kv_heads, n_new);
    rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_new);
    /* llama.cpp's KQ mask: f16, [n_kv, n_tokens], 0 where a token may look, -inf where it may not. */
    mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n_new);
    memcpy(q_in->data, q, sizeof(float) * n_q_elems);
    memcpy(k_in->data, k, sizeof(float) * n_kv_elems);
    memcpy(v_in->data, v, sizeof(float) * n_kv_elems);
    for (i = 0; i < n_new; ++i) ((int64_t*)rows->data)[i] = (int64_t)len + i;
    {
        const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), minus_inf = ggml_fp32_to_fp16(-INFINITY);
        ggml_fp16_t* m = (ggml_fp16_t*)mask->data;
        for (i = 0; i < n_new; ++i)
            for (j = 0; j < n_kv; ++j) m[(size_t)i * n_kv + j] = j <= len + i ? zero : minus_inf;
    }

    /* The cache seen as rows of one token (all KV heads), the shape set_rows writes, as llama.cpp's cpy_k does. */
    kw = ggml_set_rows(ctx, ggml_view_2d(ctx, cache_k, (int64_t)d * c->cfg.n_kv_heads, c->cfg.max_tokens,
                                         c->token_bytes, 0),
                       k_in, rows);
    vw = ggml_set_rows(ctx, ggml_view_2d(ctx, cache_v, (int64_t)d * c->cfg.n_kv_heads, c->cfg.max_tokens,
                                         c->token_bytes, 0),
                       v_in, rows);
    /* [head_dim, n_kv tokens, n_kv_heads]: llama.cpp's get_k/get_v views for flash attention. */
    kview = ggml_view_3d(ctx, kw, d, n_kv, c->cfg.n_kv_heads, c->token_bytes, c->head_row_bytes, 0);
    vview = ggml_view_3d(ctx, vw, d, n_kv, c->cfg.n_kv_heads, c->token_bytes, c->head_row_bytes, 0);
    /* q as [head_dim, n_new, n_q_heads]; flash_attn_ext broadcasts the KV heads over groups of query heads. */
    att = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q_in, 0, 2, 1, 3), kview, vview, mask, c->cfg.scale, 0.0f,
                              0.0f);
    /* No precision hint: ggml's CPU backend runs GGML_PREC_DEFAULT and GGML_PREC_F32 through the same code. */

    graph = ggml_new_graph_custom(ctx, 16, false);
    ggml_build_forward_expand(graph, kw);
    ggml_build_forward_expand(graph, vw);
    ggml_build_forward_expand(graph, att);
    plan = ggml_graph_plan(graph, 1, NULL);
    work_bytes = plan.work_size;
    if (work_bytes > 0) {
        work = malloc(work_bytes);
        if (work == NULL) {
            ggml_free(ctx);
            free(buffer);
            return fail(c, KVC_ERR_OUT_OF_MEMORY, "append_attend: out of memory (%zu bytes)", work_bytes);
        }
        plan.work_data = (uint8_t*)work;
    }
    status = ggml_graph_compute(graph, &plan);
    if (status == GGML_STATUS_SUCCESS) {
        /* flash_attn_ext's result is [head_dim, n_q_heads, n_new]: the ABI's out layout. */
        memcpy(out, att->data, sizeof(float) * n_q_elems);
        c->length[stream_index(c, seq, layer)] = n_kv;
    }
    free(work);
    ggml_free(ctx);
    free(buffer);
    if (status != GGML_STATUS_SUCCESS)
        return fail(c, KVC_ERR_INTERNAL, "append_attend: ggml_graph_compute returned %d", (int)status);
    return KVC_OK;
}

static kvc_status check_rows(kvc_cache* c, const char* op, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n,
                             const void* k_out, const void* v_out) {
    uint32_t len;
    kvc_status s = check_stream(c, op, seq, layer);
    if (s != KVC_OK) return s;
    len = c->length[stream_index(c, seq, layer)];
    if (pos > len || n > len - pos)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "%s: %u rows from position %u requested, but seq %u layer %u holds %u",
                    op, (unsigned)n, (unsigned)pos, (unsigned)seq, (unsigned)layer, (unsigned)len);
    if (n > 0 && (k_out == NULL || v_out == NULL))
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "%s: k_out and v_out must not be NULL when n > 0", op);
    return KVC_OK;
}

/* Copies what one stored head row holds: for q8_0 its codes (want_scales 0) or its block scales (1). */
static void copy_rows(const kvc_cache* c, const struct ggml_tensor* t, uint32_t pos, uint32_t n, int want_scales,
                      unsigned char* dst) {
    const unsigned char* src = (const unsigned char*)t->data + (size_t)pos * c->token_bytes;
    const size_t head_rows = (size_t)n * c->cfg.n_kv_heads, blocks = c->cfg.head_dim / GP_QK8_0;
    size_t r, b;
    if (c->type == GGML_TYPE_F16) { /* the f16 bits, as stored */
        memcpy(dst, src, (size_t)n * c->token_bytes);
        return;
    }
    for (r = 0; r < head_rows; ++r)
        for (b = 0; b < blocks; ++b) {
            const unsigned char* block = src + r * c->head_row_bytes + b * GP_Q8_0_BLOCK_BYTES;
            if (want_scales)
                memcpy(dst + (r * blocks + b) * 2, block, 2);
            else
                memcpy(dst + r * c->cfg.head_dim + b * GP_QK8_0, block + 2, GP_QK8_0);
        }
}

static kvc_status gp_read_kv(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                             void* v_out) {
    kvc_status s;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "read_kv: cache is NULL");
    s = check_rows(c, "read_kv", seq, layer, pos, n, k_out, v_out);
    if (s != KVC_OK || n == 0) return s;
    copy_rows(c, c->k[stream_index(c, seq, layer)], pos, n, 0, (unsigned char*)k_out);
    copy_rows(c, c->v[stream_index(c, seq, layer)], pos, n, 0, (unsigned char*)v_out);
    return KVC_OK;
}

static kvc_status gp_read_kv_scales(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n,
                                    void* k_out, void* v_out) {
    kvc_status s;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "read_kv_scales: cache is NULL");
    if (c->type != GGML_TYPE_Q8_0)
        return fail(c, KVC_ERR_UNSUPPORTED, "read_kv_scales: an f16 cache has no scales");
    s = check_rows(c, "read_kv_scales", seq, layer, pos, n, k_out, v_out);
    if (s != KVC_OK || n == 0) return s;
    copy_rows(c, c->k[stream_index(c, seq, layer)], pos, n, 1, (unsigned char*)k_out);
    copy_rows(c, c->v[stream_index(c, seq, layer)], pos, n, 1, (unsigned char*)v_out);
    return KVC_OK;
}

static kvc_status gp_seq_length(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t* length) {
    kvc_status s;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "seq_length: cache is NULL");
    s = check_stream(c, "seq_length", seq, layer);
    if (s != KVC_OK) return s;
    if (length == NULL) return fail(c, KVC_ERR_INVALID_ARGUMENT, "seq_length: length must not be NULL");
    *length = c->length[stream_index(c, seq, layer)];
    return KVC_OK;
}

/* A head row costs head_dim codes + head_dim / 32 f16 scales (q8_0) or 2 * head_dim bytes (f16): ggml's row size,
   which is the ABI's formula. Storage is per token, so block_size is 1 and live rows are the capacity. */
static kvc_status gp_memory(kvc_cache* c, kvc_memory* out) {
    kvc_memory m;
    uint64_t tokens = 0;
    size_t i, n;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "memory: cache is NULL");
    if (out == NULL) return fail(c, KVC_ERR_INVALID_ARGUMENT, "memory: out must not be NULL");
    for (i = 0; i < (size_t)c->cfg.max_seqs * c->cfg.n_layers; ++i) tokens += c->length[i];
    memset(&m, 0, sizeof m);
    m.struct_size = out->struct_size;
    m.block_size = 1;
    m.live_bytes = 2u * tokens * c->token_bytes;
    m.capacity_bytes = m.live_bytes;
    m.pool_bytes = c->kv_bytes - m.capacity_bytes;
    m.workspace_bytes = c->workspace_bytes;
    n = out->struct_size < sizeof m ? out->struct_size : sizeof m;
    memcpy(out, &m, n);
    return KVC_OK;
}

static int seq_is_empty(const kvc_cache* c, uint32_t seq) {
    uint32_t layer;
    for (layer = 0; layer < c->cfg.n_layers; ++layer)
        if (c->length[stream_index(c, seq, layer)] != 0) return 0;
    return 1;
}

/* llama.cpp shares cells between sequences (seq_cp); this cache has one tensor per sequence, so fork copies the
   stored bytes (codes and scales as they are: nothing is requantized). */
static kvc_status gp_fork(kvc_cache* c, uint32_t parent, uint32_t child) {
    uint32_t layer;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "fork: cache is NULL");
    if (parent >= c->cfg.max_seqs || child >= c->cfg.max_seqs || parent == child)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "fork: parent %u, child %u (max_seqs %u)", (unsigned)parent,
                    (unsigned)child, (unsigned)c->cfg.max_seqs);
    if (seq_is_empty(c, parent))
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "fork: parent %u holds no rows", (unsigned)parent);
    if (!seq_is_empty(c, child))
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "fork: child %u is not empty", (unsigned)child);
    for (layer = 0; layer < c->cfg.n_layers; ++layer) {
        const size_t from = stream_index(c, parent, layer), to = stream_index(c, child, layer);
        const size_t bytes = (size_t)c->length[from] * c->token_bytes;
        memcpy(c->k[to]->data, c->k[from]->data, bytes);
        memcpy(c->v[to]->data, c->v[from]->data, bytes);
        c->length[to] = c->length[from];
    }
    return KVC_OK;
}

static kvc_status gp_release(kvc_cache* c, uint32_t seq) {
    uint32_t layer;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "release: cache is NULL");
    if (seq >= c->cfg.max_seqs || seq_is_empty(c, seq))
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "release: seq %u is out of range or holds no rows", (unsigned)seq);
    for (layer = 0; layer < c->cfg.n_layers; ++layer) c->length[stream_index(c, seq, layer)] = 0;
    return KVC_OK;
}

static char g_version[64];

static const kvc_plugin_api g_api = {
    sizeof(kvc_plugin_api),
    KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "ggml-q8_0",
    g_version,
    gp_get_caps,
    gp_create,
    gp_destroy,
    gp_last_error,
    gp_append_attend,
    NULL, /* append_attend_batch */
    gp_read_kv,
    gp_seq_length,
    gp_memory,
    gp_fork,
    gp_release,
    gp_read_kv_scales,
};

__attribute__((visibility("default"))) const kvc_plugin_api* kvcheck_plugin_entry(uint32_t abi_major,
                                                                                  uint32_t abi_minor);

const kvc_plugin_api* kvcheck_plugin_entry(uint32_t abi_major, uint32_t abi_minor) {
    (void)abi_minor;
    if (abi_major != KVC_ABI_VERSION_MAJOR) return NULL;
    snprintf(g_version, sizeof g_version, "%s (%s)", ggml_version(), KVC_GGML_SOURCE);
    return &g_api;
}
