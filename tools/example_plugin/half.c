/*
 * f16 and bf16 storage: converting to and from float32, rounding to nearest with ties to even.
 *
 * Why write these by hand rather than use the compiler's _Float16 or the CPU's F16C instructions: neither is
 * portable C11, and the cache's stored bits are observable (read_kv returns them), so they have to be the same
 * bits on every machine. Everything below is integer arithmetic on the IEEE-754 bit patterns; it does not depend
 * on the floating-point rounding mode or on denormals being enabled.
 *
 * Bit layouts:
 *   float32  s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   bias 127
 *   float16  s eeeee mmmmmmmmmm                    bias 15,  max finite 65504, smallest subnormal 2^-24
 *   bfloat16 s eeeeeeee mmmmmmm                    bias 127: the top half of a float32
 */
#include "example_plugin.h"

#include <string.h>

/* memcpy is the portable way to look at a float's bits (a pointer cast would break strict aliasing). */
static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/*
 * Rounding to nearest even when dropping the low `n` bits of an integer m:
 *   keep = m >> n, rest = the dropped bits, halfway = 1 << (n - 1);
 *   round up when rest > halfway, or when rest == halfway and keep is odd (so that a tie lands on an even value).
 * The normal-number paths below use the classic shortcut for the same rule: add (halfway - 1) plus the lowest kept
 * bit, then shift. A carry out of the mantissa simply increments the exponent, which is exactly right, including
 * the step from the largest finite value to infinity.
 */

uint16_t kvc_example_f32_to_f16(float x) {
    const uint32_t u = bits_of(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu; /* |x| */

    if (a > 0x7f800000u) /* NaN: keep the sign, return the canonical quiet NaN (a payload does not survive) */
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x47800000u) /* |x| >= 65536 (or inf): too large for any rounding to bring back, so infinity */
        return (uint16_t)(sign | 0x7c00u);

    if (a >= 0x38800000u) {
        /* |x| >= 2^-14: a normal f16 (or, from 65520 up, a rounding carry into infinity). Move the exponent from
           bias 127 to bias 15 in place, then round away the 13 mantissa bits f16 does not have. */
        uint32_t r = a - (112u << 23);
        r += 0x0fffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }

    /* |x| < 2^-14: an f16 subnormal m * 2^-24, or zero. With the implicit leading 1 restored, |x| = M * 2^(e-150),
       so m = M * 2^(e-126): a right shift of M by (126 - e) bits, rounded. Shifts beyond 24 leave less than half of
       the smallest subnormal (this also covers float zero and float subnormals, whose e is 0). */
    {
        const uint32_t e = a >> 23;
        const uint32_t shift = 126u - e; /* >= 14 here */
        if (shift > 24u) return sign;
        {
            const uint32_t mant = (a & 0x007fffffu) | 0x00800000u;
            const uint32_t halfway = 1u << (shift - 1u);
            const uint32_t rest = mant & ((1u << shift) - 1u);
            uint32_t m = mant >> shift;
            if (rest > halfway || (rest == halfway && (m & 1u))) m += 1u; /* may become 0x400: the smallest normal */
            return (uint16_t)(sign | m);
        }
    }
}

float kvc_example_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x03ffu;

    if (e == 0x1fu) /* inf or NaN: the NaN payload moves to the top of the float's mantissa */
        return float_of(sign | 0x7f800000u | (m << 13));
    if (e != 0u) /* normal: rebias the exponent from 15 to 127 */
        return float_of(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0u) return float_of(sign); /* signed zero */

    /* Subnormal m * 2^-24: every one of them is a normal float. Shift the mantissa up until its leading 1 reaches
       the implicit-bit position (bit 10), lowering the exponent once per shift. */
    {
        uint32_t exp = 113u; /* the biased float exponent of 2^-14, before normalisation */
        while ((m & 0x0400u) == 0u) {
            m <<= 1;
            exp -= 1u;
        }
        return float_of(sign | (exp << 23) | ((m & 0x03ffu) << 13));
    }
}

uint16_t kvc_example_f32_to_bf16(float x) {
    const uint32_t u = bits_of(x);
    /* A NaN must stay a NaN: rounding could carry its payload into the exponent or truncate it to zero (= inf). */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u);
    /* bf16 is the top 16 bits of a float; round away the low 16. Subnormals need nothing special here. */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float kvc_example_bf16_to_f32(uint16_t b) { return float_of((uint32_t)b << 16); }
