/* Misbehaving doubles: the C example whose forward() crashes (KVX_MISBEHAVE_CRASH: abort(), SIGABRT) or never
   returns (otherwise: it sleeps forever). Loading, get_caps and create behave, so the harness must catch the case
   itself: CRASH and TIMEOUT at the model level, as at the operation level. KVX_MISBEHAVE_CRASH_SMALL: layer_cache.c's
   bug (layer l reads layer l-1's cache), and abort() on models with d_model below 8, which a FAIL's shrinking reaches:
   the harness must keep the unshrunk FAIL. Built only as plugins: a test that linked them would crash or hang
   itself. */
#define KVX_ENTRY kvcm_double_well_behaved_entry
#define KVX_NAME "double-misbehaving-forward"
#ifdef KVX_MISBEHAVE_CRASH_SMALL
#define KVX_READ_LAYER(l) ((l) > 0 ? (l) - 1 : 0)
#endif
#include "model_example.c"

#include <stdlib.h>
#include <unistd.h>

static kvcm_model_api misbehaving_api;
static kvc_status (*well_behaved_forward)(kvcm_model*, uint32_t, uint32_t, const int32_t*, float*);

static kvc_status misbehaving_forward(kvcm_model* model, uint32_t seq, uint32_t n_tokens, const int32_t* tokens,
                                      float* logits_out) {
    (void)model, (void)seq, (void)n_tokens, (void)tokens, (void)logits_out;
#if defined(KVX_MISBEHAVE_CRASH_SMALL)
    if (model->dim < 8) abort();
    return well_behaved_forward(model, seq, n_tokens, tokens, logits_out);
#elif defined(KVX_MISBEHAVE_CRASH)
    abort();
#else
    for (;;) pause();
#endif
    return KVC_ERR_INTERNAL; /* never reached */
}

const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor);
const kvcm_model_api* kvcheck_model_entry(uint32_t harness_abi_major, uint32_t harness_abi_minor) {
    const kvcm_model_api* inner = kvcm_double_well_behaved_entry(harness_abi_major, harness_abi_minor);
    if (inner == NULL) return NULL;
    misbehaving_api = *inner;
    well_behaved_forward = inner->forward;
    misbehaving_api.forward = misbehaving_forward;
    return &misbehaving_api;
}
