/* fl_json_numbers.h - the fast path for the HTTP front's usual JSON body: a top-level object
 * whose "inputs" is a rectangular nested array of numbers, read into doubles without Python.
 *
 * Only that one shape of body is taken; anything else -- "inputs" missing, a scalar, an
 * object (named inputs), holding null/true/false/strings, ragged, with an empty array, a
 * duplicate key, a key written with escapes, any syntax error (RFC 8259, strictly: no
 * NaN/Infinity, no leading zeros, no trailing commas, strings in valid UTF-8), a number
 * json_number.h leaves to Python (past a double's range, an integer literal >= 2**53), nesting
 * past the limits -- is FL_ENOTSUP, so the caller runs its general parser and says what is
 * wrong in its own words. The other top-level keys are not decoded: their names and the byte
 * spans of their raw JSON values are returned (checked as JSON) for the caller to decode.
 * Nothing here needs Python; parsing never reads past `len`; thread-safe.
 */
#ifndef FL_JSON_NUMBERS_H
#define FL_JSON_NUMBERS_H

#include <stddef.h>
#include <stdint.h>

enum {
    FL_JSON_MAX_DIMS = 32,  /* nesting of "inputs" (NumPy's own limit is 64) */
    FL_JSON_MAX_DEPTH = 64, /* nesting of any other value */
    FL_JSON_MAX_KEYS = 16,  /* top-level keys besides "inputs" */
};

/* A range of the body's bytes. */
typedef struct fl_json_span {
    size_t start, len;
} fl_json_span;

typedef struct fl_json_key {
    fl_json_span name;  /* the key's UTF-8 bytes, between its quotes (it has no escapes) */
    fl_json_span value; /* its JSON value, as written */
} fl_json_key;

typedef struct fl_json_inputs {
    double *values; /* count doubles, row-major (C order); malloc'd, owned by this struct */
    size_t count;   /* product(shape), >= 1 */
    int ndim;       /* 1 .. FL_JSON_MAX_DIMS */
    int64_t shape[FL_JSON_MAX_DIMS];
    int nkeys; /* the other top-level keys, in the order of the body */
    fl_json_key keys[FL_JSON_MAX_KEYS];
} fl_json_inputs;

/* Parses `body` (len bytes, need not end in NUL). Returns 0 and fills *out (release it with
 * fl_json_inputs_free), FL_ENOTSUP when the body is not the case above (the detail says at
 * which byte and why; *out then holds nothing), or FL_ENOMEM. Pure computation: the caller
 * may run it without any lock, on bytes nobody changes meanwhile. */
int fl_json_parse_inputs(const void *body, size_t len, fl_json_inputs *out);

/* Frees out->values and empties *out. Safe on a zeroed or already-freed struct. */
void fl_json_inputs_free(fl_json_inputs *out);

/* The same fast path for an Open Inference Protocol (KServe v2) infer request whose every
 * input carries its elements as "data", a rectangular nested array of numbers:
 *     {"inputs": [{"name": ..., "datatype": ..., "shape": ..., "data": [[...]]}, ...], ...}
 * Each input object is read as a body above is, with "data" in place of "inputs": its numbers,
 * and its other members (name, datatype, shape, parameters) as spans. The request's other
 * members (id, outputs, parameters, ...) are spans too. What the caller checks -- names,
 * datatypes, shapes -- is not checked here. An input without numeric "data" (binary data, a
 * BYTES or BOOL tensor), no inputs, more than FL_JSON_V2_MAX_INPUTS, and everything refused
 * above is FL_ENOTSUP: the caller's general parser takes the body. */
enum { FL_JSON_V2_MAX_INPUTS = 16 };

typedef struct fl_json_v2_request {
    int ninputs; /* 1 .. FL_JSON_V2_MAX_INPUTS, in the order of the body */
    fl_json_inputs inputs[FL_JSON_V2_MAX_INPUTS];
    fl_json_inputs rest; /* the request's other members (its values stay NULL) */
} fl_json_v2_request;

/* Parses `body` as above. Returns 0 and fills *out (release it with fl_json_v2_request_free),
 * FL_ENOTSUP (a detail says where and why; *out holds nothing) or FL_ENOMEM. */
int fl_json_parse_v2_request(const void *body, size_t len, fl_json_v2_request *out);

/* Frees every input's numbers and empties *out. Safe on a zeroed or already-freed struct. */
void fl_json_v2_request_free(fl_json_v2_request *out);

#endif
