/* test_json_numbers.c - the JSON fast path: the usual body parses into its numbers, shape and
 * the spans of its other keys; every other body (wrong shape, not JSON, a number left to
 * Python, past the limits) is FL_ENOTSUP with a detail, never a crash or an over-read (each
 * body is parsed from an exact-size heap copy, so ASan sees one byte too far); threads parse
 * at once (TSan). */
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "base/fl_error.h"
#include "serve/fl_json_numbers.h"

/* Runs a parser on an exact-size heap copy of text (no NUL after it). */
static int parse_copy(const char *text, int (*parser)(const void *, size_t, void *), void *out) {
    size_t len = strlen(text);
    char *copy = malloc(len > 0 ? len : 1);
    memcpy(copy, text, len);
    fl_error_clear();
    int rc = parser(copy, len, out);
    free(copy);
    return rc;
}

static int inputs_parser(const void *body, size_t len, void *out) { return fl_json_parse_inputs(body, len, out); }
static int v2_parser(const void *body, size_t len, void *out) { return fl_json_parse_v2_request(body, len, out); }

static int parse(const char *text, fl_json_inputs *out) { return parse_copy(text, inputs_parser, out); }

/* 1 when text is refused with FL_ENOTSUP and a detail, and leaves *out empty. */
static int refused(const char *text) {
    fl_json_inputs out;
    int rc = parse(text, &out);
    int ok = rc == FL_ENOTSUP && fl_error_detail()[0] != '\0' && out.values == NULL && out.nkeys == 0;
    if (!ok)
        fprintf(stderr, "  %s: %s\n", fl_err_name(rc), text);
    fl_json_inputs_free(&out);
    return ok;
}

static int same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_a_row_of_numbers_parses_with_the_other_keys_spans(void) {
    const char *body = " {\"id\" : \"a\\\"b\", \"inputs\": [0.5, -2, 1e2, -0.0, 0],\n\"timeout_s\":2.5}\r\n";
    fl_json_inputs out;
    CHECK(parse(body, &out) == FL_OK);
    CHECK(out.ndim == 1 && out.shape[0] == 5 && out.count == 5);
    CHECK(out.values[0] == 0.5 && out.values[1] == -2.0 && out.values[2] == 100.0);
    CHECK(same_bits(out.values[3], -0.0) && same_bits(out.values[4], 0.0));
    CHECK(out.nkeys == 2);
    CHECK(out.keys[0].name.len == 2 && memcmp(body + out.keys[0].name.start, "id", 2) == 0);
    CHECK(out.keys[0].value.len == 6 && memcmp(body + out.keys[0].value.start, "\"a\\\"b\"", 6) == 0);
    CHECK(out.keys[1].name.len == 9 && memcmp(body + out.keys[1].name.start, "timeout_s", 9) == 0);
    CHECK(out.keys[1].value.len == 3 && memcmp(body + out.keys[1].value.start, "2.5", 3) == 0);
    fl_json_inputs_free(&out);
    CHECK(out.values == NULL);
    fl_json_inputs_free(&out); /* twice is safe */
}

static void test_nested_arrays_give_their_shape_in_c_order(void) {
    fl_json_inputs out;
    CHECK(parse("{\"inputs\": [[[1], [2]], [[3], [4]], [[5], [6]]]}", &out) == FL_OK);
    CHECK(out.ndim == 3 && out.shape[0] == 3 && out.shape[1] == 2 && out.shape[2] == 1);
    for (size_t i = 0; i < out.count; i++)
        CHECK(out.values[i] == (double)(i + 1));
    fl_json_inputs_free(&out);
}

static void test_an_integer_minus_zero_is_plus_zero_and_a_float_one_keeps_its_sign(void) {
    fl_json_inputs out;
    CHECK(parse("{\"inputs\": [-0, -0.0, -0e5, 0]}", &out) == FL_OK);
    CHECK(same_bits(out.values[0], 0.0) && same_bits(out.values[1], -0.0));
    CHECK(same_bits(out.values[2], -0.0) && same_bits(out.values[3], 0.0));
    fl_json_inputs_free(&out);
}

