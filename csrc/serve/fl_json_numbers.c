/* fl_json_numbers.c - the body's top-level object and its "inputs" array of numbers
 * (fl_json_numbers.h); json_lex.c and json_number.c do the tokens. */
#include "serve/fl_json_numbers.h"

#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "serve/json_lex.h"
#include "serve/json_number.h"

/* Refuses the body: the caller takes its general path. */
static int not_here(const json_cursor *c, const char *why) {
    return fl_error_set(FL_ENOTSUP, "byte %td: %s", c->at - c->start, why);
}

/* The numbers of "inputs" as they are read, and the shape they have shown so far. */
typedef struct numbers {
    double *values;
    size_t count, cap;
    int ndim;                        /* 0 until the first number says how deep numbers sit */
    int64_t shape[FL_JSON_MAX_DIMS]; /* -1 until an array at that depth has closed */
} numbers;

static int append(numbers *n, double value) {
    if (n->count == n->cap) {
        size_t cap = n->cap ? 2 * n->cap : 1024;
        double *grown = realloc(n->values, cap * sizeof *grown);
        if (grown == NULL)
            return fl_error_set(FL_ENOMEM, "%zu numbers", cap);
        n->values = grown;
        n->cap = cap;
    }
    n->values[n->count++] = value;
    return FL_OK;
}

/* Reads one element of an array, the cursor at it. */
typedef int (*element_reader)(json_cursor *c, void *ctx);

/* An array at the cursor ('[' there), not empty (`empty_why` refuses one): each element read
 * by `read`, their number into *length. Inlined so that each caller's `read` is a direct call
 * (7% more instructions a number without). */
static inline __attribute__((always_inline)) int read_elements(json_cursor *c, element_reader read, void *ctx, const char *empty_why,
                         int64_t *length) {
    *length = 0;
    c->at++;
    json_skip_ws(c);
    if (json_peek(c, ']'))
        return not_here(c, empty_why);
    for (;;) {
        int rc = read(c, ctx);
        if (rc != FL_OK)
            return rc;
        ++*length;
        json_skip_ws(c);
        if (json_peek(c, ']'))
            break;
        if (!json_peek(c, ','))
            return not_here(c, "expected ',' or ']'");
        c->at++;
        json_skip_ws(c);
    }
    c->at++;
    return FL_OK;
}

/* Where an array of numbers stands: the numbers so far, and the depth of its elements. */
typedef struct numbers_at {
    numbers *n;
    int depth;
} numbers_at;

static int read_array(json_cursor *c, numbers *n, int depth);

/* One element of an array at `depth`: a nested array or a number, as the shape requires. */
static int read_element(json_cursor *c, void *ctx) {
    numbers *n = ((numbers_at *)ctx)->n;
    int depth = ((numbers_at *)ctx)->depth;
    if (json_peek(c, '[')) {
        if (n->ndim != 0 && depth + 1 >= n->ndim)
            return not_here(c, "an array where the other rows hold numbers (ragged)");
        return read_array(c, n, depth + 1);
    }
    if (n->ndim == 0)
        n->ndim = depth + 1;
    else if (n->ndim != depth + 1)
        return not_here(c, "a number where the other rows hold arrays (ragged)");
    double value;
    if (!json_read_number(c, &value))
        return not_here(c, "not a number the fast path reads");
    return append(n, value);
}

/* An array at `depth` (its '[' at the cursor): its elements, then its length checked
 * against the other arrays at that depth. */
static int read_array(json_cursor *c, numbers *n, int depth) {
    if (depth >= FL_JSON_MAX_DIMS)
        return not_here(c, "'inputs' nested too deep");
    numbers_at at = {n, depth};
    int64_t length;
    int rc = read_elements(c, read_element, &at, "an empty array", &length);
    if (rc != FL_OK)
        return rc;
    if (n->shape[depth] < 0)
        n->shape[depth] = length;
    else if (n->shape[depth] != length)
        return not_here(c, "rows of different lengths (ragged)");
    return FL_OK;
}

/* The "inputs" value at the cursor into out. */
static int read_inputs(json_cursor *c, fl_json_inputs *out) {
    if (!json_peek(c, '['))
        return not_here(c, "'inputs' is not an array");
    numbers n = {.values = NULL};
    for (int d = 0; d < FL_JSON_MAX_DIMS; d++)
        n.shape[d] = -1;
    int rc = read_array(c, &n, 0);
    if (rc != FL_OK) {
        free(n.values);
        return rc;
    }
    out->values = n.values;
    out->count = n.count;
    out->ndim = n.ndim;
    memcpy(out->shape, n.shape, sizeof out->shape);
    return FL_OK;
}

static int same_name(const unsigned char *body, fl_json_span a, fl_json_span b) {
    return a.len == b.len && memcmp(body + a.start, body + b.start, a.len) == 0;
}

/* Another top-level key: its value is checked as JSON and its span kept. */
static int read_other(json_cursor *c, fl_json_span name, fl_json_inputs *out) {
    for (int i = 0; i < out->nkeys; i++)
        if (same_name(c->start, out->keys[i].name, name))
            return not_here(c, "a duplicate key");
    if (out->nkeys == FL_JSON_MAX_KEYS)
        return not_here(c, "too many keys");
    const unsigned char *value = c->at;
    if (!json_skip_value(c, FL_JSON_MAX_DEPTH))
        return not_here(c, "not a JSON value the fast path takes");
    out->keys[out->nkeys++] =
        (fl_json_key){name, {(size_t)(value - c->start), (size_t)(c->at - value)}};
    return FL_OK;
}

