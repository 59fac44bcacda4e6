/* Broken double: the classifier always reads the embedding table, even when the checkpoint carries a separate one
   (the header's negative vocab_size ignored). Caught by MODEL-LOGITS on every untied model. */
#define KVX_ENTRY kvcm_double_tied_mixup_entry
#define KVX_NAME "double-classifier-always-tied"
#define KVX_SHARED_CLASSIFIER(vocab_field) 1
#include "model_example.c"
