/*
 * example_plugin.c: a KV cache in plain C11 behind the kvcheck plugin ABI (include/kvcheck/abi.h).
 *
 * This is the "how to plug in" example. It is written to be read, not to be fast: if you are connecting your own
 * cache to kvcheck, this file shows every obligation the ABI puts on you, each in the simplest form we could find.
 * It is one file of about 550 lines on purpose: a plugin author reads it top to bottom and copies it whole.
 *
 * The design in five lines:
 *  - Storage is two arrays, K and V, each laid out [seq][layer][pos][kv_head][dim] and allocated once, zeroed,
 *    at create. Nothing is paged, nothing grows, nothing is shared. A (seq, layer) stream is a run of rows.
 *  - The only other state is one length per (seq, layer). Appending writes rows and bumps the length; release sets
 *    the lengths to 0; fork copies rows. Rows past a length are never read, so nothing needs clearing.
 *  - Keys (and queries) are rotated by their position (RoPE) before use; keys are stored rotated.
 *  - Attention is a plain loop per (query token, query head): scores, softmax, weighted sum of V rows.
 *  - Every entry point checks its arguments first and fails with a status and a message, before changing anything.
 *
 * What we declare to the harness (get_caps): dtypes f32/f16/bf16; RoPE NeoX and GPT-J; GQA, FORK, RELEASE and
 * CHUNKED; precision class F32; host memory. Not PAGED (block_size is 1), not BATCH.
 */
#include "example_plugin.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------------------
 * Limits. The harness never asks for more than we declare, and each limit keeps the size arithmetic in create far
 * from overflowing 64 bits. The byte cap is separate: a config within every limit can still ask for terabytes, and
 * we would rather say OUT_OF_MEMORY clearly than let calloc thrash the machine.
 * ------------------------------------------------------------------------------------------------------------ */
#define EX_MAX_LAYERS 128u
#define EX_MAX_Q_HEADS 256u
#define EX_MAX_KV_HEADS 256u
#define EX_MAX_HEAD_DIM 1024u
#define EX_MAX_SEQS 256u
#define EX_MAX_TOKENS 65536u
#define EX_MAX_CACHE_BYTES ((uint64_t)1 << 30) /* K and V together */

#define EX_ERROR_CAPACITY 256

/* Rows [pos] of one (seq, layer) are contiguous, so a whole stream is one memcpy away. */
struct kvc_cache {
    kvc_config cfg;     /* our own copy: the ABI forbids keeping the caller's pointer */
    size_t elem_bytes;  /* 4 for f32, 2 for f16 and bf16 */
    size_t row_elems;   /* n_kv_heads * head_dim: one token's K (or V) in one layer */
    size_t total_bytes; /* K and V together, as allocated */
    unsigned char* k;   /* [max_seqs][n_layers][max_tokens][n_kv_heads][head_dim], elements of the cache dtype */
    unsigned char* v;   /* same shape as k */
    uint32_t* length;   /* [max_seqs][n_layers]: rows held by each stream */

    /* Scratch for append_attend, allocated here so that append_attend never allocates and never fails. */
    double* acc;           /* [head_dim]: the weighted sum of V rows */
    long double* head;     /* [head_dim]: one query or key head, rotated */
    long double* rope_cos; /* [head_dim / 2]: the rotation for the token being processed */
    long double* rope_sin; /* [head_dim / 2] */

    char error[EX_ERROR_CAPACITY]; /* last_error(cache) */
};

/* ---------------------------------------------------------------------------------------------------------------
 * Error reporting. Each cache keeps the message of its own last failure, so caches used from different threads
 * never see each other's messages. A failed create has no cache to hold its message, so that one goes into a
 * thread-local buffer, which last_error(NULL) returns. (So does a call that passed cache == NULL.)
 * ------------------------------------------------------------------------------------------------------------ */
static _Thread_local char g_create_error[EX_ERROR_CAPACITY] = "no error";

#if defined(__GNUC__)
#define EX_PRINTF_LIKE(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define EX_PRINTF_LIKE(fmt_index, first_arg)
#endif

/* Records a message for cache (or for the thread when cache is NULL) and hands the status back, so that every
   failure reads `return fail(cache, STATUS, "...", ...);`. */
