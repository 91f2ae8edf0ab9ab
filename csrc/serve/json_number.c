/* json_number.c - JSON number text to a correctly rounded double (json_number.h). */
#define _GNU_SOURCE /* strtod_l, newlocale */
#include "serve/json_number.h"

#include <float.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/json_decimal.h"

#define EXACT_LIMIT (UINT64_C(1) << 53) /* below this every integer is an exact double */
#define MAX_DIGITS 19                   /* decimal digits that always fit a uint64_t */
#define MAX_POWER 100000                /* exponents saturate here, far past any double */

/* Powers of ten that are exact doubles (10^22 is the last). */
static const double exact_powers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                      1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                      1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
#define MAX_EXACT_POWER 22

/* A number's text read in one pass: value = mantissa * 10^exponent when !truncated, else the
 * exact value lies in [mantissa, mantissa + 1) * 10^exponent. */
typedef struct decimal {
    uint64_t mantissa; /* the first MAX_DIGITS significant digits */
    int digits;        /* significant digits (not leading zeros), MAX_DIGITS + 1 past MAX_DIGITS */
    int64_t exponent;  /* 64 bits: a body of millions of zero digits cannot overflow it */
    int negative;
    int integer;   /* no fraction, no exponent */
    int truncated; /* a nonzero digit past MAX_DIGITS was dropped */
} decimal;

static int is_digit(unsigned char ch) { return (unsigned)(ch - '0') < 10; }

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define EIGHT_AT_ONCE 1
#define BYTES(b) (UINT64_C(0x0101010101010101) * (b))

/* 1 when all 8 bytes of v (as read from memory) are ASCII digits: each byte's high nibble is
 * 3, and adding 6 leaves it 3 (a low nibble <= 9). A carry out of a byte only comes from one
 * that already fails. */
static int eight_digits(uint64_t v) {
    return ((v & BYTES(0xF0)) | (((v + BYTES(0x06)) & BYTES(0xF0)) >> 4)) == BYTES(0x33);
}

/* The number the 8 digit bytes of v spell, the first byte the most significant. */
static uint64_t eight_digits_value(uint64_t v) {
    v -= BYTES('0');
    v = v * 10 + (v >> 8); /* bytes 0, 2, 4, 6: the pairs d0d1, d2d3, d4d5, d6d7 */
    const uint64_t mask = UINT64_C(0x000000FF000000FF);
    uint64_t pairs_0_2 = v & mask, pairs_1_3 = (v >> 16) & mask;
    /* bits 32..63 of the sum: d0d1 * 10^6 + d2d3 * 10^4 + d4d5 * 100 + d6d7 */
    return (pairs_0_2 * (100 + (UINT64_C(1000000) << 32)) +
            pairs_1_3 * (1 + (UINT64_C(10000) << 32))) >>
           32;
}
#else
#define EIGHT_AT_ONCE 0
#endif

/* Reads digits at the cursor into d (`fraction`: after the point, each scales by 1/10); 0
 * when there is none. Counts in locals: a store through d per digit could alias the text. */
static int read_digits(json_cursor *c, decimal *d, int fraction) {
    const unsigned char *p = c->at, *end = c->end, *first = p;
    uint64_t m = d->mantissa;
    if (m == 0) /* leading zeros (of a fraction: "0.001") are not significant digits */
        while (p < end && *p == '0')
            p++;
    const unsigned char *significant = p;
    int room = d->digits < MAX_DIGITS ? MAX_DIGITS - d->digits : 0; /* what m still takes */
    const unsigned char *stop = end - p > room ? p + room : end;
#if EIGHT_AT_ONCE
    for (uint64_t v; stop - p >= 8 && (memcpy(&v, p, 8), eight_digits(v)); p += 8)
        m = m * 100000000 + eight_digits_value(v);
#endif
    while (p < stop && is_digit(*p))
        m = m * 10 + (uint64_t)(*p++ - '0');
    d->digits += (int)(p - significant);
    d->mantissa = m;
    const unsigned char *dropped = p; /* past MAX_DIGITS: not kept, but they scale */
    unsigned char nonzero = 0;
    while (p < end && is_digit(*p))
        nonzero |= *p++ ^ '0';
    if (p > dropped) {
        d->truncated |= nonzero != 0;
        d->digits = MAX_DIGITS + 1;
        if (!fraction)
            d->exponent += p - dropped;
    }
    if (fraction) /* leading zeros and kept digits scale; dropped ones do not */
        d->exponent -= dropped - first;
    c->at = p;
    return p > first;
}

