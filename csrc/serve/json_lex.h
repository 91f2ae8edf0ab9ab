/* json_lex.h - internal to fl_json_numbers.c: a strict RFC 8259 scanner over a byte range
 * (whitespace, strings, whole values skipped without building anything).
 *
 * Every call moves a cursor forward and returns 1, or 0 when the bytes at the cursor break
 * the grammar (the cursor then points at or near the offending byte). Strings must be valid
 * UTF-8 (RFC 3629: no overlong forms, no surrogates) with no raw control characters and only
 * the escapes JSON defines. Nothing allocates; nothing reads at or past `end`.
 */
#ifndef JSON_LEX_H
#define JSON_LEX_H

#include <stddef.h>

typedef struct json_cursor {
    const unsigned char *at;    /* the next byte to read */
    const unsigned char *end;   /* one past the last byte */
    const unsigned char *start; /* the first byte of the body, for offsets in details */
} json_cursor;

/* Skips the four whitespace bytes JSON allows (space, tab, LF, CR). Never fails. */
static inline void json_skip_ws(json_cursor *c) {
    while (c->at < c->end && (*c->at == ' ' || *c->at == '\n' || *c->at == '\r' || *c->at == '\t'))
        c->at++;
}

/* 1 when the next byte is `ch` (and there is one). */
static inline int json_peek(const json_cursor *c, unsigned char ch) {
    return c->at < c->end && *c->at == ch;
}

/* Skips one string starting at its opening quote. Sets *escaped to 1 when it holds a
 * backslash escape (its bytes are then not its characters), else 0. */
int json_skip_string(json_cursor *c, int *escaped);

/* Skips one number by the grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?. Sets
 * *integer to 1 when it has neither fraction nor exponent. */
int json_skip_number(json_cursor *c, int *integer);

/* Skips one value of any kind (object, array, string, number, true, false, null) with at
 * most `depth` arrays and objects nested in it (deeper is refused: the stack stays small). */
int json_skip_value(json_cursor *c, int depth);

#endif
