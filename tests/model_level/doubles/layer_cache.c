/* Broken double: the attention of layer l > 0 reads layer l-1's cache (it writes its own correctly). Caught by
   MODEL-LOGITS; MODEL-KV still passes, since what is stored is right. */
#define KVX_ENTRY kvcm_double_layer_cache_entry
#define KVX_NAME "double-reads-previous-layer-cache"
#define KVX_READ_LAYER(l) ((l) > 0 ? (l) - 1 : 0)
#include "model_example.c"