static void test_numbers_round_correctly(void) {
    const struct {
        const char *text;
        double value;
    } cases[] = {
        {"0.1", 0.1},
        {"1.7976931348623157e308", 1.7976931348623157e308},
        {"4.9e-324", 4.9e-324},
        {"2.2250738585072011e-308", 2.2250738585072011e-308},
        {"9007199254740993.0", 9007199254740992.0}, /* a tie, to even */
        {"9007199254740995.0", 9007199254740996.0},
        {"1e-400", 0.0},
        {"123456789012345678901234567890e-30", 0.12345678901234568},
        {"3.141592653589793238462643383279", 3.141592653589793},
        {"9007199254740991", 9007199254740991.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"inputs\": [%s]}", cases[i].text);
        fl_json_inputs out;
        CHECK(parse(body, &out) == FL_OK && same_bits(out.values[0], cases[i].value));
        fl_json_inputs_free(&out);
    }
}

static void test_numbers_ignore_the_locale(void) {
    /* A locale with a decimal comma changes strtod(); none may be installed: then this
     * checks the "C" path only. */
    const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "ru_RU.UTF-8"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (setlocale(LC_NUMERIC, names[i]) != NULL)
            break;
    fl_json_inputs out;
    CHECK(parse("{\"inputs\": [1.5, 2.5e-1, 0.12345678901234567890123]}", &out) == FL_OK);
    CHECK(out.values[0] == 1.5 && out.values[1] == 0.25 && out.values[2] == 0.12345678901234568);
    fl_json_inputs_free(&out);
    setlocale(LC_NUMERIC, "C");
}

static void test_other_shapes_of_inputs_are_refused(void) {
    CHECK(refused("{\"inputs\": {\"a\": [1]}}"));
    CHECK(refused("{\"inputs\": 5}"));
    CHECK(refused("{\"inputs\": \"abc\"}"));
    CHECK(refused("{\"inputs\": [1, null]}"));
    CHECK(refused("{\"inputs\": [true]}"));
    CHECK(refused("{\"inputs\": [\"1\"]}"));
    CHECK(refused("{\"inputs\": [[1, 2], [3]]}"));
    CHECK(refused("{\"inputs\": [[1], [2, 3]]}"));
    CHECK(refused("{\"inputs\": [[1], 2]}"));
    CHECK(refused("{\"inputs\": [1, [2]]}"));
    CHECK(refused("{\"inputs\": [[[1]], [2]]}"));
    CHECK(refused("{\"inputs\": []}"));
    CHECK(refused("{\"inputs\": [[]]}"));
    CHECK(refused("{\"inputs\": [[1], []]}"));
    CHECK(refused("{\"inputs\": [1], \"inputs\": [1]}"));
    CHECK(refused("{\"id\": \"a\", \"inputs\": [1], \"id\": \"b\"}"));
    CHECK(refused("{\"\\u0069nputs\": [1]}"));
    CHECK(refused("{\"id\": \"a\"}"));
    CHECK(refused("{}"));
}

static void test_numbers_left_to_python_are_refused(void) {
    CHECK(refused("{\"inputs\": [1e999]}"));
    CHECK(refused("{\"inputs\": [-1e309]}"));
    CHECK(refused("{\"inputs\": [9007199254740992]}"));
    CHECK(refused("{\"inputs\": [-9007199254740992]}"));
    CHECK(refused("{\"inputs\": [18446744073709551617]}"));
    char body[600] = "{\"inputs\": [";
    memset(body + strlen(body), '9', 400);
    strcat(body, "]}");
    CHECK(refused(body));
    strcpy(body, "{\"inputs\": [0.");
    memset(body + strlen(body), '0', 320);
    strcat(body, "5]}");
    CHECK(refused(body)); /* a subnormal (strtod_l's) longer than JSON_NUMBER_MAX_CHARS */
}