static kvc_status fail(kvc_cache* cache, kvc_status status, const char* fmt, ...) EX_PRINTF_LIKE(3, 4);

static kvc_status fail(kvc_cache* cache, kvc_status status, const char* fmt, ...) {
    char* buf = cache ? cache->error : g_create_error;
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf, EX_ERROR_CAPACITY, fmt, args);
    va_end(args);
    return status;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Addressing and element access. All index arithmetic is in size_t: a 32-bit product of seq, layer, pos, heads and
 * dims overflows long before a cache gets large (a bug real caches have shipped).
 * ------------------------------------------------------------------------------------------------------------ */

/* Index (in elements, not bytes) of element 0 of row pos of (seq, layer) in k or v. */
static size_t row_index(const kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t pos) {
    return (((size_t)seq * c->cfg.n_layers + layer) * c->cfg.max_tokens + pos) * c->row_elems;
}

static uint32_t* length_of(const kvc_cache* c, uint32_t seq, uint32_t layer) {
    return &c->length[(size_t)seq * c->cfg.n_layers + layer];
}

/* Writes x into element idx of a K or V array, rounded to the cache dtype. */
static void store_elem(const kvc_cache* c, unsigned char* base, size_t idx, float x) {
    unsigned char* dst = base + idx * c->elem_bytes;
    uint16_t h;
    switch (c->cfg.cache_dtype) {
    case KVC_DTYPE_F32: memcpy(dst, &x, 4); return;
    case KVC_DTYPE_F16: h = kvc_example_f32_to_f16(x); break;
    default: h = kvc_example_f32_to_bf16(x); break;
    }
    memcpy(dst, &h, 2);
}

