/* test_npy.c - the .npy reader: files that NumPy wrote (embedded below, made with np.save and
 * numpy.lib.format.write_array) parse, map and read; every malformed header, truncated file,
 * missing file and mismatched expectation is refused with a detail that names the problem. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/fl_error.h"
#include "data/fl_npy.h"

static char tmpdir[] = "/tmp/fl_test_npy_XXXXXX";

/* f4_2x3 */
static const char F4_2X3[] =
    "\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }   "
    "                                                       \012\000\000\000\000\000\000"
    "\200\?\000\000\000@\000\000@@\000\000\200@\000\000\240@";

/* i8_scalar */
static const char I8_SCALAR[] =
    "\223NUMPY\001\000v\000{'descr': '<i8', 'fortran_order': False, 'shape': (), }       "
    "                                                       \012\007\000\000\000\000\000"
    "\000\000";

/* i2_fortran */
static const char I2_FORTRAN[] =
    "\223NUMPY\001\000v\000{'descr': '<i2', 'fortran_order': True, 'shape': (2, 3), }    "
    "                                                       \012\000\000\003\000\001\000"
    "\004\000\002\000\005\000";

/* f8_big_v2 */
static const char F8_BIG_V2[] =
    "\223NUMPY\002\000t\000\000\000{'descr': '>f8', 'fortran_order': False, 'shape': (3,)"
    ", }                                                          \012\000\000\000\000"
    "\000\000\000\000\?\360\000\000\000\000\000\000@\000\000\000\000\000\000\000";

/* u3_strings */
static const char U3_STRINGS[] =
    "\223NUMPY\001\000v\000{'descr': '<U3', 'fortran_order': False, 'shape': (2,), }     "
    "                                                       \012a\000\000\000b\000\000"
    "\000\000\000\000\000x\000\000\000y\000\000\000z\000\000\000";

/* u1_v3 */
static const char U1_V3[] =
    "\223NUMPY\003\000t\000\000\000{'descr': '<U1', 'fortran_order': False, 'shape': (1,)"
    ", }                                                          \012\351\000\000\000";

/* u1_empty */
static const char U1_EMPTY[] =
    "\223NUMPY\001\000v\000{'descr': '|u1', 'fortran_order': False, 'shape': (0, 3), }   "
    "                                                       \012";

/* m8_ns */
static const char M8_NS[] =
    "\223NUMPY\001\000v\000{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (1,), } "
    "                                                       \012\001\000\000\000\000\000"
    "\000\000";

typedef struct sample {
    const char *name, *bytes;
    size_t len;
} sample;

#define SAMPLE(name, array) {name, array, sizeof array - 1}
static const sample samples[] = {
    SAMPLE("f4_2x3", F4_2X3),         SAMPLE("i8_scalar", I8_SCALAR),
    SAMPLE("i2_fortran", I2_FORTRAN), SAMPLE("f8_big_v2", F8_BIG_V2),
    SAMPLE("u3_strings", U3_STRINGS), SAMPLE("u1_v3", U1_V3),
    SAMPLE("u1_empty", U1_EMPTY),     SAMPLE("m8_ns", M8_NS),
};
enum { SAMPLE_COUNT = sizeof samples / sizeof *samples };

/* Writes len bytes to tmpdir/name; returns the path (static storage, one per name slot). */
static const char *write_file(const char *name, const void *data, size_t len) {
    static char path[8][512];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len)
        fprintf(stderr, "cannot write %s\n", p);
    if (f != NULL)
        fclose(f);
    return p;
}

/* Parses from an exact-size heap copy, so ASan sees any read past len. */
static int parse(const void *data, size_t len, fl_npy_header *h) {
    void *copy = malloc(len ? len : 1);
    memcpy(copy, data, len);
    int rc = fl_npy_parse_header(copy, len, h);
    free(copy);
    return rc;
}

/* A file of format version major.0 whose header dict is `dict`, as written (no padding). */
static size_t make_npy_version(const char *dict, int major, char *out, size_t cap) {
    size_t n = strlen(dict), preamble = major == 1 ? 10 : 12;
    if (n + preamble > cap)
        return 0;
    memcpy(out, "\223NUMPY", 6);
    out[6] = (char)major;
    out[7] = 0;
    for (size_t b = 0; b < preamble - 8; b++)
        out[8 + b] = (char)(n >> (8 * b));
    memcpy(out + preamble, dict, n);
    return n + preamble;
}