static void test_long_numbers_read_exactly_without_strtod_when_sure(void) {
    char body[600] = "{\"inputs\": [0.";
    memset(body + strlen(body), '0', 200);
    strcat(body, "1, 1.");
    memset(body + strlen(body), '0', 300);
    strcat(body, "]}");
    fl_json_inputs out;
    CHECK(parse(body, &out) == FL_OK && same_bits(out.values[0], 1e-201) && out.values[1] == 1.0);
    if (out.values == NULL)
        fprintf(stderr, "  refused: %s\n", fl_error_detail());
    fl_json_inputs_free(&out);
}

/* xorshift64*: the same numbers on every run */
static uint64_t next_random(uint64_t *state) {
    *state ^= *state >> 12, *state ^= *state << 25, *state ^= *state >> 27;
    return *state * UINT64_C(2685821657736338717);
}

/* One random number's text, of a kind that takes each conversion path: the shortest
 * round-trip forms (15-17 digits, as Python's repr and JSON encoders write them), float32's
 * 9 digits, random digit strings of 1-40 digits with random exponents, and decimal
 * expansions of the halfway points between neighbouring doubles (the hardest to round). */
static void random_number(uint64_t *state, char *text, size_t size) {
    uint64_t r = next_random(state), bits = next_random(state);
    double value;
    memcpy(&value, &bits, sizeof value);
    if (!isfinite(value))
        value = 0.5;
    switch (r % 6) {
    case 0: snprintf(text, size, "%.17e", value); break;
    case 1: snprintf(text, size, "%.15e", value); break;
    case 2: snprintf(text, size, "%.8e", (double)(float)((double)(int64_t)bits / 9.2e18)); break;
    case 3: {
        int digits = 1 + (int)((r >> 8) % 40), at = 0;
        if ((r >> 16) & 1)
            text[at++] = '-';
        text[at++] = (char)('1' + (r >> 17) % 9);
        text[at++] = '.';
        for (int i = 0; i < digits; i++)
            text[at++] = (char)('0' + next_random(state) % 10);
        snprintf(text + at, size - (size_t)at, "e%d", (int)((r >> 24) % 700) - 350);
        break;
    }
    case 4: { /* a halfway point, written out in full (long double holds it exactly) */
        double next = nextafter(value, INFINITY);
        long double mid = ((long double)value + (long double)next) / 2;
        snprintf(text, size, "%.60Le", mid);
        break;
    }
    default: snprintf(text, size, "%.16e", value * 1e-3); break;
    }
}

static void test_random_numbers_match_strtod_bit_for_bit(void) {
    uint64_t state = 88172645463325252u;
    enum { PER_BODY = 1000 };
    int bodies = (int)(300 * test_scale()) + 1;
    char (*texts)[96] = malloc(PER_BODY * sizeof *texts);
    char *body = malloc(PER_BODY * 100 + 32);
    for (int b = 0; b < bodies; b++) {
        char *at = body + sprintf(body, "{\"inputs\": [");
        int n = 0;
        while (n < PER_BODY) {
            random_number(&state, texts[n], sizeof texts[n]);
            double expected = strtod(texts[n], NULL);
            if (isinf(expected) || (expected != 0 && fabs(expected) < 2.2250738585072014e-308))
                continue; /* left to Python (inf), or strtod_l's (a subnormal: too long here) */
            at += sprintf(at, n + 1 < PER_BODY ? "%s," : "%s", texts[n]);
            n++;
        }
        strcpy(at, "]}");
        fl_json_inputs out;
        if (parse(body, &out) != FL_OK)
            fprintf(stderr, "  refused: %s: %.60s\n", fl_error_detail(),
                    body + atoi(fl_error_detail() + 5));
        for (int i = 0; out.values != NULL && i < PER_BODY; i++)
            if (!same_bits(out.values[i], strtod(texts[i], NULL))) {
                fprintf(stderr, "  %s: %.17g, strtod %.17g\n", texts[i], out.values[i],
                        strtod(texts[i], NULL));
                CHECK(0);
            }
        fl_json_inputs_free(&out);
    }
    free(texts);
    free(body);
}

