/* The layout header is plain C: this file compiles it as C11 (with -Wpedantic -Werror) and checks one address. */
#include "kvcheck/optimized/kv_layout.h"

int kvc_layout_c_check(void);

int kvc_layout_c_check(void) {
    static uint8_t storage[2][4 * 2 * 3 * 5 * 2]; /* two blocks: B 3, H 2, d 5, f16 */
    uint8_t* bases[2];
    const uint32_t table[2] = {1, 0};
    kvc_kv_layout l = kvc_kv_layout_make(3, 2, 5, 2);
    bases[0] = storage[0];
    bases[1] = storage[1];
    l.block_base = bases;
    /* token 4 -> table[1] = block 0, slot 1; V plane, head 1, dim 2 */
    return kvc_kv_address(&l, table, 4, KVC_PLANE_V, 1, 2) ==
                   storage[0] + l.plane_bytes + 1 * l.head_bytes + 1 * l.row_bytes + 2 * 2
               ? 0
               : 1;
}
