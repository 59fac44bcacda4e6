/* Broken double: RMSNorm with a tenth of the described eps (1e-6 where the description says 1e-5). Caught by
   MODEL-LOGITS in the small-norm regime, where layer 0's hidden states have mean(x^2) close to eps. */
#define KVX_ENTRY kvcm_double_eps_tenth_entry
#define KVX_NAME "double-eps-tenth"
#define KVX_EPS(eps) ((eps)*0.1f)
#include "model_example.c"