/* Reads element idx of a K or V array, widened to float (exactly: every f16 and bf16 value is a float). */
static float load_elem(const kvc_cache* c, const unsigned char* base, size_t idx) {
    const unsigned char* src = base + idx * c->elem_bytes;
    float x;
    uint16_t h;
    if (c->cfg.cache_dtype == KVC_DTYPE_F32) {
        memcpy(&x, src, 4);
        return x;
    }
    memcpy(&h, src, 2);
    return c->cfg.cache_dtype == KVC_DTYPE_F16 ? kvc_example_f16_to_f32(h) : kvc_example_bf16_to_f32(h);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Rotary position embedding. Pair j (0 <= j < d/2) of a head at position pos turns by the angle pos * theta^(-2j/d);
 * NeoX pairs element j with j + d/2, GPT-J pairs 2j with 2j + 1.
 *
 * Everything here is long double, and a rotated key is rounded only once, when it is stored. Why: a rotation
 * x*cos - y*sin can cancel, and in float arithmetic that costs several ulps of the result, while the harness wants
 * stored keys within one ulp of an exact rotation (CACHE-CONTENT). Doing what the reference does
 * (kvc::ref::apply_rope<long double>, then rounding to float, then to the cache dtype) gives the same bits.
 * ------------------------------------------------------------------------------------------------------------ */

/* Fills rope_cos / rope_sin for one position. Called once per token; the table then serves every head. */
static void rope_prepare(kvc_cache* c, uint32_t pos) {
    const uint32_t d = c->cfg.head_dim;
    uint32_t j;
    for (j = 0; j < d / 2; ++j) {
        const long double inv_freq = powl((long double)c->cfg.rope_theta, -2.0L * (long double)j / (long double)d);
        const long double angle = (long double)pos * inv_freq;
        c->rope_cos[j] = cosl(angle);
        c->rope_sin[j] = sinl(angle);
    }
}

/* Copies one head (head_dim floats) into c->head, rotated with the table rope_prepare filled (or as is without
   RoPE). The caller's buffer is only read: it belongs to the harness. */
static void load_head(kvc_cache* c, const float* x) {
    const uint32_t d = c->cfg.head_dim, half = d / 2;
    const int neox = c->cfg.rope == KVC_ROPE_NEOX;
    uint32_t i, j;
    for (i = 0; i < d; ++i) c->head[i] = (long double)x[i];
    if (c->cfg.rope == KVC_ROPE_NONE) return;
    for (j = 0; j < half; ++j) {
        const uint32_t a = neox ? j : 2 * j;
        const uint32_t b = neox ? j + half : 2 * j + 1;
        const long double xa = c->head[a], xb = c->head[b];
        c->head[a] = xa * c->rope_cos[j] - xb * c->rope_sin[j];
        c->head[b] = xa * c->rope_sin[j] + xb * c->rope_cos[j];
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Attention for one query head against the first n_visible rows of one KV head:
 *
 *   out = softmax(scale * q . K^T) . V        q, out: [head_dim]   K, V rows: [n_visible][head_dim]
 *
 * We promise precision class F32 (q as given, K/V widened from the cache dtype, arithmetic in at least f32) and
 * actually compute in double. Our own rounding error is then far below what the class allows, so when this plugin
 * disagrees with the reference, the cause is a logic error, never summation order.
 *
 * The softmax takes two passes over the keys instead of keeping an array of scores. That way the only scratch is
 * a few head_dim-sized vectors, whatever max_tokens is: the harness counts every byte we allocate beyond the K/V
 * storage we report (property NO-Q), and a scratch array sized by max_tokens would grow with the config.
 * ------------------------------------------------------------------------------------------------------------ */

/* scale * (q . key) for the key whose first element is at index `key` of the K array. */
static double score(const kvc_cache* c, const long double* q, size_t key) {
    double dot = 0.0;
    uint32_t i;
    for (i = 0; i < c->cfg.head_dim; ++i) dot += (double)q[i] * (double)load_elem(c, c->k, key + i);
    return dot * (double)c->cfg.scale;
}

static void attend_one_head(kvc_cache* c, size_t stream_start, uint32_t n_visible, uint32_t kv_head,
                            const long double* q, float* out) {
    const uint32_t d = c->cfg.head_dim;
    const size_t head_offset = (size_t)kv_head * d;
    double max_score = -(double)INFINITY, sum = 0.0;
    uint32_t j, i;

    /* Pass 1: the largest score. Subtracting it before exponentiating keeps every exponent <= 0, so nothing
       overflows, and makes the largest term exactly 1, so the sum below is never 0 (a "stable" softmax). */
    for (j = 0; j < n_visible; ++j) {
        const double s = score(c, q, stream_start + (size_t)j * c->row_elems + head_offset);
        if (s > max_score) max_score = s;
    }

    /* Pass 2: each row's weight exp(score - max), their sum, and the weighted sum of the value rows. */
    for (i = 0; i < d; ++i) c->acc[i] = 0.0;
    for (j = 0; j < n_visible; ++j) {
        const size_t row = stream_start + (size_t)j * c->row_elems + head_offset;
        const double w = exp(score(c, q, row) - max_score);
        sum += w;
        for (i = 0; i < d; ++i) c->acc[i] += w * (double)load_elem(c, c->v, row + i);
    }

    /* Normalise once at the end: dividing by the sum turns the weights into probabilities. */
    for (i = 0; i < d; ++i) out[i] = (float)(c->acc[i] / sum);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The ABI entry points.
 * ------------------------------------------------------------------------------------------------------------ */

/* get_caps may be handed an older, shorter kvc_caps: fill ours, then copy only the bytes the caller's struct_size
   says it has (struct_size itself stays the caller's). */
static void ex_get_caps(kvc_caps* out) {
    kvc_caps caps;
    size_t n;
    if (out == NULL) return;
    memset(&caps, 0, sizeof caps);
    caps.struct_size = out->struct_size;
    caps.dtypes = (1u << KVC_DTYPE_F32) | (1u << KVC_DTYPE_F16) | (1u << KVC_DTYPE_BF16);
    caps.rope_variants = (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    caps.features = KVC_FEATURE_GQA | KVC_FEATURE_FORK | KVC_FEATURE_RELEASE | KVC_FEATURE_CHUNKED;
    caps.precision = KVC_PRECISION_F32;
    caps.memory_space = KVC_MEMORY_HOST;
    caps.max_layers = EX_MAX_LAYERS;
    caps.max_q_heads = EX_MAX_Q_HEADS;
    caps.max_kv_heads = EX_MAX_KV_HEADS;
    caps.max_head_dim = EX_MAX_HEAD_DIM;
    caps.max_seqs = EX_MAX_SEQS;
    caps.max_tokens = EX_MAX_TOKENS;
    n = out->struct_size < sizeof caps ? out->struct_size : sizeof caps;
    memcpy(out, &caps, n);
}

static void ex_destroy(kvc_cache* c) {
    if (c == NULL) return;
    free(c->k);
    free(c->v);
    free(c->length);
    free(c->acc);
    free(c->head);
    free(c->rope_cos);
    free(c->rope_sin);
    free(c);
}

/* Checks a config against the ABI's rules and our limits. The first problem found is the message. */
static kvc_status check_config(const kvc_config* cfg) {
    if (cfg->cache_dtype > KVC_DTYPE_BF16)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: unknown cache_dtype %u (f32 = 0, f16 = 1, bf16 = 2)",
                    (unsigned)cfg->cache_dtype);
    if (cfg->rope > KVC_ROPE_GPTJ)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: unknown rope %u (none = 0, neox = 1, gptj = 2)",
                    (unsigned)cfg->rope);
    if (cfg->n_layers == 0 || cfg->n_q_heads == 0 || cfg->n_kv_heads == 0 || cfg->head_dim == 0 ||
        cfg->max_seqs == 0 || cfg->max_tokens == 0)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT,
                    "create: n_layers, n_q_heads, n_kv_heads, head_dim, max_seqs and max_tokens must all be positive "
                    "(got %u, %u, %u, %u, %u, %u)",
                    (unsigned)cfg->n_layers, (unsigned)cfg->n_q_heads, (unsigned)cfg->n_kv_heads,
                    (unsigned)cfg->head_dim, (unsigned)cfg->max_seqs, (unsigned)cfg->max_tokens);
    if (cfg->n_q_heads % cfg->n_kv_heads != 0)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: n_q_heads (%u) is not a multiple of n_kv_heads (%u)",
                    (unsigned)cfg->n_q_heads, (unsigned)cfg->n_kv_heads);
    if (cfg->rope != KVC_ROPE_NONE && cfg->head_dim % 2 != 0)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: head_dim (%u) must be even when rope is not none",
                    (unsigned)cfg->head_dim);
    if (cfg->rope != KVC_ROPE_NONE && !(isfinite(cfg->rope_theta) && cfg->rope_theta > 0.0f))
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: rope_theta (%g) must be a positive finite number",
                    (double)cfg->rope_theta);
    if (!isfinite(cfg->scale))
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: scale (%g) must be finite", (double)cfg->scale);
    if (cfg->n_layers > EX_MAX_LAYERS || cfg->n_q_heads > EX_MAX_Q_HEADS || cfg->n_kv_heads > EX_MAX_KV_HEADS ||
        cfg->head_dim > EX_MAX_HEAD_DIM || cfg->max_seqs > EX_MAX_SEQS || cfg->max_tokens > EX_MAX_TOKENS)
        return fail(NULL, KVC_ERR_UNSUPPORTED,
                    "create: config exceeds the declared limits (layers <= %u, q heads <= %u, kv heads <= %u, "
                    "head_dim <= %u, seqs <= %u, tokens <= %u)",
                    EX_MAX_LAYERS, EX_MAX_Q_HEADS, EX_MAX_KV_HEADS, EX_MAX_HEAD_DIM, EX_MAX_SEQS, EX_MAX_TOKENS);
    return KVC_OK;
}

