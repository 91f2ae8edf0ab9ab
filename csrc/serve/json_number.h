/* json_number.h - internal to fl_json_numbers.c: one JSON number read as the double Python's
 * json module would give (float() of its text; int() of an integer literal), or refused.
 *
 * Correctly rounded and independent of the process locale (LC_NUMERIC), in one pass over the
 * text: exact arithmetic when the digits and the power of ten are both exact doubles
 * (Clinger's fast path), else the Eisel-Lemire algorithm (json_decimal.h: 17-digit numbers,
 * as JSON encoders write doubles), else -- rarely: near a halfway point, subnormal -- strtod_l()
 * under a "C" locale of its own. Thread-safe.
 */
#ifndef JSON_NUMBER_H
#define JSON_NUMBER_H

#include "serve/json_lex.h"

/* Reads the number at the cursor into *out and moves past it. Returns 1, or 0 when the text
 * is not a number by the grammar, or is one the fast path leaves to Python: a magnitude past
 * the largest double (Python would make it inf), an integer literal of magnitude >= 2**53 (a
 * Python int a float64 would round: NumPy may round it otherwise), or one that needs strtod_l
 * and has more than JSON_NUMBER_MAX_CHARS characters. An integer literal "-0" is +0.0, as
 * int("-0") is 0. */
int json_read_number(json_cursor *c, double *out);

enum { JSON_NUMBER_MAX_CHARS = 127 };

#endif
