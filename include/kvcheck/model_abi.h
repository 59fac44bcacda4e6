/*
 * kvcheck model-level ABI, version 1.1: a whole inference engine — weights and tokens in, logits out, its own KV
 * cache inside.
 *
 * The operation-level ABI (abi.h) reaches a KV cache call by call. Many engines keep their cache inside one
 * monolithic forward pass (attention inlined, one token per call, one sequence per state); this table reaches them
 * as they are. The harness gives the engine a model description and weights, feeds it tokens and compares every
 * logit it returns with the reference's full recomputation of the same token history (docs/model-level.md says the
 * architecture, the weight names and the properties).
 *
 * Conventions are those of abi.h (docs/plugin-abi.md):
 *  - One exported symbol, KVCM_ENTRY_SYMBOL, returns the table. Its first fields are its size and the ABI version it
 *    was built against. A minor version only appends members: a member is present when its offset lies inside
 *    struct_size. Members marked OPTIONAL may be NULL; declaring the matching feature while leaving one NULL is
 *    refused at load. One .so may export both this symbol and abi.h's KVC_ENTRY_SYMBOL.
 *  - Every struct passed across starts with struct_size, filled by whoever allocated it.
 *  - Destination passing: the harness owns every buffer; an implementation keeps no pointer to one after the call
 *    (the in-memory weights view included: copy what you need during create()).
 *  - Calls on one model are never concurrent. Tensors are dense, row-major, little-endian, float32 unless said.
 *  - Status codes, dtypes and RoPE variants are abi.h's (kvc_status, kvc_dtype, kvc_rope).
 */
#ifndef KVCHECK_MODEL_ABI_H
#define KVCHECK_MODEL_ABI_H

#include "kvcheck/abi.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVCM_ABI_VERSION_MAJOR 1u
#define KVCM_ABI_VERSION_MINOR 1u
#define KVCM_ENTRY_SYMBOL "kvcheck_model_entry"

/* Capability bits (kvcm_caps.features). The harness never asks for an undeclared one; a declared one that is then
   refused is an ERROR, never a skip. */
#define KVCM_FEATURE_ALL_LOGITS (1u << 0)    /* forward writes one logit row per token; else only the last token's */
#define KVCM_FEATURE_PROMPT (1u << 1)        /* n_tokens > 1 onto an empty sequence */
#define KVCM_FEATURE_CHUNKED (1u << 2)       /* n_tokens > 1 onto a sequence that already holds tokens */
#define KVCM_FEATURE_FORK (1u << 3)          /* fork() */
#define KVCM_FEATURE_RELEASE (1u << 4)       /* release() */
#define KVCM_FEATURE_READ_KV (1u << 5)       /* read_kv(): the cache can be read back */
#define KVCM_FEATURE_TIED (1u << 6)          /* a classifier tied to the embedding (logits = h_final · Eᵀ) */
#define KVCM_FEATURE_UNTIED (1u << 7)        /* a separate classifier (lm_head) */
#define KVCM_FEATURE_FREE_HEAD_DIM (1u << 8) /* head_dim need not equal dim / n_heads */
#define KVCM_FEATURE_KV_PROJECTIONS (1u << 9) /* kv_projections(): the engine counts the K/V projections it does */

/* Weight formats (kvcm_caps.weight_formats: bit (1u << format) per accepted one). docs/model-level.md defines both. */
typedef enum kvcm_weights_format {
    KVCM_WEIGHTS_SAFETENSORS = 0, /* safetensors, F32 tensors with the Llama names (model.embed_tokens.weight, ...) */
    KVCM_WEIGHTS_FLAT_F32 = 1     /* a flat f32 checkpoint behind a 7-int32 header, in the single-file C style */
} kvcm_weights_format;

/* What an implementation supports. A limit of 0 means "no limit". */
typedef struct kvcm_caps {
    uint32_t struct_size;
    uint32_t features;       /* KVCM_FEATURE_* */
    uint32_t weight_formats; /* bit (1u << kvcm_weights_format) per accepted format */
    uint32_t cache_dtypes;   /* bit (1u << kvc_dtype) per cache dtype; the properties of 1.0 run f32 caches */
    uint32_t rope_variants;  /* bit (1u << kvc_rope) per variant; NONE is a variant like the others here */
    uint32_t max_context;    /* tokens per sequence */
    uint32_t max_seqs;       /* sequence ids 0 .. max_seqs-1; 1 for a single-sequence engine */
    uint32_t max_layers;
    uint32_t max_heads;      /* query heads */
    uint32_t max_kv_heads;
    uint32_t max_head_dim;
    uint32_t max_dim;        /* d_model */
    uint32_t max_hidden_dim; /* SwiGLU width */
    uint32_t max_vocab;
    /* ---- 1.1: parameters the engine hard-codes. The harness draws every model with these values instead of varying
       them, and the report lists them as fixed. 0 = the engine uses whatever the description gives (a 1.0 table,
       which ends before these members, reads as 0). Finite and > 0 otherwise; rms_eps below 1. ---- */
    float fixed_rope_theta; /* the one RoPE base the engine computes with (llama2.c: 10000) */
    float fixed_rms_eps;    /* the one RMSNorm epsilon (llama2.c: 1e-5) */
} kvcm_caps;

/* The size of a 1.0 kvcm_caps: a table whose get_caps fills a smaller struct_size is refused. */
#define KVCM_CAPS_SIZE_1_0 offsetof(kvcm_caps, fixed_rope_theta)