static void test_hard_cases_round_correctly(void) {
    const char *texts[] = {
        "2.2250738585072012e-308", "2.2250738585072014e-308",
        "2.225073858507201136057409796709131975934819546351645648e-308", "1.7976931348623158e308",
        "1.7976931348623157e308", "9007199254740993e0", "9007199254740992.999999999999999999",
        "9007199254740993.000000000000000001", "4.9406564584124654e-324",
        "2.4703282292062328e-324", "1e-342", "1e-343", "1e308", "8.98846567431158e307", "0.1e1",
        "7.3177701707893310e+15", "1.00000000000000011102230246251565404236316680908203125",
        "1.00000000000000011102230246251565404236316680908203124",
        "1.00000000000000011102230246251565404236316680908203126",
        "1090544144181609348835077142190e0",
        "1.0000000000000000000000000000000000000000000000001e0", "-0.0e-999",
        "123456789012345678901234567890e-30", "0.000000000000000000000000000000000000000000001e45",
        "5e-324", "3e-324",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"inputs\": [%s]}", texts[i]);
        fl_json_inputs out;
        int rc = parse(body, &out);
        CHECK(rc == FL_OK && same_bits(out.values[0], strtod(texts[i], NULL)));
        if (rc != FL_OK || !same_bits(out.values[0], strtod(texts[i], NULL)))
            fprintf(stderr, "  %s\n", texts[i]);
        fl_json_inputs_free(&out);
    }
}

static void test_syntax_errors_are_refused(void) {
    const char *bodies[] = {
        "", " ", "null", "[1]", "{\"inputs\": [NaN]}", "{\"inputs\": [Infinity]}",
        "{\"inputs\": [-Infinity]}", "{\"inputs\": [01]}", "{\"inputs\": [-01]}", "{\"inputs\": [1.]}",
        "{\"inputs\": [.5]}", "{\"inputs\": [+1]}", "{\"inputs\": [1e]}", "{\"inputs\": [1e+]}",
        "{\"inputs\": [-]}", "{\"inputs\": [1,]}", "{\"inputs\": [1,,2]}", "{\"inputs\": [1 2]}",
        "{\"inputs\": [1],}", "{\"inputs\": [1] \"id\": 1}", "{\"inputs\" [1]}", "{'inputs': [1]}",
        "{\"inputs\": [1]} {}", "{\"inputs\": [1]}x", "{\"inputs\": [1]\f}", "{\"inputs\": [1]\v}",
        "\xef\xbb\xbf{\"inputs\": [1]}", "{\"inputs\": [1], \"id\": \"a\x01\"}",
        "{\"inputs\": [1], \"id\": \"\\x41\"}", "{\"inputs\": [1], \"id\": \"\\u12\"}",
        "{\"inputs\": [1], \"id\": \"\\u12g4\"}", "{\"inputs\": [1], \"id\": \"\xff\"}",
        "{\"inputs\": [1], \"id\": \"\xc0\x80\"}", "{\"inputs\": [1], \"id\": \"\xed\xa0\x80\"}",
        "{\"inputs\": [1], \"id\": \"\xf4\x90\x80\x80\"}", "{\"inputs\": [1], \"id\": \"\xe2\x82\"}",
        "{\"inputs\": [1], \"id\": \"\x80\"}", "{\"inputs\": [1], \"id\": \"abc",
        "{\"inputs\": [1], \"id\": tru}", "{\"inputs\": [1], \"id\": True}", "{\"inputs\": [1], \"id\": [1,]}",
        "{\"inputs\": [1], \"id\": {\"a\" 1}}", "{\"inputs\": [1], \"id\": {1: 2}}",
        "{\"inputs\": [1], \"id\": {\"a\": 1,}}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        CHECK(refused(bodies[i]));
}

static void test_valid_other_values_are_kept_as_written(void) {
    const char *values[] = {
        "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", "\"\\ud83d\\ude00\\n\\/\"", "true", "false", "null",
        "-1.5e-3", "{\"a\": [1, {\"b\": null}], \"c\": []}", "[]", "{}",
    };
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"inputs\": [1], \"x\": %s}", values[i]);
        fl_json_inputs out;
        CHECK(parse(body, &out) == FL_OK && out.nkeys == 1);
        CHECK(out.keys[0].value.len == strlen(values[i]));
        CHECK(memcmp(body + out.keys[0].value.start, values[i], strlen(values[i])) == 0);
        fl_json_inputs_free(&out);
    }
}

