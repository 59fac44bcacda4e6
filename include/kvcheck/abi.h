/*
 * kvcheck plugin ABI, version 1.3 — the one interface every KV-cache implementation under test speaks.
 *
 * The harness talks to an implementation only through this header: it appends K/V, attends with Q, reads the cache
 * back and asks how many bytes are held. Coordinates are logical (sequence, layer, position, KV head, dim); the
 * implementation owns its memory and its layout. Our own engines are reached through the same table as a third
 * party's plugin, so the suite that certifies them is the suite that judges everyone.
 *
 * Rules (docs/plugin-abi.md says them at length):
 *  - One exported symbol, KVC_ENTRY_SYMBOL, returns a function table. Its first fields are its size and the ABI
 *    version it was built against. Major versions are incompatible; a minor version only appends members, so a
 *    member is present when its offset lies inside struct_size. Members marked OPTIONAL may be NULL.
 *  - Every struct passed across starts with struct_size, filled by whoever allocated it.
 *  - Destination passing: the harness owns every input and output buffer. An implementation reads and writes them
 *    only during the call and must not keep pointers to them afterwards (the harness poisons them after each call).
 *  - Calls on one kvc_cache are never concurrent. Distinct caches may be used from distinct threads.
 *  - Tensors are dense, row-major, little-endian. Inputs q, k, v and outputs are float32 whatever the cache dtype.
 *  - A sequence id is any value below config.max_seqs. A sequence starts empty in every layer; appending to an empty
 *    sequence starts it; release empties it again. Each (sequence, layer) is its own append-only stream of rows.
 *  - A *started* sequence is one in which at least one layer holds at least one row (appending n_new == 0 starts
 *    nothing). fork needs a started parent and a child that holds no row in any layer; release needs a started
 *    sequence. Layers of a started sequence may hold different numbers of rows (the harness appends layer by layer).
 *  - Every call, create() and destroy() included, is inside the allocator watch of property NO-Q: whatever create()
 *    allocates counts, and must be reported (K/V storage as capacity/pool, everything else as workspace_bytes).
 *
 * ABI 1.1 appended: kvc_caps.head_dim_multiple, head_dim_multiple_rope and pipeline (the declared rounding
 * pipeline), kvc_memory.workspace_bytes. A 1.0 plugin still loads: its shorter structs read as zeros there.
 * ABI 1.2 appended: quantized cache dtypes (fp8 E4M3FN/E5M2 with per-tensor or per-KV-head scales, int8 per token,
 * llama.cpp's q8_0; docs/quantized.md), kvc_caps.quant, the scale fields of kvc_config, the fp8 query rounding of
 * kvc_pipeline.q and read_kv_scales; windowed and latent caches (docs/windowed-caches.md): per-layer sliding
 * windows and attention sinks, eviction of rows no query can see again (KVC_ERR_EVICTED), a V head dim apart from
 * K's and RoPE on a range of the head dims, with their features and limits in kvc_caps. A 1.0 or 1.1 plugin still
 * loads and is never given a quantized, windowed or latent cache.
 * ABI 1.3 appended: kvc_caps.n_pipeline_rules and pipeline_rules, a rounding pipeline per cache dtype and call shape
 * (docs/tolerance.md). A 1.0 to 1.2 plugin still loads: it declares no rule, and kvc_caps.pipeline grades every call.
 */
#ifndef KVCHECK_ABI_H
#define KVCHECK_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_ABI_VERSION_MAJOR 1u
#define KVC_ABI_VERSION_MINOR 3u
#define KVC_ENTRY_SYMBOL "kvcheck_plugin_entry"

/* Result of every fallible call. On anything but KVC_OK, last_error() says what happened in words. */
typedef enum kvc_status {
    KVC_OK = 0,
    KVC_ERR_INVALID_ARGUMENT = 1, /* unknown sequence, layer out of range, bad pointer or shape */
    KVC_ERR_UNSUPPORTED = 2,      /* a config or operation outside the declared capabilities */
    KVC_ERR_OUT_OF_MEMORY = 3,    /* blocks exhausted, max_tokens reached, allocation failed */
    KVC_ERR_INTERNAL = 4,
    /* ---- ABI 1.2 ---- */
    KVC_ERR_EVICTED = 5 /* read_kv of a row an evicting cache dropped (config.evict): no query can see it again */
} kvc_status;

/* Cache dtypes. The quantized ones (ABI 1.2) are stored exactly as docs/quantized.md defines them, and judged
   bitwise: the same appended value must give the same stored code and scale as the reference quantizer.
   For every quantized dtype read_kv returns one byte per element (the code) and read_kv_scales the scales. */
