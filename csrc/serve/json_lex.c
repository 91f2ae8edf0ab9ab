/* json_lex.c - the strict scanner of json_lex.h: strings (escapes, UTF-8), numbers, and
 * whole values skipped with a bounded nesting depth. */
#include "serve/json_lex.h"

#include <string.h>

static int is_digit(unsigned char ch) { return ch >= '0' && ch <= '9'; }

static int is_hex(unsigned char ch) {
    return is_digit(ch) || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* Skips one escape after its backslash: one of "\/bfnrt or u and four hex digits. */
static int skip_escape(json_cursor *c) {
    if (c->at >= c->end)
        return 0;
    unsigned char ch = *c->at++;
    if (strchr("\"\\/bfnrt", ch) != NULL && ch != '\0')
        return 1;
    if (ch != 'u' || c->end - c->at < 4)
        return 0;
    for (int i = 0; i < 4; i++)
        if (!is_hex(*c->at++))
            return 0;
    return 1;
}

/* Skips one multi-byte UTF-8 sequence whose lead byte `lead` (>= 0x80) was just read; the
 * second byte's range rules out overlong forms, surrogates and code points past U+10FFFF. */
static int skip_utf8_tail(json_cursor *c, unsigned char lead) {
    int more;
    unsigned char lo = 0x80, hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF)
        more = 1;
    else if (lead >= 0xE0 && lead <= 0xEF) {
        more = 2;
        lo = lead == 0xE0 ? 0xA0 : 0x80;
        hi = lead == 0xED ? 0x9F : 0xBF;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        more = 3;
        lo = lead == 0xF0 ? 0x90 : 0x80;
        hi = lead == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0; /* a continuation byte, C0/C1 (overlong) or F5..FF */
    if (c->end - c->at < more || c->at[0] < lo || c->at[0] > hi)
        return 0;
    for (int i = 1; i < more; i++)
        if ((c->at[i] & 0xC0) != 0x80)
            return 0;
    c->at += more;
    return 1;
}

int json_skip_string(json_cursor *c, int *escaped) {
    *escaped = 0;
    if (!json_peek(c, '"'))
        return 0;
    c->at++;
    while (c->at < c->end) {
        unsigned char ch = *c->at++;
        if (ch == '"')
            return 1;
        if (ch == '\\') {
            *escaped = 1;
            if (!skip_escape(c))
                return 0;
        } else if (ch < 0x20) /* raw control characters must be escaped */
            return 0;
        else if (ch >= 0x80 && !skip_utf8_tail(c, ch))
            return 0;
    }
    return 0; /* no closing quote */
}

/* Skips one or more digits. */
static int skip_digits(json_cursor *c) {
    const unsigned char *first = c->at;
    while (c->at < c->end && is_digit(*c->at))
        c->at++;
    return c->at > first;
}

int json_skip_number(json_cursor *c, int *integer) {
    *integer = 1;
    if (json_peek(c, '-'))
        c->at++;
    if (json_peek(c, '0'))
        c->at++; /* a leading zero stands alone: "01" ends after the 0 */
    else if (c->at >= c->end || *c->at < '1' || *c->at > '9' || !skip_digits(c))
        return 0;
    if (json_peek(c, '.')) {
        c->at++;
        *integer = 0;
        if (!skip_digits(c))
            return 0;
    }
    if (json_peek(c, 'e') || json_peek(c, 'E')) {
        c->at++;
        *integer = 0;
        if (json_peek(c, '+') || json_peek(c, '-'))
            c->at++;
        if (!skip_digits(c))
            return 0;
    }
    return 1;
}

/* Skips the literal `word` (true, false, null). */
static int skip_word(json_cursor *c, const char *word) {
    size_t len = strlen(word);
    if ((size_t)(c->end - c->at) < len || memcmp(c->at, word, len) != 0)
        return 0;
    c->at += len;
    return 1;
}

/* Skips the members of an object or the elements of an array after its opening bracket,
 * through the closing one: `[ ]`, `[v, v]`, `{ }`, `{"k": v, "k": v}`. */
static int skip_container(json_cursor *c, int depth, int object) {
    unsigned char close = object ? '}' : ']';
    int escaped;
    json_skip_ws(c);
    if (json_peek(c, close)) {
        c->at++;
        return 1;
    }
    for (;;) {
        if (object) {
            if (!json_skip_string(c, &escaped))
                return 0;
            json_skip_ws(c);
            if (!json_peek(c, ':'))
                return 0;
            c->at++;
            json_skip_ws(c);
        }
        if (!json_skip_value(c, depth - 1))
            return 0;
        json_skip_ws(c);
        if (json_peek(c, close)) {
            c->at++;
            return 1;
        }
        if (!json_peek(c, ','))
            return 0;
        c->at++;
        json_skip_ws(c); /* a trailing comma then fails: "]" is not a value */
    }
}

int json_skip_value(json_cursor *c, int depth) {
    int ignored;
    if (c->at >= c->end)
        return 0;
    switch (*c->at) {
    case '{':
    case '[':
        if (depth <= 0)
            return 0;
        c->at++;
        return skip_container(c, depth, c->at[-1] == '{');
    case '"': return json_skip_string(c, &ignored);
    case 't': return skip_word(c, "true");
    case 'f': return skip_word(c, "false");
    case 'n': return skip_word(c, "null");
    default: return json_skip_number(c, &ignored);
    }
}