/* "[" x n, then 1, then "]" x n, inside {"<key>": ...}. */
static char *nested(const char *key, int n) {
    char *body = malloc((size_t)(2 * n + 64));
    int at = sprintf(body, "{\"inputs\": [1], \"%s\": ", key);
    if (strcmp(key, "inputs") == 0)
        at = sprintf(body, "{\"inputs\": ");
    memset(body + at, '[', (size_t)n);
    at += n;
    body[at++] = '1';
    memset(body + at, ']', (size_t)n);
    strcpy(body + at + n, "}");
    return body;
}

static void test_nesting_past_the_limits_is_refused(void) {
    char *ok_inputs = nested("inputs", FL_JSON_MAX_DIMS), *deep_inputs = nested("inputs", FL_JSON_MAX_DIMS + 1);
    char *ok_id = nested("id", FL_JSON_MAX_DEPTH), *deep_id = nested("id", FL_JSON_MAX_DEPTH + 1);
    char *very_deep = nested("id", 100000);
    fl_json_inputs out;
    CHECK(parse(ok_inputs, &out) == FL_OK && out.ndim == FL_JSON_MAX_DIMS && out.count == 1);
    fl_json_inputs_free(&out);
    CHECK(parse(ok_id, &out) == FL_OK);
    fl_json_inputs_free(&out);
    CHECK(refused(deep_inputs) && refused(deep_id) && refused(very_deep));
    free(ok_inputs), free(deep_inputs), free(ok_id), free(deep_id), free(very_deep);
}

static void test_too_many_keys_are_refused(void) {
    char body[512] = "{\"inputs\": [1]";
    for (int i = 0; i <= FL_JSON_MAX_KEYS; i++)
        sprintf(body + strlen(body), ", \"k%d\": %d", i, i);
    strcat(body, "}");
    CHECK(refused(body));
}

static void test_every_truncation_is_refused(void) {
    const char *body = "{\"id\": \"\xc3\xa9\\u00e9\", \"inputs\": [[1.5e-3, -2], [3, 4E+1]], \"t\": [true, null]}";
    size_t len = strlen(body);
    for (size_t cut = 0; cut < len; cut++) {
        char *copy = malloc(cut > 0 ? cut : 1);
        memcpy(copy, body, cut);
        fl_json_inputs out;
        CHECK(fl_json_parse_inputs(copy, cut, &out) == FL_ENOTSUP && out.values == NULL);
        free(copy);
    }
    fl_json_inputs out;
    CHECK(refused("{\"inputs\": [1]") && parse("{\"inputs\": [1]}", &out) == FL_OK);
    fl_json_inputs_free(&out);
}