typedef enum kvc_dtype {
    KVC_DTYPE_F32 = 0,
    KVC_DTYPE_F16 = 1,
    KVC_DTYPE_BF16 = 2,
    /* ---- ABI 1.2 ---- */
    KVC_DTYPE_FP8_E4M3 = 3, /* fp8 E4M3FN (bias 7, max 448, no inf), code = fp8(x / scale) saturating; the scale
                               per layer or per (layer, KV head) comes from the config (kv_scale_mode) */
    KVC_DTYPE_FP8_E5M2 = 4, /* fp8 E5M2 (bias 15, max 57344), otherwise as FP8_E4M3 */
    KVC_DTYPE_INT8_TOKEN = 5, /* int8 symmetric: per token and KV head, scale = absmax / 127 kept in
                                 config.int8_scale_dtype (f32 or f16), code = round_half_even(x / scale) */
    KVC_DTYPE_Q8_0 = 6 /* llama.cpp's block_q8_0 along each head's dims: blocks of 32 codes, one f16 scale each,
                          ggml's rounding (head_dim a multiple of 32) */
} kvc_dtype;

/* ABI 1.2: how an fp8 cache's scales are given (kvc_config.kv_scale_mode). */
typedef enum kvc_scale_mode {
    KVC_SCALE_NONE = 0,    /* every scale is 1: code = fp8(x) */
    KVC_SCALE_TENSOR = 1,  /* one k and one v scale per layer: k_scales, v_scales [n_layers] */
    KVC_SCALE_KV_HEAD = 2  /* one per layer and KV head: k_scales, v_scales [n_layers][n_kv_heads] */
} kvc_scale_mode;

/* Rotary position embedding. NEOX rotates pairs (i, i + d/2); GPTJ rotates interleaved pairs (2i, 2i + 1). */
typedef enum kvc_rope { KVC_ROPE_NONE = 0, KVC_ROPE_NEOX = 1, KVC_ROPE_GPTJ = 2 } kvc_rope;

/* The arithmetic an implementation promises; the tolerance policy (docs/tolerance.md) grades against it. */
typedef enum kvc_precision {
    /* q as given (f32); K/V widened from the cache dtype; scores, softmax and accumulation in f32. */
    KVC_PRECISION_F32 = 0,
    /* q rounded to the cache dtype; scores in f32; V accumulated in the cache dtype (16-bit caches), as some
       production CPU kernels do for small query batches. Equal to KVC_PRECISION_F32 for an f32 cache. */
    KVC_PRECISION_Q_AND_V_ACCUM_IN_CACHE_DTYPE = 1
} kvc_precision;

/* ABI 1.1: the dtype one stage of the attention arithmetic rounds its values to (kvc_pipeline). */
typedef enum kvc_round {
    KVC_ROUND_F32 = 0,   /* f32 (or wider): the stage rounds as f32 arithmetic does */
    KVC_ROUND_F16 = 1,   /* IEEE half */
    KVC_ROUND_BF16 = 2,  /* bfloat16 */
    KVC_ROUND_CACHE = 3, /* whatever the config's cache dtype is (f32 for an f32 or a quantized cache) */
    /* ---- ABI 1.2, for kvc_pipeline.q only ---- */
    KVC_ROUND_FP8_E4M3 = 4, /* q is quantized to fp8 E4M3FN, unscaled and saturating, as FlashAttention-3 does with
                               an fp8 cache; the harness reproduces this rounding exactly */
    KVC_ROUND_FP8_E5M2 = 5, /* the same in E5M2 */
    KVC_ROUND_Q8_0 = 6      /* q is quantized to q8_0 blocks of 32 along each head's dims and dequantized, as
                               ggml's CPU flash attention does to multiply it with a q8_0 cache */
} kvc_round;

/* ABI 1.1: where an implementation's attention arithmetic rounds, stage by stage (kvc_round each). The harness
   derives the tolerance from it (docs/tolerance.md): an implementation is graded for the pipeline it declares, and
   a pipeline that claims more precision than the arithmetic has fails. All zeros = f32 everywhere. */
