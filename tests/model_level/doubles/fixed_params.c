/* Correct double in the way of llama2.c's run.c: RoPE base 10000 and RMSNorm eps 1e-5 hard-coded, whatever the
   description says, and declared as fixed (kvcm_caps 1.1), so every model it is given has them. Passes. */
#define KVX_ENTRY kvcm_double_fixed_params_entry
#define KVX_NAME "double-fixed-params"
#define KVX_THETA(theta) 10000.0f
#define KVX_EPS(eps) 1e-5f
#define KVX_FIXED_THETA 10000.0f
#define KVX_FIXED_EPS 1e-5f
#include "model_example.c"