/* Reads one member's value; `name` is its key (no escapes), the cursor at its value. */
typedef int (*member_reader)(json_cursor *c, fl_json_span name, void *ctx);

static int is_key(const json_cursor *c, fl_json_span name, const char *key) {
    size_t len = strlen(key);
    return name.len == len && memcmp(c->start + name.start, key, len) == 0;
}

/* An object at the cursor: '{' (key ':' value (',' key ':' value)*)? '}', each key a string
 * without escapes ("\u0069nputs" is "inputs": the general path decodes it), each value read by
 * `read`. */
static int read_object(json_cursor *c, member_reader read, void *ctx) {
    if (!json_peek(c, '{'))
        return not_here(c, "not an object");
    c->at++;
    json_skip_ws(c);
    if (json_peek(c, '}')) {
        c->at++;
        return FL_OK;
    }
    for (;;) {
        const unsigned char *name = c->at + 1;
        int escaped;
        if (!json_skip_string(c, &escaped))
            return not_here(c, "expected a key");
        if (escaped)
            return not_here(c, "a key with escapes");
        fl_json_span span = {(size_t)(name - c->start), (size_t)(c->at - 1 - name)};
        json_skip_ws(c);
        if (!json_peek(c, ':'))
            return not_here(c, "expected ':'");
        c->at++;
        json_skip_ws(c);
        int rc = read(c, span, ctx);
        if (rc != FL_OK)
            return rc;
        json_skip_ws(c);
        if (json_peek(c, '}'))
            break;
        if (!json_peek(c, ','))
            return not_here(c, "expected ',' or '}'");
        c->at++;
        json_skip_ws(c);
    }
    c->at++;
    return FL_OK;
}

/* A member of an object whose numbers sit under the key `numbers_key`: those numbers, or any
 * other member's span. */
typedef struct numbers_object {
    fl_json_inputs *out;
    const char *numbers_key;
} numbers_object;

static int read_numbers_member(json_cursor *c, fl_json_span name, void *ctx) {
    numbers_object *object = ctx;
    if (is_key(c, name, object->numbers_key)) {
        if (object->out->values != NULL)
            return not_here(c, "a duplicate key");
        return read_inputs(c, object->out);
    }
    return read_other(c, name, object->out);
}

/* An object holding `numbers_key` (its numbers into out, the other members' spans too). */
static int read_numbers_object(json_cursor *c, fl_json_inputs *out, const char *numbers_key) {
    numbers_object object = {out, numbers_key};
    int rc = read_object(c, read_numbers_member, &object);
    if (rc == FL_OK && out->values == NULL)
        return not_here(c, numbers_key[0] == 'i' ? "no 'inputs'" : "an input without numeric 'data'");
    return rc;
}

/* The whole body: whitespace, its value by `read`, then only whitespace to the end. */
static int read_whole(const void *body, size_t len, int (*read)(json_cursor *c, void *out), void *out) {
    if (body == NULL)
        return fl_error_set(FL_ENOTSUP, "no body");
    const unsigned char *start = body;
    json_cursor c = {start, start + len, start};
    json_skip_ws(&c);
    int rc = read(&c, out);
    if (rc != FL_OK)
        return rc;
    json_skip_ws(&c);
    if (c.at != c.end)
        return not_here(&c, "bytes after the object");
    return FL_OK;
}

static int read_body(json_cursor *c, void *out) { return read_numbers_object(c, out, "inputs"); }

int fl_json_parse_inputs(const void *body, size_t len, fl_json_inputs *out) {
    memset(out, 0, sizeof *out);
    int rc = read_whole(body, len, read_body, out);
    if (rc != FL_OK)
        fl_json_inputs_free(out);
    return rc;
}

void fl_json_inputs_free(fl_json_inputs *out) {
    free(out->values);
    memset(out, 0, sizeof *out);
}

/* ---- an Open Inference Protocol infer request (fl_json_v2_request) */

/* One object of the "inputs" array: an input with numeric "data". */
static int read_v2_input(json_cursor *c, void *ctx) {
    fl_json_v2_request *out = ctx;
    if (out->ninputs == FL_JSON_V2_MAX_INPUTS)
        return not_here(c, "too many inputs");
    return read_numbers_object(c, &out->inputs[out->ninputs++], "data");
}

/* The "inputs" array: one object per input. */
static int read_v2_inputs(json_cursor *c, fl_json_v2_request *out) {
    if (!json_peek(c, '['))
        return not_here(c, "'inputs' is not an array");
    int64_t count;
    return read_elements(c, read_v2_input, out, "no inputs", &count);
}

static int read_v2_member(json_cursor *c, fl_json_span name, void *ctx) {
    fl_json_v2_request *out = ctx;
    if (is_key(c, name, "inputs")) {
        if (out->ninputs != 0)
            return not_here(c, "a duplicate key");
        return read_v2_inputs(c, out);
    }
    return read_other(c, name, &out->rest);
}

static int read_v2(json_cursor *c, void *out) {
    fl_json_v2_request *request = out;
    int rc = read_object(c, read_v2_member, request);
    if (rc == FL_OK && request->ninputs == 0)
        return not_here(c, "no 'inputs'");
    return rc;
}

int fl_json_parse_v2_request(const void *body, size_t len, fl_json_v2_request *out) {
    memset(out, 0, sizeof *out);
    int rc = read_whole(body, len, read_v2, out);
    if (rc != FL_OK)
        fl_json_v2_request_free(out);
    return rc;
}

void fl_json_v2_request_free(fl_json_v2_request *out) {
    for (int i = 0; i < out->ninputs; i++)
        fl_json_inputs_free(&out->inputs[i]);
    memset(out, 0, sizeof *out);
}