typedef struct kvc_pipeline {
    uint32_t q;      /* the query is rounded to this before anything else (before RoPE) */
    uint32_t rope;   /* cos/sin tables and the rotation arithmetic of q (angles pos*theta^(-2j/d) in f32) */
    uint32_t scores; /* q.k*scale: dot products accumulate in f32 at least, the score is rounded to this */
    uint32_t probs;  /* exp(s - max), or the normalized probabilities, rounded to this */
    uint32_t accum;  /* the V accumulator: every partial sum, rescale and split-KV partial is rounded to this
                        (the softmax denominator is summed in f32 in every pipeline: in 16 bits it stagnates) */
    uint32_t output; /* the output row is rounded to this before it is written (as f32) */
    uint32_t flags;  /* KVC_PIPELINE_* */
} kvc_pipeline;

/* kvc_pipeline.flags */
#define KVC_PIPELINE_DECLARED (1u << 0) /* the pipeline is declared: it replaces kvc_caps.precision */
/* The rows a call appends are attended as given (f32, rotated) while the cache stores them rounded to its dtype.
   Outputs then depend on how a prompt is split into calls; the report says so. */
#define KVC_PIPELINE_NEW_ROWS_UNROUNDED (1u << 1)
/* ABI 1.2: the rounding of q8_0 codes, when it is not ggml's reference quantize_row_q8_0_ref (roundf(x * (1/d)),
   half away from zero). It applies to the cache's codes and to a query rounded with KVC_ROUND_Q8_0. At most one: */
#define KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN (1u << 2) /* round_half_even(x * (127 / amax)): ggml's x86 AVX/AVX2 kernel */
#define KVC_PIPELINE_Q8_0_RECIP_D_EVEN (1u << 3)    /* round_half_even(x * (1 / d)): ggml's ARM NEON kernel */

/* ABI 1.3: a pipeline for some cache dtypes and call shapes (kvc_caps.pipeline_rules). The outputs of one sequence
   in one call, a call that appends n rows to that sequence in a cache of dtype d, are graded by the FIRST rule whose
   cache_dtypes covers d and whose min_new <= n; with none, by kvc_caps.pipeline (or precision). A kernel that
   switches arithmetic with the dtype or the chunk length (ggml's CPU flash attention: f16 accumulation for short f16
   chunks, an f32 tiled path from 64 rows) declares each path and is graded by the one it takes. What concerns the
   stored content rather than one call's arithmetic (the q8_0 rounding flags) must be the same in every rule covering
   a dtype as in kvc_caps.pipeline: the harness refuses the plugin otherwise. */
typedef struct kvc_pipeline_rule {
    uint32_t cache_dtypes; /* bit (1u << kvc_dtype) per cache dtype the rule covers, only declared ones; 0 = every
                              declared dtype */
    uint32_t min_new;      /* the rule covers a call only where it appends at least this many rows to the sequence
                              graded; 0 or 1 = any */
    kvc_pipeline pipeline; /* flags must have KVC_PIPELINE_DECLARED */
} kvc_pipeline_rule;
#define KVC_MAX_PIPELINE_RULES 8

/* Where an implementation keeps the cache, so the harness knows which allocator to watch. */
typedef enum kvc_memory_space { KVC_MEMORY_HOST = 0, KVC_MEMORY_DEVICE = 1 } kvc_memory_space;

/* Capability bits (kvc_caps.features). */
#define KVC_FEATURE_GQA (1u << 0)     /* n_kv_heads < n_q_heads (GQA and MQA) */
#define KVC_FEATURE_PAGED (1u << 1)   /* storage in fixed-size blocks of kvc_memory.block_size tokens */
#define KVC_FEATURE_FORK (1u << 2)    /* fork() */
#define KVC_FEATURE_RELEASE (1u << 3) /* release() */
#define KVC_FEATURE_BATCH (1u << 4)   /* append_attend_batch() */
#define KVC_FEATURE_CHUNKED (1u << 5) /* n_new > 1 onto a sequence that already holds tokens */
/* ---- ABI 1.2 (docs/windowed-caches.md) ---- */
#define KVC_FEATURE_WINDOW (1u << 6)     /* config.windows: a sliding window per layer (up to kvc_caps.max_window) */
#define KVC_FEATURE_SINKS (1u << 7)      /* config.n_sinks > 0 with windows (up to kvc_caps.max_sinks) */
#define KVC_FEATURE_EVICT (1u << 8)      /* config.evict: rows outside every window are dropped and their memory
                                            freed or reused */
