/*
 * An example model-level plugin (include/kvcheck/model_abi.h), written the way single-file C inference programs are:
 * one token per forward step, a fixed [layer][pos][kv_dim] cache preallocated for seq_len positions, the weights
 * read from a flat f32 checkpoint behind a 7-int32 header, attention inlined in forward. It shows how such an
 * engine is wrapped without changing its arithmetic: the table's forward() loops over the tokens it is given and
 * runs the one-token step on each (docs/model-level.md, "Wrapping a single-file engine").
 *
 * One sequence (id 0) per model. The KVX_* macros below are seams the tests' broken doubles redefine
 * (tests/model_level/doubles/): each default is the correct behaviour.
 */
#include "kvcheck/model_abi.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVX_ENTRY
#define KVX_ENTRY kvcm_model_example_entry /* the entry's own name; plugin_entry.c exports it as kvcheck_model_entry */
#endif
#ifndef KVX_NAME
#define KVX_NAME "model-example-c"
#endif
#ifndef KVX_READ_LAYER
#define KVX_READ_LAYER(l) (l) /* the layer whose cache the attention of layer l reads */
#endif
#ifndef KVX_ROPE_POS
#define KVX_ROPE_POS(pos, i_in_call, n_in_call) (pos) /* the position token i of an n-token call is rotated by */
#endif
#ifndef KVX_EPS
#define KVX_EPS(eps) (eps) /* the RMSNorm epsilon the engine uses */
#endif
#ifndef KVX_THETA
#define KVX_THETA(theta) (theta) /* the RoPE base the engine uses */
#endif
#ifndef KVX_FIXED_THETA
#define KVX_FIXED_THETA 0.0f /* what get_caps declares as the one RoPE base it computes with (0: any) */
#endif
#ifndef KVX_FIXED_EPS
#define KVX_FIXED_EPS 0.0f /* the same for the RMSNorm epsilon */
#endif
#ifndef KVX_SHARED_CLASSIFIER
#define KVX_SHARED_CLASSIFIER(vocab_field) ((vocab_field) > 0) /* the header's sign: positive = tied */
#endif

const kvcm_model_api* KVX_ENTRY(uint32_t harness_abi_major, uint32_t harness_abi_minor);

/* The checkpoint header, as the file stores it. */
typedef struct {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
} Header;

/* Pointers into the checkpoint's floats. Matrices are [out][in]: y[i] = sum_j W[i][j] x[j]. */
typedef struct {
    const float *token_embedding; /* [vocab][dim] */
    const float *rms_att;         /* [layer][dim] */
    const float *wq, *wk, *wv;    /* [layer][dim | kv_dim][dim] */
    const float *wo;              /* [layer][dim][dim] */
    const float *rms_ffn;         /* [layer][dim] */
    const float *w1, *w2, *w3;    /* gate [layer][hidden][dim], down [layer][dim][hidden], up [layer][hidden][dim] */
    const float *rms_final;       /* [dim] */
    const float *wcls;            /* [vocab][dim]: the embedding itself when shared */
} Weights;

struct kvcm_model {
    kvcm_model_desc desc;
    int dim, hidden, n_layers, n_heads, n_kv_heads, head_size, kv_dim, vocab, seq_len;
    float eps, theta;
    uint32_t rope;
    float* file;       /* the checkpoint's floats (a private copy) */
    Weights w;
    float *x, *xb, *xb2, *hb, *hb2, *q, *att, *logits; /* activations of the current token */
    float *key_cache, *value_cache;                    /* [layer][seq_len][kv_dim] */
    int pos;           /* tokens held */
    uint64_t projected;
    char error[256];
};

static char create_error[256] = "no error";

static void set_error(char* buf, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, 256, fmt, ap);
    va_end(ap);
}

/* ---- the single-file engine's arithmetic ---- */

static void rmsnorm(float* o, const float* x, const float* g, int n, float eps) {
    float ss = 0.0f;
    for (int j = 0; j < n; j++) ss += x[j] * x[j];
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    for (int j = 0; j < n; j++) o[j] = g[j] * (ss * x[j]);
}