static size_t make_npy(const char *dict, char *out, size_t cap) {
    return make_npy_version(dict, 1, out, cap);
}

static int detail_has(const char *needle) {
    if (strstr(fl_error_detail(), needle) != NULL)
        return 1;
    fprintf(stderr, "  detail \"%s\" lacks \"%s\"\n", fl_error_detail(), needle);
    return 0;
}

/* 1 if the header with this dict is refused with FL_EINVAL and a detail containing needle. */
static int rejects(const char *dict, const char *needle) {
    char buf[4096];
    fl_npy_header h;
    size_t len = make_npy(dict, buf, sizeof buf);
    int rc = parse(buf, len, &h);
    if (rc != FL_EINVAL) {
        fprintf(stderr, "  %s: %s accepted\n", fl_err_name(rc), dict);
        return 0;
    }
    return detail_has(needle);
}

/* A header the parser must refuse: the text that varies in its dict, what the detail says, and
 * the line the case is written on (a failure names it, as CHECK's own line would). */
typedef struct refusal {
    const char *text, *detail;
    int line;
} refusal;
#define REFUSAL(text, detail) {text, detail, __LINE__}

/* Checks that the dict `format` makes of each case's text is refused with the case's detail. */
static void check_refusals(const char *format, const refusal *cases, size_t count) {
    for (size_t i = 0; i < count; i++) {
        char dict[512];
        snprintf(dict, sizeof dict, format, cases[i].text);
        if (!rejects(dict, cases[i].detail)) {
            fprintf(stderr, "%s:%d: CHECK failed: rejects(\"%s\", \"%s\")\n", __FILE__,
                    cases[i].line, dict, cases[i].detail);
            check_failures++;
        }
    }
}
#define CHECK_REFUSALS(format, cases) check_refusals(format, cases, sizeof cases / sizeof *cases)

/* The dict of a header whose descr, fortran_order or shape is the case's text. */
#define WITH_DESCR "{'descr': %s, 'fortran_order': False, 'shape': ()}"
#define WITH_FORTRAN_ORDER "{'descr': '<f4', 'fortran_order': %s, 'shape': ()}"
#define WITH_SHAPE "{'descr': '<f4', 'fortran_order': False, 'shape': %s}"

static int accepts(const char *dict, fl_npy_header *h) {
    char buf[4096];
    size_t len = make_npy(dict, buf, sizeof buf);
    int rc = parse(buf, len, h);
    if (rc != FL_OK)
        fprintf(stderr, "  %s: %s\n", dict, fl_error_detail());
    return rc == FL_OK && h->header_len == len;
}

static int shape_is(const fl_npy_header *h, int ndim, int64_t d0, int64_t d1) {
    return h->ndim == ndim && (ndim < 1 || h->shape[0] == d0) && (ndim < 2 || h->shape[1] == d1);
}

static void test_numpy_files_parse(void) {
    fl_npy_header h[SAMPLE_COUNT];
    for (int i = 0; i < SAMPLE_COUNT; i++) {
        CHECK(parse(samples[i].bytes, samples[i].len, &h[i]) == FL_OK);
        CHECK(h[i].header_len % 64 == 0 && h[i].header_len + h[i].data_len == samples[i].len);
    }
    CHECK(!strcmp(h[0].descr, "<f4") && h[0].kind == 'f' && h[0].itemsize == 4);
    CHECK(h[0].byteorder == '<' && !h[0].fortran_order && shape_is(&h[0], 2, 2, 3));
    CHECK(h[0].major == 1 && h[0].minor == 0 && h[0].data_len == 24);
    CHECK(!strcmp(h[1].descr, "<i8") && shape_is(&h[1], 0, 0, 0) && h[1].data_len == 8);
    CHECK(!strcmp(h[2].descr, "<i2") && h[2].fortran_order && shape_is(&h[2], 2, 2, 3));
    CHECK(!strcmp(h[3].descr, ">f8") && h[3].byteorder == '>' && h[3].major == 2);
    CHECK(shape_is(&h[3], 1, 3, 0) && h[3].data_len == 24);
    CHECK(!strcmp(h[4].descr, "<U3") && h[4].kind == 'U' && h[4].itemsize == 12);
    CHECK(h[4].data_len == 24);
    CHECK(h[5].major == 3 && h[5].itemsize == 4 && shape_is(&h[5], 1, 1, 0));
    CHECK(!strcmp(h[6].descr, "|u1") && h[6].byteorder == '|' && shape_is(&h[6], 2, 0, 3));
    CHECK(h[6].data_len == 0);
    CHECK(!strcmp(h[7].descr, "<M8[ns]") && h[7].kind == 'M' && h[7].itemsize == 8);
}