#define KVC_FEATURE_HEAD_DIM_V (1u << 9) /* config.head_dim_v != head_dim (up to kvc_caps.max_head_dim_v) */
#define KVC_FEATURE_ROPE_RANGE (1u << 10) /* config.rope_dims: RoPE on a range of the head dims, the rest as given */
/* fork() shares storage instead of copying it: every full block of kvc_memory.block_size tokens the parent holds in a
   layer is shared by the child (one reference counted block, counted once in capacity_bytes), and only the partly
   filled last block of each (sequence, layer) may be copied. Releasing either side frees only the blocks no other
   sequence still holds. With KVC_FEATURE_FORK; FORK and MEMORY hold the capacity reports to it (docs/conformance.md):
   a fork grows capacity_bytes by at most one block per layer of the child, and capacity never exceeds the blocks
   of the fork tree counted once. A cache that copies on fork simply does not declare it. */
#define KVC_FEATURE_FORK_SHARES (1u << 11)

/* What an implementation supports. Filled by get_caps; the harness never asks for more than is declared, and a
   declared capability that is then refused is an ERROR, never a skip. A limit of 0 means "no limit". */
typedef struct kvc_caps {
    uint32_t struct_size;
    uint32_t dtypes;        /* bit (1u << kvc_dtype) per supported cache dtype (kvcm_caps.cache_dtypes) */
    uint32_t rope_variants; /* bit (1u << kvc_rope) per variant the implementation applies itself; NONE implied */
    uint32_t features;      /* KVC_FEATURE_* */
    uint32_t precision;     /* kvc_precision */
    uint32_t memory_space;  /* kvc_memory_space */
    uint32_t max_layers;
    uint32_t max_q_heads;
    uint32_t max_kv_heads;
    uint32_t max_head_dim;
    uint32_t max_seqs;
    uint32_t max_tokens; /* per sequence */
    /* ---- ABI 1.1 ---- */
    uint32_t head_dim_multiple;      /* head_dim must be a multiple of this; 0 or 1: any head_dim */
    uint32_t head_dim_multiple_rope; /* the same when config.rope != NONE; 0: head_dim_multiple applies */
    kvc_pipeline pipeline;           /* used when pipeline.flags has KVC_PIPELINE_DECLARED; else `precision` */
    /* ---- ABI 1.2 ---- */
    uint32_t quant; /* KVC_QUANT_*: the scale forms of the quantized dtypes declared in `dtypes` */
    uint32_t max_window;     /* KVC_FEATURE_WINDOW: the largest window; 0 = no limit */
    uint32_t max_sinks;      /* KVC_FEATURE_SINKS: the largest n_sinks; 0 = no limit */
    uint32_t max_head_dim_v; /* KVC_FEATURE_HEAD_DIM_V: the largest head_dim_v; 0 = max_head_dim applies */
    /* Parameters the implementation hard-codes (docs/conformance.md, "Fixed parameters"): every case is drawn with
       them, a case with another value is NOT_SUPPORTED, and the report lists them. 0 = the config's value, any. */
    float fixed_rope_theta; /* the one RoPE base it rotates with (finite, > 0) */
    uint32_t fixed_scale;   /* KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM: 1/sqrt(head_dim) whatever config.scale says */
    /* ---- ABI 1.3 ---- */
    uint32_t n_pipeline_rules; /* rules used, at most KVC_MAX_PIPELINE_RULES; 0 = `pipeline` grades every call */
    kvc_pipeline_rule pipeline_rules[KVC_MAX_PIPELINE_RULES]; /* tried in order, the first that covers a call wins */
} kvc_caps;

#define KVC_FIXED_SCALE_INV_SQRT_HEAD_DIM 1u

/* kvc_caps.quant (ABI 1.2). A declared fp8 dtype always takes KVC_SCALE_NONE and a declared INT8_TOKEN always
   takes f32 scales; these bits add the rest. */
#define KVC_QUANT_FP8_SCALE_TENSOR (1u << 0)  /* kv_scale_mode KVC_SCALE_TENSOR */
#define KVC_QUANT_FP8_SCALE_KV_HEAD (1u << 1) /* kv_scale_mode KVC_SCALE_KV_HEAD */
#define KVC_QUANT_INT8_SCALE_F16 (1u << 2)    /* int8_scale_dtype KVC_DTYPE_F16 */

