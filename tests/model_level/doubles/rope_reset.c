/* Broken double: a call of n > 1 tokens rotates token i by position i, as if the sequence were empty (a prefill path
   that assumes it starts the sequence); one-token calls rotate correctly. Whole prompts and decoding are right, so
   MODEL-LOGITS passes; MODEL-CHUNK catches the chunk that lands on a non-empty sequence. */
#define KVX_ENTRY kvcm_double_rope_reset_entry
#define KVX_NAME "double-rope-position-reset-per-chunk"
#define KVX_ROPE_POS(pos, i_in_call, n_in_call) ((n_in_call) > 1 ? (i_in_call) : (pos))
#include "model_example.c"