static void test_a_large_body_grows_its_buffer(void) {
    size_t rows = 300, cols = 784;
    char *body = malloc(rows * cols * 8 + 64), *at = body;
    at += sprintf(at, "{\"inputs\": [");
    for (size_t r = 0; r < rows; r++) {
        *at++ = '[';
        for (size_t c = 0; c < cols; c++)
            at += sprintf(at, c + 1 < cols ? "%zu," : "%zu", (r * cols + c) % 1000);
        at += sprintf(at, r + 1 < rows ? "]," : "]");
    }
    strcpy(at, "]}");
    fl_json_inputs out;
    CHECK(parse(body, &out) == FL_OK && out.ndim == 2 && out.shape[0] == (int64_t)rows &&
          out.shape[1] == (int64_t)cols);
    for (size_t i = 0; i < out.count; i++)
        CHECK(out.values[i] == (double)(i % 1000));
    fl_json_inputs_free(&out);
    free(body);
}

static void *parse_many(void *arg) {
    const char *body = arg;
    for (int i = 0; i < 2000; i++) {
        fl_json_inputs out;
        if (fl_json_parse_inputs(body, strlen(body), &out) != FL_OK || out.values[2] != 0.3)
            abort();
        fl_json_inputs_free(&out);
        if (fl_json_parse_inputs(body, strlen(body) - 1, &out) != FL_ENOTSUP)
            abort();
    }
    return NULL;
}

static void test_threads_parse_at_once(void) {
    const char *body = "{\"inputs\": [[0.1, 0.2, 0.3, 1e-310, 12345678901234567890.5]], \"id\": \"t\"}";
    pthread_t threads[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&threads[i], NULL, parse_many, (void *)body) == 0);
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
}

/* ---- fl_json_parse_v2_request */

static int parse_v2(const char *text, fl_json_v2_request *out) { return parse_copy(text, v2_parser, out); }

static int span_is(const char *body, fl_json_span span, const char *text) {
    return span.len == strlen(text) && memcmp(body + span.start, text, span.len) == 0;
}

static void test_a_v2_request_gives_each_inputs_numbers_and_the_other_spans(void) {
    const char *body = "{\"id\": \"r1\", \"inputs\": [{\"name\": \"x\", \"shape\": [2, 2], \"datatype\": \"FP32\", "
                       "\"data\": [[1, 2.5], [3, -4]]}, {\"data\": [7], \"name\": \"y\", \"parameters\": {}}], "
                       "\"outputs\": [{\"name\": \"output0\"}]}";
    fl_json_v2_request out;
    CHECK(parse_v2(body, &out) == FL_OK);
    CHECK(out.ninputs == 2);
    const fl_json_inputs *x = &out.inputs[0], *y = &out.inputs[1];
    CHECK(x->ndim == 2 && x->shape[0] == 2 && x->shape[1] == 2 && x->count == 4);
    CHECK(x->values[1] == 2.5 && x->values[3] == -4.0);
    CHECK(x->nkeys == 3 && span_is(body, x->keys[0].name, "name") && span_is(body, x->keys[0].value, "\"x\""));
    CHECK(span_is(body, x->keys[1].value, "[2, 2]") && span_is(body, x->keys[2].value, "\"FP32\""));
    CHECK(y->ndim == 1 && y->count == 1 && y->values[0] == 7.0 && y->nkeys == 2);
    CHECK(span_is(body, y->keys[1].name, "parameters") && span_is(body, y->keys[1].value, "{}"));
    CHECK(out.rest.nkeys == 2 && out.rest.values == NULL);
    CHECK(span_is(body, out.rest.keys[0].name, "id") && span_is(body, out.rest.keys[1].name, "outputs"));
    CHECK(span_is(body, out.rest.keys[1].value, "[{\"name\": \"output0\"}]"));
    fl_json_v2_request_free(&out);
    CHECK(out.ninputs == 0);
    fl_json_v2_request_free(&out); /* twice is safe */
}