typedef struct kvc_config {
    uint32_t struct_size;
    uint32_t n_layers;
    uint32_t n_q_heads;  /* a multiple of n_kv_heads */
    uint32_t n_kv_heads; /* query head h reads KV head h / (n_q_heads / n_kv_heads) */
    uint32_t head_dim;   /* even when rope != NONE */
    uint32_t cache_dtype; /* kvc_dtype */
    uint32_t max_seqs;    /* sequence ids are 0 .. max_seqs-1 */
    uint32_t max_tokens;  /* per sequence and layer */
    float scale;          /* softmax scale, usually 1/sqrt(head_dim) */
    uint32_t rope;        /* kvc_rope: if not NONE the implementation rotates q and k by their position */
    float rope_theta;     /* base of the rotary frequencies, e.g. 10000 */
    uint32_t block_size_hint; /* tokens per block the harness would like; 0 = the implementation's choice */
    /* ---- ABI 1.2 (read only for a quantized cache_dtype) ---- */
    uint32_t kv_scale_mode;   /* fp8: kvc_scale_mode */
    const float* k_scales;    /* fp8: [n_layers] (TENSOR) or [n_layers][n_kv_heads] (KV_HEAD), finite and > 0;
                                 NULL for KVC_SCALE_NONE. Owned by the harness: copy them during create() */
    const float* v_scales;    /* the same for V */
    uint32_t int8_scale_dtype; /* INT8_TOKEN: KVC_DTYPE_F32 or KVC_DTYPE_F16, the dtype each row's scale is kept in */
    /* ---- ABI 1.2, windowed and latent caches (docs/windowed-caches.md); zeros = none of it ----
       Visibility: the query at absolute position i sees the key at absolute position j of its (sequence, layer)
       iff j <= i and (W == 0 or j < n_sinks or i - j < W), W = windows[layer]. Positions stay absolute however
       the cache stores its rows (RoPE too). */
    const uint32_t* windows; /* [n_layers] W of each layer, 0 = that layer attends to everything; NULL = no window
                                anywhere. Owned by the harness: copy it during create() */
    uint32_t n_sinks;        /* S: the first S positions of a sequence stay visible in every windowed layer */
    uint32_t evict;          /* 1: the cache drops rows no later query of their layer can see (KVC_FEATURE_EVICT) */
    uint32_t head_dim_v;     /* V rows and outputs have this many dims; 0 = head_dim (KVC_FEATURE_HEAD_DIM_V) */
    uint32_t rope_dim_begin; /* RoPE rotates q and k dims [rope_dim_begin, rope_dim_begin + rope_dims) as if they */
    uint32_t rope_dims;      /* were a head of rope_dims dims (angle pos * theta^(-2j/rope_dims)); the other dims
                                stay as given. rope_dims 0 = the whole head (KVC_FEATURE_ROPE_RANGE otherwise) */
} kvc_config;

/* Memory as the implementation reports it. MEMORY checks these numbers against the formula; NO-Q checks that the
   allocator's growth (heap for HOST, device memory for DEVICE) is explained by capacity_bytes + pool_bytes +
   workspace_bytes, that workspace_bytes stays constant, and that growth while appending follows reported storage.
   Fork shares storage: a block shared by two sequences counts once in capacity_bytes, twice in live_bytes. */
typedef struct kvc_memory {
    uint32_t struct_size;
    uint32_t block_size;     /* allocation granule in tokens; 1 when storage is exact per token */
    uint64_t live_bytes;     /* 2 * sum over (seq, layer) of length * n_kv_heads * row bytes of one head, where
                                a head's row is head_dim * sizeof(dtype) for f32/f16/bf16, head_dim for fp8
                                (its config scales are workspace), head_dim + 4 (f32 scale) or + 2 (f16 scale)
                                for INT8_TOKEN, head_dim + 2 * head_dim / 32 for Q8_0. ABI 1.2: with
                                head_dim_v, a V row counts head_dim_v dims (K rows head_dim); an evicting cache
                                counts only the rows it holds (length minus the rows it dropped) */
    uint64_t capacity_bytes; /* K/V storage in blocks that hold live tokens, partly filled last blocks included */
    uint64_t pool_bytes;     /* K/V storage held but holding no live token: preallocated pools, free lists,
                                alignment padding, growth reserve */
    /* ---- ABI 1.1 ---- */
    uint64_t workspace_bytes; /* everything else held: block tables, score buffers, split-KV partials. A constant
                                 from create() on (at most 256 MiB): it must not grow with the tokens appended */
} kvc_memory;

/* Several sequences in one call; their new tokens are packed back to back (CSR form). */
typedef struct kvc_batch {
    uint32_t struct_size;
    uint32_t n_seqs;
    const uint32_t* seq_ids;       /* [n_seqs], distinct */
    const uint32_t* token_offsets; /* [n_seqs + 1]; sequence i owns new tokens token_offsets[i] .. [i+1]-1 */
    const float* q;                /* [total_new][n_q_heads][head_dim] */
    const float* k;                /* [total_new][n_kv_heads][head_dim] */
    const float* v;                /* [total_new][n_kv_heads][dv], dv = head_dim_v or head_dim */
    float* out;                    /* [total_new][n_q_heads][dv] */
} kvc_batch;