/* The grammar -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? read into *d; 0 when broken. */
static int scan(json_cursor *c, decimal *d) {
    memset(d, 0, sizeof *d);
    d->integer = 1;
    if (json_peek(c, '-')) {
        d->negative = 1;
        c->at++;
    }
    if (json_peek(c, '0'))
        c->at++; /* a leading zero stands alone: "01" ends after the 0 */
    else if (c->at >= c->end || *c->at < '1' || *c->at > '9' || !read_digits(c, d, 0))
        return 0;
    if (json_peek(c, '.')) {
        c->at++;
        d->integer = 0;
        if (!read_digits(c, d, 1))
            return 0;
    }
    if (json_peek(c, 'e') || json_peek(c, 'E')) {
        c->at++;
        d->integer = 0;
        int sign = 1, power = 0;
        if (json_peek(c, '+') || json_peek(c, '-'))
            sign = *c->at++ == '-' ? -1 : 1;
        const unsigned char *first = c->at;
        for (; c->at < c->end && is_digit(*c->at); c->at++)
            power = power < MAX_POWER ? power * 10 + (*c->at - '0') : power;
        if (c->at == first)
            return 0;
        d->exponent += sign * power;
    }
    return 1;
}

static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static locale_t c_locale; /* made once, kept for the life of the process */

static void make_c_locale(void) { c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

/* strtod_l of the text under the "C" locale; 0 when it overflows or cannot run. */
static int slow_convert(const unsigned char *s, size_t len, double *out) {
    char text[JSON_NUMBER_MAX_CHARS + 1];
    if (len > JSON_NUMBER_MAX_CHARS)
        return 0;
    pthread_once(&c_locale_once, make_c_locale);
    if (c_locale == (locale_t)0)
        return 0;
    memcpy(text, s, len);
    text[len] = '\0';
    char *stop;
    double value = strtod_l(text, &stop, c_locale);
    if (stop != text + len || isinf(value)) /* an underflow is fine: rounded, as Python's */
        return 0;
    *out = value;
    return 1;
}

/* The double of a fraction or exponent form without strtod, when that is sure; else 0. */
static int fast_convert(const decimal *d, double *out);

/* fast_convert again with the mantissa's trailing zeros moved into the exponent: 1.000...0
 * (10^18 * 10^-18) is exactly a power of two, which the truncated table cannot settle. */
static int fast_convert_stripped(decimal d, double *out) {
    if (d.truncated || d.mantissa % 10 != 0)
        return 0;
    while (d.mantissa % 10 == 0) {
        d.mantissa /= 10;
        d.exponent++;
    }
    return fast_convert(&d, out);
}

static int fast_convert(const decimal *d, double *out) {
    if (d->digits == 0) { /* every digit a zero, whatever the exponent */
        *out = d->negative ? -0.0 : 0.0;
        return 1;
    }
#if FLT_EVAL_METHOD == 0 /* doubles round as doubles (not x87's wider registers) */
    if (!d->truncated && d->mantissa <= EXACT_LIMIT && d->exponent >= -MAX_EXACT_POWER &&
        d->exponent <= MAX_EXACT_POWER) {
        /* Clinger: both operands exact, so one IEEE operation rounds correctly */
        double value = (double)d->mantissa;
        value = d->exponent < 0 ? value / exact_powers[-d->exponent]
                                : value * exact_powers[d->exponent];
        *out = d->negative ? -value : value;
        return 1;
    }
#endif
    if (d->exponent < -MAX_POWER || d->exponent > MAX_POWER)
        return 0;
    int exponent = (int)d->exponent;
    if (!json_decimal_to_double(d->mantissa, exponent, d->negative, out))
        return fast_convert_stripped(*d, out);
    if (d->truncated) { /* the dropped digits cannot matter if the interval's ends agree */
        double upper;
        if (!json_decimal_to_double(d->mantissa + 1, exponent, d->negative, &upper) ||
            memcmp(&upper, out, sizeof upper) != 0)
            return 0;
    }
    return 1;
}

int json_read_number(json_cursor *c, double *out) {
    const unsigned char *s = c->at;
    decimal d;
    if (!scan(c, &d))
        return 0;
    if (d.integer) { /* Python's int(): exact below 2**53, and never -0 */
        if (d.digits > MAX_DIGITS || d.mantissa >= EXACT_LIMIT)
            return 0;
        *out = d.negative && d.mantissa != 0 ? -(double)d.mantissa : (double)d.mantissa;
        return 1;
    }
    return fast_convert(&d, out) || slow_convert(s, (size_t)(c->at - s), out);
}