static void test_map_open_maps_the_data(void) {
    fl_npy_map m;
    const char *path = write_file("f4.npy", F4_2X3, sizeof F4_2X3 - 1);
    CHECK(fl_npy_map_open(path, &m) == FL_OK);
    CHECK(m.map_len == sizeof F4_2X3 - 1 && m.data == (char *)m.base + m.header.header_len);
    float f[6];
    memcpy(f, m.data, sizeof f);
    for (int i = 0; i < 6; i++)
        CHECK(f[i] == (float)i);
    fl_npy_map_close(&m);
    CHECK(m.base == NULL && m.data == NULL);
    fl_npy_map_close(&m); /* twice is fine */
    path = write_file("i2f.npy", I2_FORTRAN, sizeof I2_FORTRAN - 1);
    CHECK(fl_npy_map_open(path, &m) == FL_OK && m.header.fortran_order);
    int16_t column_major[6], want[6] = {0, 3, 1, 4, 2, 5};
    memcpy(column_major, m.data, sizeof column_major);
    CHECK(memcmp(column_major, want, sizeof want) == 0);
    fl_npy_map_close(&m);
}

static void test_map_open_of_an_empty_array_maps_nothing(void) {
    fl_npy_map m;
    const char *path = write_file("empty.npy", U1_EMPTY, sizeof U1_EMPTY - 1);
    CHECK(fl_npy_map_open(path, &m) == FL_OK);
    CHECK(m.base == NULL && m.data == NULL && m.map_len == 0 && m.header.ndim == 2);
    fl_npy_map_close(&m);
    fl_npy_map zeroed = {0};
    fl_npy_map_close(&zeroed);
}

static void test_read_file_reads_the_data(void) {
    const char *path = write_file("f8.npy", F8_BIG_V2, sizeof F8_BIG_V2 - 1);
    unsigned char data[64];
    size_t n = 0;
    CHECK(fl_npy_read_file(path, NULL, data, sizeof data, &n) == FL_OK && n == 24);
    CHECK(data[8] == 0x3f && data[9] == 0xf0 && data[16] == 0x40); /* 1.0 and 2.0, big-endian */
    fl_npy_header expect;
    CHECK(fl_npy_parse_header(F8_BIG_V2, sizeof F8_BIG_V2 - 1, &expect) == FL_OK);
    CHECK(fl_npy_read_file(path, &expect, data, 24, &n) == FL_OK && n == 24);
    path = write_file("empty2.npy", U1_EMPTY, sizeof U1_EMPTY - 1);
    CHECK(fl_npy_read_file(path, NULL, NULL, 0, &n) == FL_OK && n == 0);
}

static void test_read_file_normalizes_the_expected_descr(void) {
    const char *path = write_file("f4n.npy", F4_2X3, sizeof F4_2X3 - 1);
    fl_npy_header expect = {.descr = "=f4", .ndim = 2, .shape = {2, 3}};
    float f[6];
    size_t n;
    int little = *(const unsigned char *)&(uint16_t){1} == 1;
    CHECK(fl_npy_read_file(path, &expect, f, sizeof f, &n) == (little ? FL_OK : FL_EINVAL));
    CHECK(!little || f[5] == 5.0f);
}

static void test_header_variants_are_accepted(void) {
    fl_npy_header h;
    CHECK(accepts("{'shape': (2, 3,), 'descr': '<f4', 'fortran_order': True}", &h));
    CHECK(shape_is(&h, 2, 2, 3) && h.fortran_order && h.data_len == 24);
    CHECK(accepts(" {\n\t'descr' :'|b1' ,'fortran_order':False,'shape':(5,)}  \n", &h));
    CHECK(h.kind == 'b' && shape_is(&h, 1, 5, 0));
    CHECK(accepts("{\"descr\": \"S5\", \"fortran_order\": False, \"shape\": ( )}", &h));
    CHECK(!strcmp(h.descr, "|S5") && h.itemsize == 5 && h.ndim == 0 && h.data_len == 5);
    CHECK(accepts("{'descr': '|V16', 'fortran_order': False, 'shape': (0, 7), }", &h));
    CHECK(h.kind == 'V' && h.itemsize == 16 && h.data_len == 0);
    CHECK(accepts("{'descr': '<c16', 'fortran_order': False, 'shape': (1,), }", &h));
    CHECK(accepts("{'descr': '<m8[10us]', 'fortran_order': False, 'shape': (1,), }", &h));
    CHECK(!strcmp(h.descr, "<m8[10us]") && h.kind == 'm');
    CHECK(accepts("{'descr': '>M8', 'fortran_order': False, 'shape': (1,), }", &h)); /* generic */
    CHECK(!strcmp(h.descr, ">M8") && h.itemsize == 8);
}

