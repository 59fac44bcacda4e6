/* Model engines that write where they were not lent anything: the C example (correct) plus one write, chosen by
   KVX_SCRIBBLE. The harness lends every buffer between guards and keeps its own description, as at the operation
   level (properties/src/lent.hpp). Built only as plugins: a write a harness's guards miss lands in its heap, which
   only a case process may take.

     0 logits_before     forward writes one float just before logits_out
     1 logits_past_320   forward writes one float 320 bytes past the end of logits_out (past a short guard)
     2 logits_past_one   forward writes one float just past the end of logits_out (in a heap block's slack it
                         would go unseen in some cases and crash others)
     3 caps_overrun      get_caps writes 256 bytes past the kvcm_caps it is given: misbehaving while loaded, exit 4
     4 desc_rewrite      create writes vocab_size = 1 into the const description it is given, and forward returns
                         one logit per row: a harness that sized and graded by the description it lent would lend
                         and compare one logit
     5 logits_rows_past  forward writes 64 KiB of zeros from the end of logits_out: into the protected pages, a
                         CRASH that names logits_out */
#define KVX_ENTRY kvcm_double_scribbling_inner_entry
#define KVX_NAME "double-scribbling-model"
#include "model_example.c"

#ifndef KVX_SCRIBBLE
#error "KVX_SCRIBBLE selects the double (0..5)"
#endif

static kvcm_model_api scribbling_api;
static const kvcm_model_api* inner_api;

static void scribbling_get_caps(kvcm_caps* out) {
    inner_api->get_caps(out);
    if (KVX_SCRIBBLE == 3) memset((unsigned char*)out + sizeof *out, 0, 256);
    /* one logit row per call, so that one logit per row is all a one-logit description asks for */
    if (KVX_SCRIBBLE == 4) out->features &= ~KVCM_FEATURE_ALL_LOGITS;
}

static kvc_status scribbling_create(const kvcm_model_desc* desc, const kvcm_weights* weights, kvcm_model** out) {
    const kvc_status s = inner_api->create(desc, weights, out);
    if (s == KVC_OK && KVX_SCRIBBLE == 4) ((kvcm_model_desc*)desc)->vocab_size = 1;
    return s;
}

static kvc_status scribbling_forward(kvcm_model* m, uint32_t seq, uint32_t n, const int32_t* tokens, float* logits) {
    static const float zero = 0.0f;
    if (KVX_SCRIBBLE == 4) {
        /* the engine computes every logit of every token, and hands over the first logit of the last row */
        float* rows = malloc((size_t)n * (size_t)m->vocab * sizeof(float));
        kvc_status s;
        if (rows == NULL) return KVC_ERR_OUT_OF_MEMORY;
        s = inner_api->forward(m, seq, n, tokens, rows);
        if (s == KVC_OK) logits[0] = rows[(size_t)(n - 1) * (size_t)m->vocab];
        free(rows);
        return s;
    }
    const kvc_status s = inner_api->forward(m, seq, n, tokens, logits);
    unsigned char* end = (unsigned char*)(logits + (size_t)n * (size_t)m->vocab); /* ALL_LOGITS: n rows */
    if (s != KVC_OK) return s;
    if (KVX_SCRIBBLE == 0) memcpy((unsigned char*)logits - sizeof zero, &zero, sizeof zero);
    if (KVX_SCRIBBLE == 1) memcpy(end + 320, &zero, sizeof zero);
    if (KVX_SCRIBBLE == 2) memcpy(end, &zero, sizeof zero);
    if (KVX_SCRIBBLE == 5) {
        volatile unsigned char* p = end; /* one store at a time, in order, as a loop over rows would write */
        for (size_t i = 0; i < ((size_t)64 << 10); ++i) p[i] = 0;
    }
    return s;
}

const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);
const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
    inner_api = kvcm_double_scribbling_inner_entry(harness_abi_major, harness_abi_minor);
    if (inner_api == NULL) return NULL;
    scribbling_api = *inner_api;
    scribbling_api.get_caps = scribbling_get_caps;
    scribbling_api.create = scribbling_create;
    scribbling_api.forward = scribbling_forward;
    return &scribbling_api;
}