static void softmax(float* x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* W [d][n] times x [n] -> out [d] */
static void matmul(float* out, const float* x, const float* w, int n, int d) {
    for (int i = 0; i < d; i++) {
        float v = 0.0f;
        for (int j = 0; j < n; j++) v += w[(size_t)i * n + j] * x[j];
        out[i] = v;
    }
}

/* Rotates one head vector by pos: pair j turns by pos * theta^(-2j/hs), angles in f32 as such programs do. */
static void rope_head(float* v, int hs, int pos, uint32_t variant, float theta) {
    for (int j = 0; j < hs / 2; j++) {
        const float freq = 1.0f / powf(theta, (float)(2 * j) / (float)hs);
        const float angle = (float)pos * freq;
        const float c = cosf(angle), s = sinf(angle);
        const int a = variant == KVC_ROPE_NEOX ? j : 2 * j;
        const int b = variant == KVC_ROPE_NEOX ? j + hs / 2 : 2 * j + 1;
        const float v0 = v[a], v1 = v[b];
        v[a] = v0 * c - v1 * s;
        v[b] = v0 * s + v1 * c;
    }
}

/* One token at position m->pos through every layer; its K and V land in the cache; logits in m->logits. */
static void forward_one(kvcm_model* m, int token, int i_in_call, int n_in_call) {
    const Weights* w = &m->w;
    const int dim = m->dim, kv_dim = m->kv_dim, hs = m->head_size, hidden = m->hidden, pos = m->pos;
    const int kv_mul = m->n_heads / m->n_kv_heads; /* query heads per KV head */
    (void)i_in_call; /* read only by a redefined KVX_ROPE_POS */
    (void)n_in_call;
    float* x = m->x;
    memcpy(x, w->token_embedding + (size_t)token * dim, (size_t)dim * sizeof *x);

    for (int l = 0; l < m->n_layers; l++) {
        rmsnorm(m->xb, x, w->rms_att + (size_t)l * dim, dim, m->eps);
        const size_t loff = (size_t)l * m->seq_len * kv_dim;
        float* k = m->key_cache + loff + (size_t)pos * kv_dim;
        float* v = m->value_cache + loff + (size_t)pos * kv_dim;
        matmul(m->q, m->xb, w->wq + (size_t)l * dim * dim, dim, dim);
        matmul(k, m->xb, w->wk + (size_t)l * dim * kv_dim, dim, kv_dim);
        matmul(v, m->xb, w->wv + (size_t)l * dim * kv_dim, dim, kv_dim);
        if (m->rope != KVC_ROPE_NONE) {
            const int rpos = KVX_ROPE_POS(pos, i_in_call, n_in_call);
            for (int h = 0; h < m->n_heads; h++) rope_head(m->q + h * hs, hs, rpos, m->rope, m->theta);
            for (int h = 0; h < m->n_kv_heads; h++) rope_head(k + h * hs, hs, rpos, m->rope, m->theta);
        }
        /* attention over positions 0..pos of this layer's cache */
        const size_t roff = (size_t)(KVX_READ_LAYER(l)) * m->seq_len * kv_dim;
        for (int h = 0; h < m->n_heads; h++) {
            const float* qh = m->q + h * hs;
            const int kvh = h / kv_mul;
            for (int t = 0; t <= pos; t++) {
                const float* kt = m->key_cache + roff + (size_t)t * kv_dim + kvh * hs;
                float score = 0.0f;
                for (int i = 0; i < hs; i++) score += qh[i] * kt[i];
                m->att[t] = score / sqrtf((float)hs);
            }
            softmax(m->att, pos + 1);
            float* out = m->xb + h * hs;
            memset(out, 0, (size_t)hs * sizeof *out);
            for (int t = 0; t <= pos; t++) {
                const float* vt = m->value_cache + roff + (size_t)t * kv_dim + kvh * hs;
                for (int i = 0; i < hs; i++) out[i] += m->att[t] * vt[i];
            }
        }
        matmul(m->xb2, m->xb, w->wo + (size_t)l * dim * dim, dim, dim);
        for (int i = 0; i < dim; i++) x[i] += m->xb2[i];

        rmsnorm(m->xb, x, w->rms_ffn + (size_t)l * dim, dim, m->eps);
        matmul(m->hb, m->xb, w->w1 + (size_t)l * dim * hidden, dim, hidden);
        matmul(m->hb2, m->xb, w->w3 + (size_t)l * dim * hidden, dim, hidden);
        for (int i = 0; i < hidden; i++) {
            float g = m->hb[i];
            g *= 1.0f / (1.0f + expf(-g)); /* silu */
            m->hb[i] = g * m->hb2[i];
        }
        matmul(m->xb, m->hb, w->w2 + (size_t)l * dim * hidden, hidden, dim);
        for (int i = 0; i < dim; i++) x[i] += m->xb[i];
    }
    rmsnorm(x, x, w->rms_final, dim, m->eps);
    matmul(m->logits, x, w->wcls, dim, m->vocab);
    m->pos++;
    m->projected++;
}

/* ---- the table ---- */

#define MAX_SIZE 65536 /* every header number at most this: sizes below stay far inside 64 bits */

static void example_get_caps(kvcm_caps* out) {
    kvcm_caps c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.features = KVCM_FEATURE_ALL_LOGITS | KVCM_FEATURE_PROMPT | KVCM_FEATURE_CHUNKED | KVCM_FEATURE_RELEASE |
                 KVCM_FEATURE_READ_KV | KVCM_FEATURE_TIED | KVCM_FEATURE_UNTIED | KVCM_FEATURE_KV_PROJECTIONS;
    c.weight_formats = 1u << KVCM_WEIGHTS_FLAT_F32;
    c.cache_dtypes = 1u << KVC_DTYPE_F32;
    c.rope_variants = (1u << KVC_ROPE_NONE) | (1u << KVC_ROPE_NEOX) | (1u << KVC_ROPE_GPTJ);
    c.max_context = 4096;
    c.max_seqs = 1;
    c.max_layers = 64;
    c.max_heads = 64;
    c.max_kv_heads = 64;
    c.max_head_dim = 256;
    c.max_dim = 4096;
    c.max_hidden_dim = 16384;
    c.max_vocab = MAX_SIZE;
    c.fixed_rope_theta = KVX_FIXED_THETA;
    c.fixed_rms_eps = KVX_FIXED_EPS;
    *out = c;
}

static void example_destroy(kvcm_model* m) {
    if (m == NULL) return;
    free(m->file);
    free(m->x);
    free(m->key_cache);
    free(m->value_cache);
    free(m);
}

/* Reads the checkpoint (file or memory) into a malloc'd buffer; NULL with create_error set on failure. */
static unsigned char* load_bytes(const kvcm_weights* wt, size_t* size) {
    if (wt->data != NULL) {
        unsigned char* b = malloc(wt->size ? (size_t)wt->size : 1);
        if (b == NULL) {
            set_error(create_error, "out of memory copying %llu weight bytes", (unsigned long long)wt->size);
            return NULL;
        }
        memcpy(b, wt->data, (size_t)wt->size);
        *size = (size_t)wt->size;
        return b;
    }
    FILE* f = fopen(wt->path, "rb");
    if (f == NULL) {
        set_error(create_error, "checkpoint %s: cannot be opened", wt->path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char* b = malloc(cap);
    while (b != NULL) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap) break;
        unsigned char* bigger = realloc(b, cap * 2);
        if (bigger == NULL) {
            free(b);
            b = NULL;
            break;
        }
        b = bigger;
        cap *= 2;
    }
    const int failed = ferror(f);
    fclose(f);
    if (b == NULL || failed) {
        free(b);
        set_error(create_error, "checkpoint %s: read error", wt->path);
        return NULL;
    }
    *size = n;
    return b;
}

static kvc_status example_create(const kvcm_model_desc* d, const kvcm_weights* wt, kvcm_model** out) {
    if (d == NULL || wt == NULL || out == NULL || d->struct_size < sizeof *d || wt->struct_size < sizeof *wt) {
        set_error(create_error, "create: a NULL argument or a struct_size below ABI 1.0");
        return KVC_ERR_INVALID_ARGUMENT;
    }
    if (wt->format != KVCM_WEIGHTS_FLAT_F32) {
        set_error(create_error, "weights format %u: this engine reads the flat f32 checkpoint only", wt->format);
        return KVC_ERR_UNSUPPORTED;
    }
    if ((wt->path == NULL) == (wt->data == NULL)) {
        set_error(create_error, "weights: exactly one of path and data must be set");
        return KVC_ERR_INVALID_ARGUMENT;
    }
    if (d->max_seqs != 1 || d->cache_dtype != KVC_DTYPE_F32 || d->rope > KVC_ROPE_GPTJ ||
        d->n_heads * d->head_dim != d->dim || d->max_context > 4096) {
        set_error(create_error, "description outside this engine: one sequence, f32 cache, head_dim = dim / n_heads, "
                                "max_context <= 4096");
        return KVC_ERR_UNSUPPORTED;
    }
    size_t size = 0;
    unsigned char* bytes = load_bytes(wt, &size);
    if (bytes == NULL) return KVC_ERR_INVALID_ARGUMENT;
    Header h;
    if (size < sizeof h) {
        free(bytes);
        set_error(create_error, "checkpoint of %zu bytes: shorter than its 28-byte header", size);
        return KVC_ERR_INVALID_ARGUMENT;
    }
    memcpy(&h, bytes, sizeof h);
    const int32_t hv[7] = {h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size, h.seq_len};
    for (int i = 0; i < 7; i++)
        if (hv[i] == 0 || hv[i] > MAX_SIZE || hv[i] < -MAX_SIZE || (i != 5 && hv[i] < 0)) {
            free(bytes);
            set_error(create_error, "checkpoint header value %d (%ld) is out of range", i, (long)hv[i]);
            return KVC_ERR_INVALID_ARGUMENT;
        }
    const int separate_in_file = h.vocab_size < 0;         /* the file's layout follows the sign */
    const int shared = KVX_SHARED_CLASSIFIER(h.vocab_size); /* which table the classifier reads */
    const int vocab = abs(h.vocab_size);
    if ((uint32_t)h.dim != d->dim || (uint32_t)h.hidden_dim != d->hidden_dim || (uint32_t)h.n_layers != d->n_layers ||
        (uint32_t)h.n_heads != d->n_heads || (uint32_t)h.n_kv_heads != d->n_kv_heads ||
        (uint32_t)vocab != d->vocab_size || (h.vocab_size > 0) != (d->tied != 0) ||
        (uint32_t)h.seq_len < d->max_context || h.n_heads % h.n_kv_heads != 0) {
        free(bytes);
        set_error(create_error, "checkpoint header (dim %d, hidden %d, layers %d, heads %d, kv heads %d, vocab %d, "
                                "seq_len %d) does not match the description", h.dim, h.hidden_dim, h.n_layers,
                  h.n_heads, h.n_kv_heads, h.vocab_size, h.seq_len);
        return KVC_ERR_INVALID_ARGUMENT;
    }
    const uint64_t dim = (uint64_t)h.dim, L = (uint64_t)h.n_layers, hid = (uint64_t)h.hidden_dim;
    const uint64_t hs = dim / (uint64_t)h.n_heads, kv_dim = hs * (uint64_t)h.n_kv_heads;
    const uint64_t floats = (uint64_t)vocab * dim + L * dim + L * dim * dim + 2 * L * dim * kv_dim + L * dim * dim +
                            L * dim + 3 * L * dim * hid + dim + 2 * (uint64_t)h.seq_len * (hs / 2) +
                            (separate_in_file ? (uint64_t)vocab * dim : 0);
    if ((uint64_t)size != sizeof h + 4 * floats) {
        free(bytes);
        set_error(create_error, "checkpoint of %zu bytes: the header's sizes need %llu", size,
                  (unsigned long long)(sizeof h + 4 * floats));
        return KVC_ERR_INVALID_ARGUMENT;
    }
    kvcm_model* m = calloc(1, sizeof *m);
    if (m == NULL) {
        free(bytes);
        set_error(create_error, "out of memory");
        return KVC_ERR_OUT_OF_MEMORY;
    }
    m->desc = *d;
    m->dim = h.dim;
    m->hidden = h.hidden_dim;
    m->n_layers = h.n_layers;
    m->n_heads = h.n_heads;
    m->n_kv_heads = h.n_kv_heads;
    m->head_size = (int)hs;
    m->kv_dim = (int)kv_dim;
    m->vocab = vocab;
    m->seq_len = h.seq_len;
    m->eps = KVX_EPS(d->rms_eps);
    m->theta = KVX_THETA(d->rope_theta);
    m->rope = d->rope;
    m->file = malloc(4 * (size_t)floats);
    const size_t act = (size_t)(3 * dim + 2 * hid + dim + (uint64_t)h.seq_len + (uint64_t)vocab);
    m->x = malloc(act * sizeof(float));
    m->key_cache = malloc((size_t)(L * (uint64_t)h.seq_len * kv_dim) * sizeof(float));
    m->value_cache = malloc((size_t)(L * (uint64_t)h.seq_len * kv_dim) * sizeof(float));
    if (m->file == NULL || m->x == NULL || m->key_cache == NULL || m->value_cache == NULL) {
        free(bytes);
        example_destroy(m);
        set_error(create_error, "out of memory");
        return KVC_ERR_OUT_OF_MEMORY;
    }
    memcpy(m->file, bytes + sizeof h, 4 * (size_t)floats);
    free(bytes);
    m->xb = m->x + dim;
    m->xb2 = m->xb + dim;
    m->q = m->xb2 + dim;
    m->hb = m->q + dim;
    m->hb2 = m->hb + hid;
    m->att = m->hb2 + hid;
    m->logits = m->att + h.seq_len;

    const float* p = m->file;
    Weights* w = &m->w;
    w->token_embedding = p; p += (size_t)vocab * dim;
    w->rms_att = p;         p += L * dim;
    w->wq = p;              p += L * dim * dim;
    w->wk = p;              p += L * dim * kv_dim;
    w->wv = p;              p += L * dim * kv_dim;
    w->wo = p;              p += L * dim * dim;
    w->rms_ffn = p;         p += L * dim;
    w->w1 = p;              p += L * dim * hid;
    w->w2 = p;              p += L * dim * hid;
    w->w3 = p;              p += L * dim * hid;
    w->rms_final = p;       p += dim;
    p += 2 * (size_t)h.seq_len * (hs / 2); /* the legacy RoPE tables: unused */
    w->wcls = shared ? w->token_embedding : p;
    *out = m;
    return KVC_OK;
}

static const char* example_last_error(const kvcm_model* m) { return m ? m->error : create_error; }

static kvc_status example_forward(kvcm_model* m, uint32_t seq, uint32_t n, const int32_t* tokens, float* logits) {
    if (seq != 0) {
        set_error(m->error, "forward: sequence %u (this engine holds sequence 0 only)", seq);
        return KVC_ERR_INVALID_ARGUMENT;
    }
    if (n == 0 || tokens == NULL || logits == NULL) {
        set_error(m->error, "forward: no tokens or a NULL buffer");
        return KVC_ERR_INVALID_ARGUMENT;
    }
    if ((uint64_t)m->pos + n > (uint64_t)m->seq_len) {
        set_error(m->error, "forward: %d + %u tokens exceed seq_len %d", m->pos, n, m->seq_len);
        return KVC_ERR_OUT_OF_MEMORY;
    }
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab) {
            set_error(m->error, "forward: token %ld outside the vocabulary of %d", (long)tokens[i], m->vocab);
            return KVC_ERR_INVALID_ARGUMENT;
        }
    for (uint32_t i = 0; i < n; i++) {
        forward_one(m, tokens[i], (int)i, (int)n);
        memcpy(logits + (size_t)i * m->vocab, m->logits, (size_t)m->vocab * sizeof(float));
    }
    return KVC_OK;
}