static void test_python2_long_dimensions_are_accepted_before_version_3(void) {
    fl_npy_header h;
    char buf[256];
    CHECK(accepts("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", &h));
    CHECK(shape_is(&h, 2, 2, 3) && h.data_len == 24);
    /* Python 2 never wrote version 3.0, and 2L is not Python 3 */
    size_t len = make_npy_version("{'descr': '<f4', 'fortran_order': False, 'shape': (2L,), }", 3,
                                  buf, sizeof buf);
    CHECK(parse(buf, len, &h) == FL_EINVAL && detail_has("expected ',' or ')' in shape"));
    CHECK(rejects("{'descr': '<f4', 'fortran_order': False, 'shape': (2l,), }", "expected ','"));
}

static void test_descr_byte_order_is_normalized(void) {
    fl_npy_header h;
    char native[8];
    snprintf(native, sizeof native, "%cf4", *(const unsigned char *)&(uint16_t){1} ? '<' : '>');
    CHECK(accepts("{'descr': '=f4', 'fortran_order': False, 'shape': (), }", &h));
    CHECK(!strcmp(h.descr, native) && h.byteorder == native[0]);
    CHECK(accepts("{'descr': 'f4', 'fortran_order': False, 'shape': (), }", &h));
    CHECK(!strcmp(h.descr, native));
    CHECK(accepts("{'descr': '<u1', 'fortran_order': False, 'shape': (), }", &h));
    CHECK(!strcmp(h.descr, "|u1") && h.byteorder == '|');
    CHECK(accepts("{'descr': '>S3', 'fortran_order': False, 'shape': (), }", &h));
    CHECK(!strcmp(h.descr, "|S3"));
    CHECK(accepts("{'descr': '>U2', 'fortran_order': False, 'shape': (), }", &h));
    CHECK(!strcmp(h.descr, ">U2") && h.itemsize == 8);
}

static void test_bad_magic_and_versions_are_rejected(void) {
    fl_npy_header h;
    char file[sizeof F4_2X3];
    memcpy(file, F4_2X3, sizeof file);
    file[1] = 'X';
    CHECK(parse(file, 4, &h) == FL_EINVAL && detail_has("bad magic: not a .npy file"));
    CHECK(parse("PK\003\004", 4, &h) == FL_EINVAL && detail_has("bad magic"));
    memcpy(file, F4_2X3, sizeof file);
    file[6] = 4;
    CHECK(parse(file, sizeof file - 1, &h) == FL_EINVAL);
    CHECK(detail_has("unsupported format version 4.0"));
    file[6] = 1;
    file[7] = 1;
    CHECK(parse(file, 8, &h) == FL_EINVAL && detail_has("unsupported format version 1.1"));
    file[6] = 0;
    file[7] = 0;
    CHECK(parse(file, 8, &h) == FL_EINVAL && detail_has("unsupported format version 0.0"));
}

static void test_oversized_header_is_rejected(void) {
    fl_npy_header h;
    const unsigned char v2[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0, 0, 0x20, 0};
    CHECK(parse(v2, sizeof v2, &h) == FL_EINVAL); /* 2 MiB: refused before reading it */
    CHECK(detail_has("header length 2097152 is over the limit of 1048576 bytes"));
}