static kvc_status ex_create(const kvc_config* config, kvc_cache** out) {
    kvc_config cfg;
    kvc_cache* c;
    kvc_status s;
    uint64_t total;
    size_t elem_bytes, row_elems;

    if (out != NULL) *out = NULL;
    if (config == NULL || out == NULL)
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: config and out must not be NULL");
    /* ABI 1.0 defines every member of kvc_config; a shorter struct is a caller bug. A longer one comes from a newer
       minor version, whose extra members we do not know and leave alone. */
    if (config->struct_size < sizeof(kvc_config))
        return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "create: config struct_size %u is smaller than kvc_config (%u)",
                    (unsigned)config->struct_size, (unsigned)sizeof(kvc_config));
    memcpy(&cfg, config, sizeof cfg);
    cfg.struct_size = sizeof cfg;
    s = check_config(&cfg);
    if (s != KVC_OK) return s;

    /* The limits checked above keep this product below 2^53, so it cannot overflow. */
    elem_bytes = cfg.cache_dtype == KVC_DTYPE_F32 ? 4 : 2;
    row_elems = (size_t)cfg.n_kv_heads * cfg.head_dim;
    total = 2u * (uint64_t)cfg.max_seqs * cfg.n_layers * cfg.max_tokens * row_elems * elem_bytes;
    if (total > EX_MAX_CACHE_BYTES)
        return fail(NULL, KVC_ERR_OUT_OF_MEMORY,
                    "create: K and V would take %llu bytes (max_seqs * n_layers * max_tokens * n_kv_heads * head_dim "
                    "* %u bytes * 2); this plugin allocates them up front and stops at %llu",
                    (unsigned long long)total, (unsigned)elem_bytes, (unsigned long long)EX_MAX_CACHE_BYTES);

    c = (kvc_cache*)calloc(1, sizeof *c);
    if (c == NULL) return fail(NULL, KVC_ERR_OUT_OF_MEMORY, "create: out of memory");
    c->cfg = cfg;
    c->elem_bytes = elem_bytes;
    c->row_elems = row_elems;
    c->total_bytes = (size_t)total;
    /* calloc, not malloc: the memory starts as zeros, and for large arrays the C library maps it lazily, so the
       pages a short test never touches cost nothing. */
    c->k = (unsigned char*)calloc(total / 2, 1);
    c->v = (unsigned char*)calloc(total / 2, 1);
    c->length = (uint32_t*)calloc((size_t)cfg.max_seqs * cfg.n_layers, sizeof *c->length);
    c->acc = (double*)calloc(cfg.head_dim, sizeof *c->acc);
    c->head = (long double*)calloc(cfg.head_dim, sizeof *c->head);
    c->rope_cos = (long double*)calloc(cfg.head_dim / 2 + 1, sizeof *c->rope_cos);
    c->rope_sin = (long double*)calloc(cfg.head_dim / 2 + 1, sizeof *c->rope_sin);
    if (!c->k || !c->v || !c->length || !c->acc || !c->head || !c->rope_cos || !c->rope_sin) {
        ex_destroy(c);
        return fail(NULL, KVC_ERR_OUT_OF_MEMORY, "create: could not allocate %llu bytes of K/V storage",
                    (unsigned long long)total);
    }
    strcpy(c->error, "no error");
    *out = c;
    return KVC_OK;
}

