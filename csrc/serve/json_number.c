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

#define EXACT_LIMIT (UINT64_C(1) << 53) /* below this every integer is an exact double */
#define MAX_DIGITS 19                   /* decimal digits that always fit a uint64_t */

/* Powers of ten that are exact doubles (10^22 is the last). */
static const double exact_powers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                      1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                      1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
#define MAX_EXACT_POWER 22

/* The digits of a number: value = mantissa * 10^exponent, when `digits` <= MAX_DIGITS. */
typedef struct decimal {
    uint64_t mantissa;
    int digits;   /* significant digits taken (leading zeros are not) */
    int exponent; /* saturates far beyond any double's range */
    int negative;
} decimal;

static void add_digit(decimal *d, unsigned char ch, int fraction) {
    if (d->mantissa == 0 && ch == '0') { /* a leading zero: no significant digit yet */
        d->exponent -= fraction;
        return;
    }
    if (d->digits++ < MAX_DIGITS) { /* past that the decimal is unused: strtod_l reads the text */
        d->mantissa = d->mantissa * 10 + (uint64_t)(ch - '0');
        d->exponent -= fraction;
    }
}

/* Splits well-formed number text (json_skip_number accepted it) into a decimal. */
static decimal split(const unsigned char *s, const unsigned char *end) {
    decimal d = {0, 0, 0, 0};
    if (*s == '-') {
        d.negative = 1;
        s++;
    }
    for (; s < end && *s >= '0' && *s <= '9'; s++)
        add_digit(&d, *s, 0);
    if (s < end && *s == '.')
        for (s++; s < end && *s >= '0' && *s <= '9'; s++)
            add_digit(&d, *s, 1);
    if (s < end && (*s == 'e' || *s == 'E')) {
        int sign = 1, power = 0;
        s++;
        if (*s == '+' || *s == '-')
            sign = *s++ == '-' ? -1 : 1;
        for (; s < end; s++)
            power = power < 100000 ? power * 10 + (*s - '0') : power; /* saturate */
        d.exponent += sign * power;
    }
    return d;
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

int json_read_number(json_cursor *c, double *out) {
    const unsigned char *s = c->at;
    int integer;
    if (!json_skip_number(c, &integer))
        return 0;
    decimal d = split(s, c->at);
    if (integer) { /* Python's int(): exact below 2**53, and never -0 */
        if (d.digits > MAX_DIGITS || d.mantissa >= EXACT_LIMIT)
            return 0;
        *out = d.negative && d.mantissa != 0 ? -(double)d.mantissa : (double)d.mantissa;
        return 1;
    }
    if (d.digits == 0) { /* every digit a zero, whatever the exponent */
        *out = d.negative ? -0.0 : 0.0;
        return 1;
    }
#if FLT_EVAL_METHOD == 0 /* doubles round as doubles (not x87's wider registers) */
    if (d.digits <= MAX_DIGITS && d.mantissa <= EXACT_LIMIT && d.exponent >= -MAX_EXACT_POWER &&
        d.exponent <= MAX_EXACT_POWER) {
        /* both operands exact: one IEEE operation rounds correctly */
        double value = (double)d.mantissa;
        value = d.exponent < 0 ? value / exact_powers[-d.exponent] : value * exact_powers[d.exponent];
        *out = d.negative ? -value : value;
        return 1;
    }
#endif
    return slow_convert(s, (size_t)(c->at - s), out);
}