static void test_malformed_dicts_are_rejected(void) {
    static const refusal cases[] = {
        REFUSAL("['descr', 'fortran_order', 'shape']", "header is not a dict"),
        REFUSAL("", "header is not a dict"),
        REFUSAL("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
                "unexpected key 'x'"),
        REFUSAL("{'descr': '<f4', 'fortran_order': False}", "no 'shape' key"),
        REFUSAL("{'shape': (), 'fortran_order': False}", "no 'descr' key"),
        REFUSAL("{}", "no 'descr' key"),
        REFUSAL("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
                "key 'descr' twice"),
        REFUSAL("{'descr': '<f4' 'fortran_order': False, 'shape': ()}", "expected ',' or '}'"),
        REFUSAL("{'descr' '<f4', 'fortran_order': False, 'shape': ()}", "expected ':'"),
        REFUSAL("{'descr': '<f4', 'fortran_order': False, 'shape': ()} x",
                "unexpected text after the dict"),
        REFUSAL("{'descr': '<f4', 'fortran_order': False, 'shape': ()", "end of the header"),
        REFUSAL("{'descr': '<f4', 'fortran_order': False, 'shape': ()} # x", "unexpected text"),
        REFUSAL("{'descr': '<f4, 'fortran_order': False, 'shape': ()}",
                "descr '<f4, ': unexpected text after the item size"),
        REFUSAL("{'descr': '<f4\n', 'fortran_order': False, 'shape': ()}", "unterminated string"),
        REFUSAL("{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}", "escapes"),
        REFUSAL("{descr: '<f4', 'fortran_order': False, 'shape': ()}", "expected a quoted key"),
        REFUSAL("{b'descr': '<f4', 'fortran_order': False, 'shape': ()}", "quoted key"),
    };
    CHECK_REFUSALS("%s", cases);
}

/* As Python's tokenizer does (NumPy reads the header with ast.literal_eval). */
static void test_indented_lines_around_the_dict_are_rejected(void) {
    fl_npy_header h;
    CHECK(accepts(" \n{'descr': '<f4', 'fortran_order': False, 'shape': ()}  \n\n", &h));
    CHECK(accepts("{'descr': '<f4', 'fortran_order': False, 'shape': ()}\t ", &h));
    CHECK(rejects("\n {'descr': '<f4', 'fortran_order': False, 'shape': ()}",
                  "the dict is on an indented line"));
    CHECK(rejects("{'descr': '<f4', 'fortran_order': False, 'shape': ()}\n ",
                  "an indented line follows the dict"));
    CHECK(rejects("{'descr': '<f4', 'fortran_order': False, 'shape': ()} \r\t", "indented line"));
}

static void test_embedded_nul_is_rejected(void) {
    char buf[256];
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (), }";
    size_t len = make_npy(dict, buf, sizeof buf);
    buf[10 + 11] = '\0'; /* the byte order of '<f4' */
    fl_npy_header h;
    CHECK(parse(buf, len, &h) == FL_EINVAL && detail_has("descr '?f4'"));
    buf[10 + 11] = '<';
    buf[len - 1] = '\0'; /* the closing brace */
    CHECK(parse(buf, len, &h) == FL_EINVAL && detail_has("found '?'"));
}

static void test_unsupported_descrs_are_rejected(void) {
    static const refusal cases[] = {
        REFUSAL("[('a', '<f4')]", "structured dtypes are not supported"),
        REFUSAL("'|O'", "object arrays"),
        REFUSAL("'<O8'", "object arrays"),
        REFUSAL("'<x4'", "descr '<x4': unsupported dtype kind 'x'"),
        REFUSAL("'<'", "kind ''"),
        REFUSAL("''", "descr '' is empty"),
        REFUSAL("3", "descr is not a string"),
        REFUSAL("'<f'", "'<f': missing or malformed item size"),
        REFUSAL("'<f04'", "malformed item"),
        REFUSAL("'<f4x'", "unexpected text after the item size"),
        REFUSAL("'<f0'", "item size 0"),
        REFUSAL("'|V0'", "item size 0"),
        REFUSAL("'<U0'", "item size 0"),
        REFUSAL("'|S0'", "item size 0"),
        REFUSAL("'<i3'", "item size 3 is not valid for kind 'i'"),
        REFUSAL("'|b2'", "not valid"),
        REFUSAL("'<f12'", "not valid"),
        REFUSAL("'<c24'", "not valid"),
        REFUSAL("'|S99999999999'", "malformed item size"),
        REFUSAL("'<M8[xs]'", "unexpected text after the item size"),
        REFUSAL("'<M8[0ns]'", "'<M8[0ns]'"),
        REFUSAL("'<M8[ns'", "'<M8[ns'"),
        REFUSAL("'<M8[]'", "'<M8[]'"),
        REFUSAL("'<f8[ns]'", "unexpected"),
        REFUSAL("'<V111111111111111111111111111111'", "too long"),
    };
    CHECK_REFUSALS(WITH_DESCR, cases);
}

