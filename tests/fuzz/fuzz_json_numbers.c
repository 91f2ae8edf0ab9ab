/* fuzz_json_numbers.c - libFuzzer target for fl_json_parse_inputs and fl_json_parse_v2_request:
 * any input either parses into numbers and key spans that satisfy every documented invariant
 * (and parse the same a second time), or is refused with FL_ENOTSUP and a printable detail,
 * leaving nothing held.
 * replay_json_numbers.c includes this file to run the corpus without clang. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/fl_error.h"
#include "fuzz_checks.h"
#include "serve/fl_json_numbers.h"

static int inside(fl_json_span span, size_t size) {
    return span.start <= size && span.len <= size - span.start;
}

/* The numbers' shape, count and values. */
static void check_numbers(const fl_json_inputs *out) {
    INVARIANT(out->ndim >= 1 && out->ndim <= FL_JSON_MAX_DIMS);
    size_t count = 1;
    for (int d = 0; d < out->ndim; d++) {
        INVARIANT(out->shape[d] >= 1);
        count *= (size_t)out->shape[d];
    }
    INVARIANT(count == out->count && out->values != NULL);
    for (size_t i = 0; i < out->count; i++)
        INVARIANT(isfinite(out->values[i]));
}

/* The other members' spans: inside the body, keys without escapes, never `numbers_key` (the
 * member the numbers came from: "inputs", or a v2 input's "data"), values that start a value. */
static void check_keys(const fl_json_inputs *out, const uint8_t *data, size_t size, const char *numbers_key) {
    INVARIANT(out->nkeys >= 0 && out->nkeys <= FL_JSON_MAX_KEYS);
    size_t excluded = strlen(numbers_key);
    for (int k = 0; k < out->nkeys; k++) {
        const fl_json_key *key = &out->keys[k];
        INVARIANT(inside(key->name, size) && inside(key->value, size) && key->value.len > 0);
        INVARIANT(memchr(data + key->name.start, '\\', key->name.len) == NULL);
        INVARIANT(!(key->name.len == excluded && memcmp(data + key->name.start, numbers_key, excluded) == 0));
        INVARIANT(strchr("{[\"tfn-0123456789", data[key->value.start]) != NULL);
    }
}

static void same_numbers(const fl_json_inputs *a, const fl_json_inputs *b) {
    INVARIANT(a->count == b->count && a->nkeys == b->nkeys);
    INVARIANT(a->count == 0 || memcmp(a->values, b->values, a->count * sizeof *a->values) == 0);
    INVARIANT(memcmp(a->keys, b->keys, sizeof a->keys) == 0);
}

static void fuzz_v2_request(const uint8_t *data, size_t size) {
    fl_json_v2_request out, again;
    fl_error_clear();
    int rc = fl_json_parse_v2_request(data, size, &out);
    if (rc != FL_OK) {
        INVARIANT(rc == FL_ENOTSUP || rc == FL_ENOMEM);
        INVARIANT(out.ninputs == 0 && out.rest.nkeys == 0);
        INVARIANT(fl_error_detail()[0] != '\0' && printable(fl_error_detail()));
        return;
    }
    INVARIANT(out.ninputs >= 1 && out.ninputs <= FL_JSON_V2_MAX_INPUTS);
    for (int i = 0; i < out.ninputs; i++) {
        check_numbers(&out.inputs[i]);
        check_keys(&out.inputs[i], data, size, "data");
    }
    INVARIANT(out.rest.values == NULL && out.rest.count == 0);
    check_keys(&out.rest, data, size, "inputs");
    INVARIANT(fl_json_parse_v2_request(data, size, &again) == FL_OK && again.ninputs == out.ninputs);
    for (int i = 0; i < out.ninputs; i++)
        same_numbers(&out.inputs[i], &again.inputs[i]);
    same_numbers(&out.rest, &again.rest);
    fl_json_v2_request_free(&again);
    fl_json_v2_request_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_v2_request(data, size);
    fl_json_inputs out, again;
    fl_error_clear();
    int rc = fl_json_parse_inputs(data, size, &out);
    if (rc != FL_OK) {
        INVARIANT(rc == FL_ENOTSUP || rc == FL_ENOMEM);
        INVARIANT(out.values == NULL && out.nkeys == 0);
        INVARIANT(fl_error_detail()[0] != '\0' && printable(fl_error_detail()));
        return 0;
    }
    check_numbers(&out);
    check_keys(&out, data, size, "inputs");
    INVARIANT(fl_json_parse_inputs(data, size, &again) == FL_OK && again.count == out.count);
    INVARIANT(memcmp(again.values, out.values, out.count * sizeof *out.values) == 0);
    INVARIANT(again.nkeys == out.nkeys && memcmp(again.keys, out.keys, sizeof out.keys) == 0);
    fl_json_inputs_free(&again);
    fl_json_inputs_free(&out);
    return 0;
}
