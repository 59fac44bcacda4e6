/* Broken double: RMSNorm with a hard-coded eps of 1e-5 whatever the description says. Caught by MODEL-LOGITS on the
   models whose eps is far from it (1e-2, 0.1). */
#define KVX_ENTRY kvcm_double_wrong_eps_entry
#define KVX_NAME "double-hard-coded-eps"
#define KVX_EPS(eps) 1e-5f
#include "model_example.c"