static void test_bad_fortran_order_is_rejected(void) {
    static const refusal cases[] = {
        REFUSAL("1", "fortran_order is not True or False"),
        REFUSAL("Truth", "not True or False"),
        REFUSAL("'False'", "not True"),
    };
    CHECK_REFUSALS(WITH_FORTRAN_ORDER, cases);
}

static void test_bad_shapes_are_rejected(void) {
    static const refusal cases[] = {
        REFUSAL("(2, -1)", "shape (2, -1) has a negative dimension"),
        REFUSAL("(-3,)", "shape (-3,) has a negative dimension"),
        REFUSAL("(5)", "shape (5) is not a tuple: it needs a trailing comma"),
        REFUSAL("[5]", "shape is not a tuple"),
        REFUSAL("(,)", "integer dimension"),
        REFUSAL("(2 3)", "expected ','"),
        REFUSAL("(2,,3)", "integer dim"),
        REFUSAL("(2.5,)", "expected ','"),
        REFUSAL("(99999999999999999999,)", "dimension is too large"),
        REFUSAL("(3037000500, 3037000500)",
                "shape (3037000500, 3037000500) with item size 4 is too large"),
        REFUSAL("(4611686018427387904,)", "too large"),
        /* 2**63 bytes: fits in size_t, but no array NumPy makes is over PTRDIFF_MAX bytes */
        REFUSAL("(2305843009213693952,)", "too large: over 9223372036854775807 bytes"),
    };
    CHECK_REFUSALS(WITH_SHAPE, cases);
    fl_npy_header h;
    CHECK(accepts("{'descr': '|u1', 'fortran_order': False, 'shape': (9223372036854775807,)}", &h));
    CHECK(h.data_len == (size_t)PTRDIFF_MAX);
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int d = 0; d <= FL_NPY_MAX_DIMS; d++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "1, ");
    snprintf(dict + n, sizeof dict - (size_t)n, ")}");
    CHECK(rejects(dict, "shape has more than 32 dimensions"));
}

static void test_zero_dimension_does_not_hide_an_overflow(void) {
    CHECK(rejects("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4611686018427387904)}",
                  "too large"));
    fl_npy_header h;
    CHECK(accepts("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 1099511627776)}", &h));
    CHECK(h.data_len == 0);
}

static void test_short_buffer_is_eagain(void) {
    fl_npy_header h;
    for (int i = 0; i < SAMPLE_COUNT; i++) {
        size_t header_len = 0;
        CHECK(fl_npy_parse_header(samples[i].bytes, samples[i].len, &h) == FL_OK);
        header_len = h.header_len;
        for (size_t len = 0; len < header_len; len++)
            CHECK(parse(samples[i].bytes, len, &h) == FL_EAGAIN);
        CHECK(parse(samples[i].bytes, header_len, &h) == FL_OK);
    }
    CHECK(parse(F4_2X3, 50, &h) == FL_EAGAIN && detail_has("needs 128 bytes, there are 50"));
    CHECK(parse(F4_2X3, 3, &h) == FL_EAGAIN && detail_has("needs at least 10 bytes"));
}

/* A version 2.0 file whose header is padded to header_len bytes, followed by 3 int32. */
static size_t long_header_file(char *out, size_t header_len) {
    const char *dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
    size_t dict_len = header_len - 12;
    memcpy(out, "\223NUMPY\002\000", 8);
    for (int b = 0; b < 4; b++)
        out[8 + b] = (char)(dict_len >> (8 * b));
    memset(out + 12, ' ', dict_len);
    memcpy(out + 12, dict, strlen(dict));
    out[header_len - 1] = '\n';
    int32_t values[3] = {7, 8, 9};
    memcpy(out + header_len, values, sizeof values);
    return header_len + sizeof values;
}