typedef struct kvc_cache kvc_cache; /* opaque: the implementation's state */

typedef struct kvc_plugin_api {
    uint32_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    const char* name;    /* short, stable, e.g. "example-c" */
    const char* version; /* the implementation's own version string */

    void (*get_caps)(kvc_caps* out);
    kvc_status (*create)(const kvc_config* config, kvc_cache** out);
    void (*destroy)(kvc_cache* cache);
    /* The message of the last failed call on cache; with cache == NULL, of the last failed create. Never NULL. */
    const char* (*last_error)(const kvc_cache* cache);

    /* Append n_new tokens to (seq, layer) and attend with their queries. Query i sees every row already cached
       plus new rows 0..i (causal, bottom-right aligned). n_new == 0 is a no-op.
       q: [n_new][n_q_heads][head_dim]; k: [n_new][n_kv_heads][head_dim]; v: [n_new][n_kv_heads][dv];
       out: [n_new][n_q_heads][dv], dv = config.head_dim_v or head_dim. With windows, "sees" is the visibility
       rule of kvc_config. */
    kvc_status (*append_attend)(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t n_new, const float* q,
                                const float* k, const float* v, float* out);

    /* OPTIONAL (KVC_FEATURE_BATCH): append_attend for several sequences of one layer at once. */
    kvc_status (*append_attend_batch)(kvc_cache* cache, uint32_t layer, const kvc_batch* batch);

    /* Rows pos .. pos+n-1 of (seq, layer) in the cache dtype, as stored (rotated when the implementation applies
       RoPE). k_out: [n][n_kv_heads][head_dim], v_out: [n][n_kv_heads][dv] elements of the cache dtype (one
       byte, the code, for a quantized dtype: its scales come from read_kv_scales). Rows past the sequence's length
       are not readable: pos + n > length is KVC_ERR_INVALID_ARGUMENT. An evicting cache returns KVC_ERR_EVICTED
       when the range holds a row it dropped (positions stay absolute: length counts dropped rows too). */
    kvc_status (*read_kv)(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n, void* k_out,
                          void* v_out);

    kvc_status (*seq_length)(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t* length);

    kvc_status (*memory)(kvc_cache* cache, kvc_memory* out);

    /* OPTIONAL (KVC_FEATURE_FORK): child (empty in every layer) becomes a sequence sharing every layer's rows of
       parent, layer by layer (layers may differ in length). The parent must be started (some layer holds a row);
       otherwise KVC_ERR_INVALID_ARGUMENT. */
    kvc_status (*fork)(kvc_cache* cache, uint32_t parent, uint32_t child);

    /* OPTIONAL (KVC_FEATURE_RELEASE): seq (a started sequence: some layer holds a row) becomes empty in every
       layer; its storage may be reused, and the next append starts it again from position 0. Releasing a sequence
       that holds no row in any layer is KVC_ERR_INVALID_ARGUMENT. */
    kvc_status (*release)(kvc_cache* cache, uint32_t seq);

    /* ---- ABI 1.2 ---- */
    /* OPTIONAL, required when a quantized dtype is declared: the scales of rows pos .. pos+n-1 of (seq, layer),
       as stored, under the same rules as read_kv. k_out, v_out: [n][n_kv_heads][scales per head row] of:
         FP8_E4M3, FP8_E5M2  1 f32: the scale the row was encoded with (1.0 under KVC_SCALE_NONE)
         INT8_TOKEN          1 of config.int8_scale_dtype (f32, or f16 bits)
         Q8_0                head_dim / 32 f16 bits, block by block (V rows: dv / 32)
       Any other cache dtype: KVC_ERR_UNSUPPORTED. */
    kvc_status (*read_kv_scales)(kvc_cache* cache, uint32_t seq, uint32_t layer, uint32_t pos, uint32_t n,
                                 void* k_out, void* v_out);
} kvc_plugin_api;

/* The one exported symbol. The harness passes the version it speaks; a plugin that cannot serve it returns NULL. */
typedef const kvc_plugin_api* (*kvc_entry_fn)(uint32_t harness_abi_major, uint32_t harness_abi_minor);

#ifdef __cplusplus
}
#endif

#endif /* KVCHECK_ABI_H */