static kvc_status example_read_kv(kvcm_model* m, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                                  void* v_out) {
    if (seq != 0 || layer >= (uint32_t)m->n_layers || (uint64_t)pos + n > (uint64_t)m->pos || k_out == NULL ||
        v_out == NULL) {
        set_error(m->error, "read_kv: sequence %u, layer %u, rows %u..%u outside what is held (%d rows)", seq, layer,
                  pos, pos + n, m->pos);
        return KVC_ERR_INVALID_ARGUMENT;
    }
    const size_t off = ((size_t)layer * m->seq_len + pos) * m->kv_dim, bytes = (size_t)n * m->kv_dim * sizeof(float);
    memcpy(k_out, m->key_cache + off, bytes);
    memcpy(v_out, m->value_cache + off, bytes);
    return KVC_OK;
}

static kvc_status example_release(kvcm_model* m, uint32_t seq) {
    if (seq != 0 || m->pos == 0) {
        set_error(m->error, "release: sequence %u holds no token", seq);
        return KVC_ERR_INVALID_ARGUMENT;
    }
    m->pos = 0; /* the rows stay in the fixed cache and are overwritten: nothing reads past pos */
    return KVC_OK;
}

static kvc_status example_memory(kvcm_model* m, kvcm_memory* out) {
    if (out == NULL || out->struct_size < sizeof *out) {
        set_error(m->error, "memory: NULL or a struct_size below ABI 1.0");
        return KVC_ERR_INVALID_ARGUMENT;
    }
    const uint64_t per_token = 2ull * (uint64_t)m->n_layers * (uint64_t)m->kv_dim * sizeof(float);
    out->bytes_per_token = per_token;
    out->live_bytes = per_token * (uint64_t)m->pos;
    out->reserved_bytes = per_token * (uint64_t)m->seq_len;
    return KVC_OK;
}

static kvc_status example_kv_projections(kvcm_model* m, uint64_t* out) {
    if (out == NULL) return KVC_ERR_INVALID_ARGUMENT;
    *out = m->projected;
    return KVC_OK;
}

static const kvcm_model_api example_api = {
    sizeof(kvcm_model_api), KVCM_ABI_VERSION_MAJOR, KVCM_ABI_VERSION_MINOR, KVX_NAME, "1.0",
    example_get_caps, example_create, example_destroy, example_last_error, example_forward, example_read_kv,
    NULL /* fork: one sequence */, example_release, example_memory, example_kv_projections};

const kvcm_model_api* KVX_ENTRY(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
    (void)harness_abi_minor; /* 1.0 has nothing a later minor could miss */
    return harness_abi_major == KVCM_ABI_VERSION_MAJOR ? &example_api : NULL;
}