static void test_truncated_files_are_rejected(void) {
    fl_npy_map m;
    unsigned char buf[64];
    size_t n;
    const char *path = write_file("short.npy", F4_2X3, sizeof F4_2X3 - 1 - 14); /* 10 of 24 */
    CHECK(fl_npy_map_open(path, &m) == FL_EINVAL && m.base == NULL);
    CHECK(detail_has(path) && detail_has("file is truncated: 10 bytes of data, expected 24"));
    CHECK(fl_npy_read_file(path, NULL, buf, sizeof buf, &n) == FL_EINVAL);
    CHECK(detail_has(path) && detail_has("file is truncated: 10 bytes of data, expected 24"));
    path = write_file("no_header.npy", F4_2X3, 100);
    CHECK(fl_npy_map_open(path, &m) == FL_EINVAL);
    CHECK(detail_has(path) && detail_has("file is truncated: header is incomplete"));
    CHECK(fl_npy_read_file(path, NULL, buf, sizeof buf, &n) == FL_EINVAL);
    CHECK(detail_has("needs 128 bytes, there are 100"));
    path = write_file("empty_file.npy", "", 0);
    CHECK(fl_npy_map_open(path, &m) == FL_EINVAL && detail_has("truncated"));
}

static void test_long_truncated_headers_are_rejected(void) {
    char *file = malloc(100000 + 64);
    fl_npy_map m;
    int32_t values[3];
    size_t n;
    long_header_file(file, 5000);
    const char *path = write_file("long_short1.npy", file, 4500); /* cut in the second read */
    CHECK(fl_npy_read_file(path, NULL, values, sizeof values, &n) == FL_EINVAL);
    CHECK(detail_has(path) && detail_has("truncated: header is incomplete: it needs 5000 bytes, "
                                         "there are 4500"));
    long_header_file(file, 100000);
    path = write_file("long_short2.npy", file, 80000);
    CHECK(fl_npy_map_open(path, &m) == FL_EINVAL && detail_has("needs 100000 bytes"));
    free(file);
}

static void test_bad_files_are_rejected_with_their_path(void) {
    fl_npy_map m;
    char buf[256];
    size_t n,
        len = make_npy("{'descr': '|O', 'fortran_order': False, 'shape': ()}", buf, sizeof buf);
    const char *path = write_file("object.npy", buf, len);
    CHECK(fl_npy_map_open(path, &m) == FL_EINVAL && detail_has(path) && detail_has("object"));
    CHECK(fl_npy_read_file(path, NULL, buf, sizeof buf, &n) == FL_EINVAL);
    CHECK(detail_has(path) && detail_has("object"));
    CHECK(fl_npy_map_open(tmpdir, &m) == FL_EINVAL && detail_has("not a regular file"));
}

static void test_missing_file_is_esys(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/no-such-file.npy", tmpdir);
    fl_npy_map m;
    CHECK(fl_npy_map_open(path, &m) == FL_ESYS && m.base == NULL);
    CHECK(detail_has(path) && detail_has("No such file") && fl_error_errno() == ENOENT);
    unsigned char buf[8];
    size_t n;
    CHECK(fl_npy_read_file(path, NULL, buf, sizeof buf, &n) == FL_ESYS && detail_has(path));
    CHECK(fl_error_errno() == ENOENT);
    fl_error_set(FL_EINVAL, "a later error without a system call");
    CHECK(fl_error_errno() == 0);
}

static void test_read_file_rejects_a_mismatch(void) {
    const char *path = write_file("mismatch.npy", F4_2X3, sizeof F4_2X3 - 1);
    float f[6];
    size_t n;
    fl_npy_header expect = {.descr = "<f4", .ndim = 2, .shape = {3, 2}};
    CHECK(fl_npy_read_file(path, &expect, f, sizeof f, &n) == FL_EINVAL);
    CHECK(detail_has(path) && detail_has("expected <f4 (3, 2) C order"));
    CHECK(detail_has("the file has <f4 (2, 3) C order"));
    expect = (fl_npy_header){.descr = "<i4", .ndim = 2, .shape = {2, 3}};
    CHECK(fl_npy_read_file(path, &expect, f, sizeof f, &n) == FL_EINVAL);
    CHECK(detail_has("expected <i4 (2, 3)"));
    expect = (fl_npy_header){.descr = "<f4", .fortran_order = 1, .ndim = 2, .shape = {2, 3}};
    CHECK(fl_npy_read_file(path, &expect, f, sizeof f, &n) == FL_EINVAL);
    CHECK(detail_has("Fortran order, the file has <f4 (2, 3) C order"));
    expect = (fl_npy_header){.descr = "<f4", .ndim = 1, .shape = {6}};
    CHECK(fl_npy_read_file(path, &expect, f, sizeof f, &n) == FL_EINVAL && detail_has("(6,)"));
    expect = (fl_npy_header){.descr = "<f4", .ndim = 99};
    CHECK(fl_npy_read_file(path, &expect, f, sizeof f, &n) == FL_EINVAL);
}