static const char* ex_last_error(const kvc_cache* c) { return c ? c->error : g_create_error; }

/* The checks every call on a stream starts with. `op` names the call in the message. */
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
 * append_attend: append n_new tokens' K and V to (seq, layer), then attend with their n_new queries.
 *   q, out: [n_new][n_q_heads][head_dim]    k, v: [n_new][n_kv_heads][head_dim]    (float32, whatever the dtype)
 *
 * New token t lands at position len + t, where len is the stream's length before the call. Its query sees rows
 * 0 .. len + t: everything cached before, plus the new rows up to and including its own ("causal, bottom-right
 * aligned"). A decode step (n_new = 1), a prefill (len = 0) and a chunk of a chunked prefill are all this one rule.
 */
static kvc_status ex_append_attend(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                   const float* k, const float* v, float* out) {
    const uint32_t d = c ? c->cfg.head_dim : 0;
    uint32_t len, t, h;
    size_t stream;
    kvc_status s;

    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "append_attend: cache is NULL");
    s = check_stream(c, "append_attend", seq, layer);
    if (s != KVC_OK) return s;
    if (n_new == 0) return KVC_OK; /* nothing to append, nothing to attend, and the pointers may be NULL */
    if (!q || !k || !v || !out)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "append_attend: q, k, v and out must not be NULL when n_new > 0");
    len = *length_of(c, seq, layer);
    if (n_new > c->cfg.max_tokens - len) /* written this way round so that len + n_new cannot wrap */
        return fail(c, KVC_ERR_OUT_OF_MEMORY,
                    "append_attend: seq %u layer %u holds %u tokens; %u more would exceed max_tokens (%u)",
                    (unsigned)seq, (unsigned)layer, (unsigned)len, (unsigned)n_new, (unsigned)c->cfg.max_tokens);
    /* From here on nothing can fail, so a failed call never leaves a half-written stream behind. */

    stream = row_index(c, seq, layer, 0);

    /* 1. Write the new rows: V as given, K rotated to its position first. Both are rounded to the cache dtype,
          and from now on only the rounded values exist: attention reads them back like any older row. */
    for (t = 0; t < n_new; ++t) {
        const size_t row = stream + (size_t)(len + t) * c->row_elems;
        const float* k_row = k + (size_t)t * c->row_elems;
        const float* v_row = v + (size_t)t * c->row_elems;
        uint32_t g, i;
        if (c->cfg.rope != KVC_ROPE_NONE) rope_prepare(c, len + t);
        for (g = 0; g < c->cfg.n_kv_heads; ++g) {
            load_head(c, k_row + (size_t)g * d);
            for (i = 0; i < d; ++i) store_elem(c, c->k, row + (size_t)g * d + i, (float)c->head[i]);
        }
        for (i = 0; i < c->row_elems; ++i) store_elem(c, c->v, row + i, v_row[i]);
    }
    *length_of(c, seq, layer) = len + n_new;

    /* 2. Attend. Query head h reads KV head h / group: consecutive query heads share one KV head (GQA; with one
          KV head, MQA). Each query is rotated to its own position, like its key was. */
    for (t = 0; t < n_new; ++t) {
        const uint32_t group = c->cfg.n_q_heads / c->cfg.n_kv_heads;
        const uint32_t n_visible = len + t + 1;
        if (c->cfg.rope != KVC_ROPE_NONE) rope_prepare(c, len + t);
        for (h = 0; h < c->cfg.n_q_heads; ++h) {
            const size_t at = ((size_t)t * c->cfg.n_q_heads + h) * d;
            load_head(c, q + at);
            attend_one_head(c, stream, n_visible, h / group, c->head, out + at);
        }
    }
    return KVC_OK;
}