static int v2_refused(const char *text) {
    fl_json_v2_request out;
    int rc = parse_v2(text, &out);
    int ok = rc == FL_ENOTSUP && fl_error_detail()[0] != '\0' && out.ninputs == 0 && out.rest.nkeys == 0;
    if (!ok)
        fprintf(stderr, "  %s: %s\n", fl_err_name(rc), text);
    fl_json_v2_request_free(&out);
    return ok;
}

static void test_v2_requests_for_the_general_path_are_refused(void) {
    CHECK(v2_refused("{}"));
    CHECK(v2_refused("{\"inputs\": []}"));
    CHECK(v2_refused("{\"inputs\": {}}"));
    CHECK(v2_refused("{\"inputs\": [{\"name\": \"x\"}]}")); /* binary data, or none */
    CHECK(v2_refused("{\"inputs\": [{\"data\": [true]}]}")); /* BOOL */
    CHECK(v2_refused("{\"inputs\": [{\"data\": [\"a\"]}]}")); /* BYTES */
    CHECK(v2_refused("{\"inputs\": [{\"data\": [1], \"data\": [2]}]}"));
    CHECK(v2_refused("{\"inputs\": [{\"data\": [1]}], \"inputs\": [{\"data\": [2]}]}"));
    CHECK(v2_refused("{\"inputs\": [{\"data\": [1]}], \"id\": \"a\", \"id\": \"b\"}"));
    CHECK(v2_refused("{\"inputs\": [{\"d\\u0061ta\": [1]}]}"));
    CHECK(v2_refused("{\"inputs\": [{\"data\": [1]}] x"));
    CHECK(v2_refused("{\"inputs\": [{\"data\": [1]},]}"));
    CHECK(v2_refused("{\"inputs\": [{\"data\": [[1], 2]}]}"));
    CHECK(v2_refused("[{\"inputs\": [{\"data\": [1]}]}]"));
    char many[2048] = "{\"inputs\": [";
    for (int i = 0; i <= FL_JSON_V2_MAX_INPUTS; i++)
        strcat(many, i ? ", {\"data\": [1]}" : "{\"data\": [1]}");
    strcat(many, "]}");
    CHECK(v2_refused(many));
}

static void test_every_truncated_v2_request_is_refused(void) {
    const char *body = "{\"inputs\": [{\"name\": \"x\", \"data\": [[1.5, 2], [3, 4]]}], \"id\": \"q\"}";
    fl_json_v2_request out;
    CHECK(parse_v2(body, &out) == FL_OK);
    fl_json_v2_request_free(&out);
    char cut[128];
    for (size_t len = 0; len < strlen(body); len++) {
        memcpy(cut, body, len);
        cut[len] = '\0';
        CHECK(v2_refused(cut));
    }
}

int main(void) {
    RUN(test_a_row_of_numbers_parses_with_the_other_keys_spans);
    RUN(test_nested_arrays_give_their_shape_in_c_order);
    RUN(test_an_integer_minus_zero_is_plus_zero_and_a_float_one_keeps_its_sign);
    RUN(test_numbers_round_correctly);
    RUN(test_numbers_ignore_the_locale);
    RUN(test_other_shapes_of_inputs_are_refused);
    RUN(test_numbers_left_to_python_are_refused);
    RUN(test_long_numbers_read_exactly_without_strtod_when_sure);
    RUN(test_random_numbers_match_strtod_bit_for_bit);
    RUN(test_hard_cases_round_correctly);
    RUN(test_syntax_errors_are_refused);
    RUN(test_valid_other_values_are_kept_as_written);
    RUN(test_nesting_past_the_limits_is_refused);
    RUN(test_too_many_keys_are_refused);
    RUN(test_every_truncation_is_refused);
    RUN(test_a_large_body_grows_its_buffer);
    RUN(test_threads_parse_at_once);
    RUN(test_a_v2_request_gives_each_inputs_numbers_and_the_other_spans);
    RUN(test_v2_requests_for_the_general_path_are_refused);
    RUN(test_every_truncated_v2_request_is_refused);
    return check_failures != 0;
}