static void test_read_file_rejects_a_small_buffer(void) {
    const char *path = write_file("cap.npy", F4_2X3, sizeof F4_2X3 - 1);
    float f[6] = {0};
    size_t n = 99;
    CHECK(fl_npy_read_file(path, NULL, f, sizeof f - 1, &n) == FL_EINVAL && n == 99);
    CHECK(detail_has(path) && detail_has("24 bytes do not fit in the 23-byte buffer"));
    CHECK(f[0] == 0.0f && f[5] == 0.0f); /* nothing written */
}

static void test_long_headers_are_read_in_two_steps(void) {
    size_t sizes[] = {5000, 100000}; /* past the first read of read_file, then of map_open */
    char *file = malloc(100000 + 64);
    for (int i = 0; i < 2; i++) {
        size_t len = long_header_file(file, sizes[i]);
        const char *path = write_file(i ? "long2.npy" : "long1.npy", file, len);
        fl_npy_map m;
        CHECK(fl_npy_map_open(path, &m) == FL_OK && m.header.header_len == sizes[i]);
        CHECK(m.data != NULL && ((const int32_t *)m.data)[2] == 9);
        fl_npy_header header = m.header;
        fl_npy_map_close(&m);
        int32_t values[3];
        size_t n;
        CHECK(fl_npy_read_file(path, &header, values, sizeof values, &n) == FL_OK && n == 12);
        CHECK(values[0] == 7 && values[2] == 9);
    }
    free(file);
}

typedef struct reader {
    const char *path;
    int ok;
} reader;

static void *read_many(void *arg) {
    reader *r = arg;
    fl_npy_header expect = {.descr = "<f4", .ndim = 2, .shape = {2, 3}};
    r->ok = 1;
    for (int i = 0; i < 200; i++) {
        float f[6] = {0};
        size_t n;
        r->ok &= fl_npy_read_file(r->path, &expect, f, sizeof f, &n) == FL_OK && f[5] == 5.0f;
        r->ok &= fl_npy_read_file(r->path, &expect, f, 4, &n) == FL_EINVAL &&
                 strstr(fl_error_detail(), "do not fit") != NULL;
        fl_npy_map m;
        r->ok &= fl_npy_map_open(r->path, &m) == FL_OK && ((const float *)m.data)[4] == 4.0f;
        fl_npy_map_close(&m);
    }
    return NULL;
}

static void test_concurrent_readers_do_not_interfere(void) {
    const char *path = write_file("shared.npy", F4_2X3, sizeof F4_2X3 - 1);
    pthread_t threads[4];
    reader args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (reader){path, 0};
        pthread_create(&threads[i], NULL, read_many, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(threads[i], NULL);
        CHECK(args[i].ok);
    }
}

int main(void) {
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    RUN(test_numpy_files_parse);
    RUN(test_map_open_maps_the_data);
    RUN(test_map_open_of_an_empty_array_maps_nothing);
    RUN(test_read_file_reads_the_data);
    RUN(test_read_file_normalizes_the_expected_descr);
    RUN(test_header_variants_are_accepted);
    RUN(test_python2_long_dimensions_are_accepted_before_version_3);
    RUN(test_descr_byte_order_is_normalized);
    RUN(test_bad_magic_and_versions_are_rejected);
    RUN(test_oversized_header_is_rejected);
    RUN(test_malformed_dicts_are_rejected);
    RUN(test_indented_lines_around_the_dict_are_rejected);
    RUN(test_embedded_nul_is_rejected);
    RUN(test_unsupported_descrs_are_rejected);
    RUN(test_bad_fortran_order_is_rejected);
    RUN(test_bad_shapes_are_rejected);
    RUN(test_zero_dimension_does_not_hide_an_overflow);
    RUN(test_short_buffer_is_eagain);
    RUN(test_truncated_files_are_rejected);
    RUN(test_long_truncated_headers_are_rejected);
    RUN(test_bad_files_are_rejected_with_their_path);
    RUN(test_missing_file_is_esys);
    RUN(test_read_file_rejects_a_mismatch);
    RUN(test_read_file_rejects_a_small_buffer);
    RUN(test_long_headers_are_read_in_two_steps);
    RUN(test_concurrent_readers_do_not_interfere);
    char cleanup[300];
    snprintf(cleanup, sizeof cleanup, "rm -rf %s", tmpdir);
    return system(cleanup) != 0 || check_failures != 0;
}