/* The model: docs/model-level.md says exactly what each number means in the arithmetic. */
typedef struct kvcm_model_desc {
    uint32_t struct_size;
    uint32_t dim;         /* d_model */
    uint32_t hidden_dim;  /* SwiGLU width */
    uint32_t n_layers;
    uint32_t n_heads;     /* query heads; a multiple of n_kv_heads */
    uint32_t n_kv_heads;  /* query head h reads KV head h / (n_heads / n_kv_heads) */
    uint32_t head_dim;    /* even when rope != NONE; the softmax scale is 1/sqrt(head_dim) */
    uint32_t vocab_size;
    uint32_t rope;        /* kvc_rope */
    float rope_theta;     /* pair j of a head rotates by pos * rope_theta^(-2j/head_dim) */
    float rms_eps;        /* RMSNorm: x / sqrt(mean(x^2) + rms_eps) * g */
    uint32_t tied;        /* 1: logits = h_final · embeddingᵀ (no lm_head tensor); 0: a separate lm_head */
    uint32_t cache_dtype; /* kvc_dtype */
    uint32_t max_context; /* the most tokens the harness will put in one sequence */
    uint32_t max_seqs;    /* the harness uses sequence ids 0 .. max_seqs-1 */
} kvcm_model_desc;

/* Where the weights are: a file, or the same bytes in memory. Exactly one of path / data is set. */
typedef struct kvcm_weights {
    uint32_t struct_size;
    uint32_t format;  /* kvcm_weights_format */
    const char* path; /* a file, or NULL */
    const void* data; /* the file's bytes, or NULL; valid only during create() */
    uint64_t size;    /* bytes at data */
} kvcm_weights;

/* Memory as the implementation reports it. MEMORY checks bytes_per_token against 2 * n_layers * n_kv_heads *
   head_dim * sizeof(cache dtype), and live_bytes against bytes_per_token times the tokens the sequences hold. */
typedef struct kvcm_memory {
    uint32_t struct_size;
    uint64_t bytes_per_token; /* K and V of one token in every layer */
    uint64_t live_bytes;      /* the sum over sequences of length * bytes_per_token (a fork counts twice) */
    uint64_t reserved_bytes;  /* K/V storage held, live or not (a fixed [layer][pos][kv_dim] cache: all of it) */
} kvcm_memory;

typedef struct kvcm_model kvcm_model; /* opaque: the engine's state */

typedef struct kvcm_model_api {
    uint32_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    const char* name;    /* short, stable, e.g. "model-example-c" */
    const char* version; /* the engine's own version string */

    void (*get_caps)(kvcm_caps* out);
    /* Checks the description against the weights (every tensor present with its shape) and refuses a mismatch with
       KVC_ERR_INVALID_ARGUMENT and a message naming the tensor; a description outside the caps is UNSUPPORTED. */
    kvc_status (*create)(const kvcm_model_desc* desc, const kvcm_weights* weights, kvcm_model** out);
    void (*destroy)(kvcm_model* model);
    /* The message of the last failed call on model; with model == NULL, of the last failed create. Never NULL. */
    const char* (*last_error)(const kvcm_model* model);

    /* Runs n_tokens tokens (ids below vocab_size) at the end of sequence seq, appending their K and V to the
       engine's cache: a prompt (empty sequence), a chunk or one decode token. logits_out: [n_tokens][vocab_size]
       with KVCM_FEATURE_ALL_LOGITS (row i predicts the token after tokens[i]); otherwise [vocab_size], the last
       token's. Without KVCM_FEATURE_PROMPT / CHUNKED the harness passes one token per call. */
    kvc_status (*forward)(kvcm_model* model, uint32_t seq, uint32_t n_tokens, const int32_t* tokens,
                          float* logits_out);

    /* OPTIONAL (KVCM_FEATURE_READ_KV): positions pos .. pos+n-1 of layer `layer` of seq as stored, in the cache
       dtype: K after RoPE, V. k_out, v_out: [n][n_kv_heads][head_dim]. pos + n past the length is
       KVC_ERR_INVALID_ARGUMENT. */
    kvc_status (*read_kv)(kvcm_model* model, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                          void* v_out);

    /* OPTIONAL (KVCM_FEATURE_FORK): the empty child continues from every token of the started parent. */
    kvc_status (*fork)(kvcm_model* model, uint32_t parent, uint32_t child);

    /* OPTIONAL (KVCM_FEATURE_RELEASE): the started sequence becomes empty; the next forward starts at position 0. */
    kvc_status (*release)(kvcm_model* model, uint32_t seq);

    kvc_status (*memory)(kvcm_model* model, kvcm_memory* out);

    /* OPTIONAL (KVCM_FEATURE_KV_PROJECTIONS): tokens whose K and V the engine has projected since create (per
       layer: a token projected in every layer counts once). The documents' count: a 2-token prompt and 99 greedy
       steps cost 101 with a cache and 2 + 3 + ... + 100 = 5,049 without. */
    kvc_status (*kv_projections)(kvcm_model* model, uint64_t* out);
} kvcm_model_api;

/* The one exported symbol. The harness passes the version it speaks; a plugin that cannot serve it returns NULL. */
typedef const kvcm_model_api* (*kvcm_entry_fn)(uint32_t harness_abi_major, uint32_t harness_abi_minor);

/* True when the table holds member m (its offset lies inside struct_size). */
#define KVCM_API_HAS(api, m) \
    ((api)->struct_size >= offsetof(kvcm_model_api, m) + sizeof((api)->m) && (api)->m != NULL)

#ifdef __cplusplus
}
#endif

#endif /* KVCHECK_MODEL_ABI_H */
