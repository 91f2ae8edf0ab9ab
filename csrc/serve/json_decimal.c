/* json_decimal.c - decimal to double by the Eisel-Lemire algorithm (json_decimal.h). */
#include "serve/json_decimal.h"

#include <string.h>

#include "serve/json_pow10.inc"

#ifdef __SIZEOF_INT128__
typedef unsigned __int128 u128;

/* floor(e * log2(10)) for |e| < 1650: 217706 / 2^16 ~ log2(10) (an arithmetic shift: GCC, Clang) */
static int floor_log2_pow10(int e) { return (217706 * e) >> 16; }

int json_decimal_to_double(uint64_t mantissa, int exp10, int negative, double *out) {
    uint64_t bits;
    if (mantissa == 0) {
        bits = 0;
    } else {
        if (exp10 < JSON_POW10_MIN || exp10 > JSON_POW10_MAX)
            return 0;
        const uint64_t *pow = json_pow10[exp10 - JSON_POW10_MIN];
        int shift = __builtin_clzll(mantissa);
        uint64_t m = mantissa << shift;
        /* the biased exponent if the product's top bit is set (one less if not) */
        int exp2 = floor_log2_pow10(exp10) + 64 + 1023 - shift;
        u128 product = (u128)m * pow[0];
        uint64_t hi = (uint64_t)(product >> 64), lo = (uint64_t)product;
        /* The truncated power makes the product up to m too small. When that could carry into
         * the 55 bits that decide the rounding (the 9 bits below them all ones), add the
         * power's low 64 bits' share; if it still could, refuse. */
        if ((hi & 0x1FF) == 0x1FF && lo + m < m) {
            u128 low = (u128)m * pow[1];
            uint64_t low_hi = (uint64_t)(low >> 64), low_lo = (uint64_t)low;
            uint64_t merged_lo = lo + low_hi;
            hi += merged_lo < lo;
            lo = merged_lo;
            if ((hi & 0x1FF) == 0x1FF && lo + 1 == 0 && low_lo + m < m)
                return 0;
        }
        int top = (int)(hi >> 63);
        uint64_t frac = hi >> (top + 9); /* 54 bits: the 53 kept and one to round with */
        exp2 -= 1 - top;
        /* every bit below the rounding bit zero, the rounding bit one, the last kept bit zero:
         * an exact tie (or just past one) that the truncation hides -- refuse */
        if (lo == 0 && (hi & 0x1FF) == 0 && (frac & 3) == 1)
            return 0;
        frac = (frac + (frac & 1)) >> 1; /* round half up; even ties were refused above */
        if (frac >> 53) {                /* rounded up to the next power of two */
            frac >>= 1;
            exp2++;
        }
        if (exp2 <= 0 || exp2 >= 0x7FF) /* subnormal, zero or infinite: the slow path knows */
            return 0;
        bits = (uint64_t)exp2 << 52 | (frac & ((UINT64_C(1) << 52) - 1));
    }
    if (negative)
        bits |= UINT64_C(1) << 63;
    memcpy(out, &bits, sizeof *out);
    return 1;
}
#else
int json_decimal_to_double(uint64_t mantissa, int exp10, int negative, double *out) {
    (void)mantissa, (void)exp10, (void)negative, (void)out;
    return 0; /* no 128-bit products: strtod_l does it all */
}
#endif