/* read_kv: rows pos .. pos+n-1 of (seq, layer), as stored. They are contiguous, so this is one copy per array. */
static kvc_status ex_read_kv(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                             void* v_out) {
    uint32_t len;
    size_t first, bytes;
    kvc_status s;

    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "read_kv: cache is NULL");
    s = check_stream(c, "read_kv", seq, layer);
    if (s != KVC_OK) return s;
    len = *length_of(c, seq, layer);
    if (pos > len || n > len - pos)
        return fail(c, KVC_ERR_INVALID_ARGUMENT,
                    "read_kv: %u rows from position %u requested, but seq %u layer %u holds only %u", (unsigned)n,
                    (unsigned)pos, (unsigned)seq, (unsigned)layer, (unsigned)len);
    if (n == 0) return KVC_OK;
    if (k_out == NULL || v_out == NULL)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "read_kv: k_out and v_out must not be NULL when n > 0");
    first = row_index(c, seq, layer, pos) * c->elem_bytes;
    bytes = (size_t)n * c->row_elems * c->elem_bytes;
    memcpy(k_out, c->k + first, bytes);
    memcpy(v_out, c->v + first, bytes);
    return KVC_OK;
}

static kvc_status ex_seq_length(kvc_cache* c, uint32_t seq, uint32_t layer, uint32_t* length) {
    kvc_status s;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "seq_length: cache is NULL");
    s = check_stream(c, "seq_length", seq, layer);
    if (s != KVC_OK) return s;
    if (length == NULL) return fail(c, KVC_ERR_INVALID_ARGUMENT, "seq_length: length must not be NULL");
    *length = *length_of(c, seq, layer);
    return KVC_OK;
}

/*
 * memory: what we hold, in the ABI's three numbers. Storage is exact per token, so block_size is 1 and the rows
 * holding live tokens are exactly the live bytes. Everything else we allocated (every row not holding a live
 * token) is pool. Fork copies rows instead of sharing them, so a forked prefix counts twice in both live and
 * capacity.
 */
static kvc_status ex_memory(kvc_cache* c, kvc_memory* out) {
    kvc_memory m;
    uint64_t tokens = 0;
    size_t i, n;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "memory: cache is NULL");
    if (out == NULL) return fail(c, KVC_ERR_INVALID_ARGUMENT, "memory: out must not be NULL");
    for (i = 0; i < (size_t)c->cfg.max_seqs * c->cfg.n_layers; ++i) tokens += c->length[i];
    memset(&m, 0, sizeof m);
    m.struct_size = out->struct_size;
    m.block_size = 1;
    m.live_bytes = 2u * tokens * c->row_elems * c->elem_bytes;
    m.capacity_bytes = m.live_bytes;
    m.pool_bytes = (uint64_t)c->total_bytes - m.capacity_bytes;
    n = out->struct_size < sizeof m ? out->struct_size : sizeof m;
    memcpy(out, &m, n);
    return KVC_OK;
}

