/* fuzz_json_numbers.c - libFuzzer target for fl_json_parse_inputs: any input either parses
 * into numbers and key spans that satisfy every documented invariant (and parse the same a
 * second time), or is refused with FL_ENOTSUP and a printable detail, leaving nothing held.
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

static void check_parsed(const fl_json_inputs *out, const uint8_t *data, size_t size) {
    INVARIANT(out->ndim >= 1 && out->ndim <= FL_JSON_MAX_DIMS);
    size_t count = 1;
    for (int d = 0; d < out->ndim; d++) {
        INVARIANT(out->shape[d] >= 1);
        count *= (size_t)out->shape[d];
    }
    INVARIANT(count == out->count && out->values != NULL);
    for (size_t i = 0; i < out->count; i++)
        INVARIANT(isfinite(out->values[i]));
    INVARIANT(out->nkeys >= 0 && out->nkeys <= FL_JSON_MAX_KEYS);
    for (int k = 0; k < out->nkeys; k++) {
        const fl_json_key *key = &out->keys[k];
        INVARIANT(inside(key->name, size) && inside(key->value, size) && key->value.len > 0);
        INVARIANT(memchr(data + key->name.start, '\\', key->name.len) == NULL);
        INVARIANT(!(key->name.len == 6 && memcmp(data + key->name.start, "inputs", 6) == 0));
        INVARIANT(strchr("{[\"tfn-0123456789", data[key->value.start]) != NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fl_json_inputs out, again;
    fl_error_clear();
    int rc = fl_json_parse_inputs(data, size, &out);
    if (rc != FL_OK) {
        INVARIANT(rc == FL_ENOTSUP || rc == FL_ENOMEM);
        INVARIANT(out.values == NULL && out.nkeys == 0);
        INVARIANT(fl_error_detail()[0] != '\0' && printable(fl_error_detail()));
        return 0;
    }
    check_parsed(&out, data, size);
    INVARIANT(fl_json_parse_inputs(data, size, &again) == FL_OK && again.count == out.count);
    INVARIANT(memcmp(again.values, out.values, out.count * sizeof *out.values) == 0);
    INVARIANT(again.nkeys == out.nkeys && memcmp(again.keys, out.keys, sizeof out.keys) == 0);
    fl_json_inputs_free(&again);
    fl_json_inputs_free(&out);
    return 0;
}
