/* json_decimal.h - internal to json_number.c: a decimal mantissa * 10^exp10 to the correctly
 * rounded double (round half to even) without strtod, or a refusal the caller settles slowly.
 *
 * The Eisel-Lemire algorithm (D. Lemire, "Number Parsing at a Gigabyte per Second", 2021): one
 * or two 64x128-bit products with a truncated power of ten (json_pow10.inc) give the result,
 * unless the product lies too close to a halfway point to tell which way it rounds, or the
 * result is subnormal, zero or infinite: then it refuses (rare: about 1 number in 1,000 of
 * random 17-digit ones lands near a halfway point, and none of the usual inputs underflow).
 */
#ifndef JSON_DECIMAL_H
#define JSON_DECIMAL_H

#include <stdint.h>

/* (negative ? -1 : 1) * mantissa * 10^exp10 into *out: 1, or 0 when the caller must convert
 * the text itself. A zero mantissa gives a zero of that sign. */
int json_decimal_to_double(uint64_t mantissa, int exp10, int negative, double *out);

#endif