/* A sequence "exists" once any of its layers holds a row. */
static int seq_is_empty(const kvc_cache* c, uint32_t seq) {
    uint32_t layer;
    for (layer = 0; layer < c->cfg.n_layers; ++layer)
        if (*length_of(c, seq, layer) != 0) return 0;
    return 1;
}

/* fork: the empty sequence child gets a copy of every layer of parent. Copying is the textbook answer; a paged
   cache would share the parent's blocks and copy a block only when one side writes into it. */
static kvc_status ex_fork(kvc_cache* c, uint32_t parent, uint32_t child) {
    uint32_t layer;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "fork: cache is NULL");
    if (parent >= c->cfg.max_seqs || child >= c->cfg.max_seqs)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "fork: parent %u or child %u is out of range (max_seqs is %u)",
                    (unsigned)parent, (unsigned)child, (unsigned)c->cfg.max_seqs);
    if (parent == child)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "fork: parent and child are both %u", (unsigned)parent);
    if (seq_is_empty(c, parent))
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "fork: parent %u is unknown (it holds no tokens)", (unsigned)parent);
    if (!seq_is_empty(c, child))
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "fork: child %u is not empty (release it first)", (unsigned)child);
    for (layer = 0; layer < c->cfg.n_layers; ++layer) {
        const uint32_t len = *length_of(c, parent, layer);
        const size_t from = row_index(c, parent, layer, 0) * c->elem_bytes;
        const size_t to = row_index(c, child, layer, 0) * c->elem_bytes;
        const size_t bytes = (size_t)len * c->row_elems * c->elem_bytes;
        memcpy(c->k + to, c->k + from, bytes);
        memcpy(c->v + to, c->v + from, bytes);
        *length_of(c, child, layer) = len;
    }
    return KVC_OK;
}

/* release: a started sequence is empty again in every layer, and its next append starts at position 0. The old rows
   stay in memory but lie past the length, where nothing reads them; the next append overwrites them. The ABI makes
   releasing a sequence that holds no rows an error: it usually means the caller lost track of its sequences. */
static kvc_status ex_release(kvc_cache* c, uint32_t seq) {
    uint32_t layer;
    if (c == NULL) return fail(NULL, KVC_ERR_INVALID_ARGUMENT, "release: cache is NULL");
    if (seq >= c->cfg.max_seqs)
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "release: seq %u is out of range (max_seqs is %u)", (unsigned)seq,
                    (unsigned)c->cfg.max_seqs);
    if (seq_is_empty(c, seq))
        return fail(c, KVC_ERR_INVALID_ARGUMENT, "release: seq %u holds no rows (never started, or already released)",
                    (unsigned)seq);
    for (layer = 0; layer < c->cfg.n_layers; ++layer) *length_of(c, seq, layer) = 0;
    return KVC_OK;
}

/* The table the harness receives. append_attend_batch is OPTIONAL and we do not declare KVC_FEATURE_BATCH, so it
   stays NULL. struct_size tells a newer harness which members this (1.0) table has. */
static const kvc_plugin_api g_api = {
    sizeof(kvc_plugin_api),
    KVC_ABI_VERSION_MAJOR,
    KVC_ABI_VERSION_MINOR,
    "example-c",
    "1.0.0",
    ex_get_caps,
    ex_create,
    ex_destroy,
    ex_last_error,
    ex_append_attend,
    NULL, /* append_attend_batch */
    ex_read_kv,
    ex_seq_length,
    ex_memory,
    ex_fork,
    ex_release,
    NULL, /* read_kv_scales: no quantized dtype declared */
};

/* A different major version means a different contract: refuse it. Any minor version is fine: an older harness
   ignores members it does not know, a newer one checks struct_size before using members we lack. */
const kvc_plugin_api* kvc_example_entry(uint32_t abi_major, uint32_t abi_minor) {
    (void)abi_minor;
    return abi_major == KVC_ABI_VERSION_MAJOR ? &g_api : NULL;
}
