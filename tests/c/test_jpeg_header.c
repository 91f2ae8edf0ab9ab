/* test_jpeg_header.c - the JPEG header parser and nvJPEG routing: headers built byte by byte
 * here (SOI, APP0 JFIF, Adobe APP14, DQT, SOFn, DHT, SOS) parse into what they say and route to
 * the engine, the CUDA decoder or the CPU as nvJPEG's rules want; every cut of a valid header
 * and every malformed segment is refused with FL_EDECODE and a detail naming the byte. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "check.h"
#include "data/fl_jpeg_header.h"

/* A header under construction, with where its markers went. */
typedef struct jpeg {
    uint8_t b[1024];
    size_t n;
    size_t sof_at, sos_at, scan_end; /* the SOF and SOS markers; the end of the scan header */
} jpeg;

/* What build() writes: SOI, [APP0 JFIF], [APP14], DQT, SOFn, [APP14 after], DHT, SOS, a few
 * bytes of entropy-coded data, EOI. */
typedef struct spec {
    int sof; /* the marker's code byte: 0xC0 baseline, 0xC2 progressive... */
    int precision;
    unsigned width, height;
    int components;
    const char *sampling; /* "22 11 11": h and v of each component */
    const char *ids;      /* component ids; NULL: 1, 2, 3, 4 */
    int jfif;
    int adobe;       /* -1: no APP14; else its transform byte */
    int adobe_after; /* the APP14 comes after the frame header */
} spec;

#define BASELINE(sampling_) {0xC0, 8, 32, 16, 3, sampling_, NULL, 1, -1, 0}

static void put(jpeg *j, const void *p, size_t n) {
    memcpy(j->b + j->n, p, n);
    j->n += n;
}

static void put1(jpeg *j, int v) { j->b[j->n++] = (uint8_t)v; }

static void put2(jpeg *j, unsigned v) {
    put1(j, (int)(v >> 8));
    put1(j, (int)(v & 0xFF));
}

static void segment(jpeg *j, int code, const void *body, size_t n) {
    put1(j, 0xFF);
    put1(j, code);
    put2(j, (unsigned)n + 2);
    put(j, body, n);
}

static void app0_jfif(jpeg *j) {
    static const uint8_t body[14] = {'J', 'F', 'I', 'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0};
    segment(j, 0xE0, body, sizeof body);
}

static void app14_adobe(jpeg *j, int transform) {
    const uint8_t body[12] = {'A', 'd', 'o', 'b', 'e', 0, 100, 0, 0, 0, 0, (uint8_t)transform};
    segment(j, 0xEE, body, sizeof body);
}

static void dqt(jpeg *j) {
    uint8_t body[65] = {0x00};
    for (int i = 1; i < 65; i++)
        body[i] = 1;
    segment(j, 0xDB, body, sizeof body);
}

static void dht(jpeg *j) { /* one DC table: one code of length 1 for the value 0 */
    uint8_t body[18] = {0x00, 1};
    segment(j, 0xC4, body, sizeof body);
}

static void sof(jpeg *j, const spec *s) {
    uint8_t body[6 + 3 * 4] = {(uint8_t)s->precision, (uint8_t)(s->height >> 8),
                               (uint8_t)s->height,    (uint8_t)(s->width >> 8),
                               (uint8_t)s->width,     (uint8_t)s->components};
    for (int i = 0; i < s->components; i++) {
        const char *hv = s->sampling + 3 * i;
        body[6 + 3 * i] = s->ids != NULL ? (uint8_t)s->ids[i] : (uint8_t)(i + 1);
        body[7 + 3 * i] = (uint8_t)((hv[0] - '0') << 4 | (hv[1] - '0'));
        body[8 + 3 * i] = i > 0;
    }
    j->sof_at = j->n;
    segment(j, s->sof, body, 6 + 3 * (size_t)s->components);
}

static void sos(jpeg *j, const spec *s) {
    uint8_t body[4 + 2 * 4] = {(uint8_t)s->components};
    for (int i = 0; i < s->components; i++)
        body[1 + 2 * i] = s->ids != NULL ? (uint8_t)s->ids[i] : (uint8_t)(i + 1);
    body[2 + 2 * s->components] = 63;
    j->sos_at = j->n;
    segment(j, 0xDA, body, 4 + 2 * (size_t)s->components);
    j->scan_end = j->n;
}

static void build(jpeg *j, const spec *s) {
    static const uint8_t scan_data[] = {0x12, 0x34, 0xFF, 0x00, 0x56, 0xFF, 0xD9};
    memset(j, 0, sizeof *j);
    put2(j, 0xFFD8);
    if (s->jfif)
        app0_jfif(j);
    if (s->adobe >= 0 && !s->adobe_after)
        app14_adobe(j, s->adobe);
    dqt(j);
    sof(j, s);
    if (s->adobe >= 0 && s->adobe_after)
        app14_adobe(j, s->adobe);
    dht(j);
    sos(j, s);
    put(j, scan_data, sizeof scan_data);
}

/* Parses from an exact-size heap copy, so ASan sees any read past len. */
static int parse(const void *data, size_t len, fl_jpeg_header *h) {
    void *copy = malloc(len ? len : 1);
    if (len > 0)
        memcpy(copy, data, len);
    int rc = fl_jpeg_header_parse(len ? copy : NULL, len, h);
    free(copy);
    return rc;
}

static int detail_has(const char *needle) {
    if (strstr(fl_error_detail(), needle) != NULL)
        return 1;
    fprintf(stderr, "  detail \"%s\" lacks \"%s\"\n", fl_error_detail(), needle);
    return 0;
}

/* 1 when the bytes are refused with FL_EDECODE, a detail containing needle, *out untouched. */
static int refused(const void *data, size_t len, const char *needle) {
    fl_jpeg_header h, before;
    memset(&h, 0xA5, sizeof h);
    before = h;
    int rc = parse(data, len, &h);
    if (rc != FL_EDECODE) {
        fprintf(stderr, "  %s for \"%s\"\n", fl_err_name(rc), needle);
        return 0;
    }
    return detail_has(needle) && memcmp(&h, &before, sizeof h) == 0;
}

static int accepted(const jpeg *j, fl_jpeg_header *h) {
    int rc = parse(j->b, j->n, h);
    if (rc != FL_OK)
        fprintf(stderr, "  refused: %s\n", fl_error_detail());
    return rc == FL_OK;
}

/* The route of a header built from s, and whether its reason contains `why`. */
static int routes(const spec *s, fl_jpeg_route want, const char *why) {
    jpeg j;
    fl_jpeg_header h;
    const char *reason = NULL;
    build(&j, s);
    if (!accepted(&j, &h))
        return 0;
    fl_jpeg_route route = fl_jpeg_route_of(&h, &reason);
    if (route == want && strstr(reason, why) != NULL && (why[0] != '\0' || reason[0] == '\0'))
        return 1;
    fprintf(stderr, "  route %d (\"%s\"), wanted %d (\"%s\")\n", route, reason, want, why);
    return 0;
}

static void test_baseline_420_jfif_parses_and_routes_to_the_engine(void) {
    spec s = BASELINE("22 11 11");
    jpeg j;
    fl_jpeg_header h;
    build(&j, &s);
    CHECK(accepted(&j, &h));
    CHECK(h.width == 32 && h.height == 16 && h.components == 3 && h.precision == 8);
    CHECK(h.process == FL_JPEG_BASELINE && h.jfif == 1 && h.adobe_transform == -1);
    CHECK(h.h_sampling[0] == 2 && h.v_sampling[0] == 2);
    CHECK(h.h_sampling[1] == 1 && h.v_sampling[1] == 1 && h.h_sampling[2] == 1);
    CHECK(h.component_id[0] == 1 && h.component_id[1] == 2 && h.component_id[2] == 3);
    CHECK(h.frame_offset == 89 && h.frame_offset == j.sof_at); /* SOI 2, APP0 18, DQT 69 */
    CHECK(h.scan_offset == j.sos_at && j.b[h.scan_offset + 1] == 0xDA);
    const char *why = NULL;
    CHECK(fl_jpeg_route_of(&h, &why) == FL_JPEG_ROUTE_HARDWARE && why != NULL && why[0] == 0);
    CHECK(fl_jpeg_route_of(&h, NULL) == FL_JPEG_ROUTE_HARDWARE); /* why may be NULL */
    /* The parse stops at the scan header: the bytes after it are not needed. */
    CHECK(parse(j.b, j.scan_end, &h) == FL_OK && h.scan_offset == j.sos_at);
}

static void test_engine_takes_444_422_420_440_and_grayscale(void) {
    const char *engine[] = {"11 11 11", "21 11 11", "22 11 11", "12 11 11"};
    for (int i = 0; i < 4; i++) {
        spec s = BASELINE(engine[i]);
        CHECK(routes(&s, FL_JPEG_ROUTE_HARDWARE, ""));
    }
    spec gray = {0xC0, 8, 7, 5, 1, "11", NULL, 1, -1, 0};
    CHECK(routes(&gray, FL_JPEG_ROUTE_HARDWARE, ""));
    gray.sampling = "22"; /* one component: its sampling factors do not matter */
    CHECK(routes(&gray, FL_JPEG_ROUTE_HARDWARE, ""));
    gray.adobe = 0; /* nor does an Adobe transform */
    CHECK(routes(&gray, FL_JPEG_ROUTE_HARDWARE, ""));
}

static void test_cuda_decoder_takes_411_410_and_8_bit_extended(void) {
    spec s = BASELINE("41 11 11");
    CHECK(routes(&s, FL_JPEG_ROUTE_CUDA, "4:1:1"));
    s.sampling = "42 11 11";
    CHECK(routes(&s, FL_JPEG_ROUTE_CUDA, "4:1:0"));
    spec extended = BASELINE("22 11 11");
    extended.sof = 0xC1;
    CHECK(routes(&extended, FL_JPEG_ROUTE_CUDA, "extended sequential"));
    extended.components = 1;
    CHECK(routes(&extended, FL_JPEG_ROUTE_CUDA, "extended sequential"));
}

static void test_processes_other_than_huffman_sequential_go_to_the_cpu(void) {
    static const struct {
        int sof, precision;
        fl_jpeg_process process;
        const char *why;
    } cases[] = {
        {0xC2, 8, FL_JPEG_PROGRESSIVE, "progressive"},
        {0xC3, 16, FL_JPEG_LOSSLESS, "lossless"},
        {0xC3, 2, FL_JPEG_LOSSLESS, "lossless"},
        {0xC5, 8, FL_JPEG_HIERARCHICAL, "hierarchical"},
        {0xC6, 12, FL_JPEG_HIERARCHICAL, "hierarchical"},
        {0xC7, 8, FL_JPEG_HIERARCHICAL, "hierarchical"},
        {0xC9, 8, FL_JPEG_ARITHMETIC, "arithmetic"},
        {0xCA, 8, FL_JPEG_ARITHMETIC, "arithmetic"},
        {0xCB, 8, FL_JPEG_ARITHMETIC, "arithmetic"},
        {0xCD, 8, FL_JPEG_HIERARCHICAL, "hierarchical"},
        {0xCE, 8, FL_JPEG_HIERARCHICAL, "hierarchical"},
        {0xCF, 8, FL_JPEG_HIERARCHICAL, "hierarchical"},
        {0xC1, 12, FL_JPEG_EXTENDED, "more than 8 bits"},
        {0xC2, 12, FL_JPEG_PROGRESSIVE, "progressive"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        spec s = BASELINE("22 11 11");
        s.sof = cases[i].sof;
        s.precision = cases[i].precision;
        jpeg j;
        fl_jpeg_header h;
        build(&j, &s);
        CHECK(accepted(&j, &h) && h.process == cases[i].process);
        CHECK(h.precision == cases[i].precision);
        CHECK(routes(&s, FL_JPEG_ROUTE_CPU, cases[i].why));
    }
}

static void test_a_dhp_segment_makes_the_frame_hierarchical(void) {
    spec s = BASELINE("22 11 11");
    s.sof = 0xC1; /* the first frame of a hierarchical image is not differential */
    jpeg j, k;
    build(&j, &s);
    /* k: the same bytes with a DHP segment (a frame header's layout) right after SOI */
    memset(&k, 0, sizeof k);
    put2(&k, 0xFFD8);
    const uint8_t dhp[] = {8, 0, 16, 0, 32, 1, 1, 0x11, 0};
    segment(&k, 0xDE, dhp, sizeof dhp);
    put(&k, j.b + 2, j.n - 2);
    fl_jpeg_header h;
    CHECK(accepted(&k, &h) && h.process == FL_JPEG_HIERARCHICAL);
    CHECK(h.frame_offset == j.sof_at + sizeof dhp + 4);
    const char *why;
    CHECK(fl_jpeg_route_of(&h, &why) == FL_JPEG_ROUTE_CPU && strstr(why, "hierarchical"));
}

static void test_2_and_4_components_and_12_bit_go_to_the_cpu(void) {
    spec two = {0xC0, 8, 9, 9, 2, "11 11", NULL, 0, -1, 0};
    CHECK(routes(&two, FL_JPEG_ROUTE_CPU, "2 components"));
    spec cmyk = {0xC0, 8, 9, 9, 4, "11 11 11 11", NULL, 0, 0, 0};
    CHECK(routes(&cmyk, FL_JPEG_ROUTE_CPU, "4 components (CMYK)"));
    spec ycck = {0xC0, 8, 9, 9, 4, "22 11 11 22", NULL, 0, 2, 0};
    CHECK(routes(&ycck, FL_JPEG_ROUTE_CPU, "4 components (YCCK)"));
    spec twelve = BASELINE("22 11 11");
    twelve.sof = 0xC1;
    twelve.precision = 12;
    CHECK(routes(&twelve, FL_JPEG_ROUTE_CPU, "more than 8 bits"));
}

/* libjpeg's colour-space rules for 3 components: JFIF means YCbCr; else Adobe's transform
 * decides; else the component ids 'R','G','B' mean RGB. RGB must not go to nvJPEG. */
static void test_rgb_without_colour_transform_goes_to_the_cpu(void) {
    spec s = BASELINE("11 11 11");
    s.jfif = 0;
    s.adobe = 0;
    CHECK(routes(&s, FL_JPEG_ROUTE_CPU, "Adobe transform 0"));
    s.adobe_after = 1; /* an APP14 between the frame header and the scan counts too */
    CHECK(routes(&s, FL_JPEG_ROUTE_CPU, "Adobe transform 0"));
    s.adobe = 1;
    CHECK(routes(&s, FL_JPEG_ROUTE_HARDWARE, ""));
    s.adobe = 7; /* unknown transform: libjpeg assumes YCbCr */
    CHECK(routes(&s, FL_JPEG_ROUTE_HARDWARE, ""));
    s.adobe = 0;
    s.jfif = 1; /* JFIF wins over Adobe in libjpeg */
    CHECK(routes(&s, FL_JPEG_ROUTE_HARDWARE, ""));
    jpeg j;
    fl_jpeg_header h;
    build(&j, &s);
    CHECK(accepted(&j, &h) && h.adobe_transform == 0 && h.jfif == 1);
    s.jfif = 0;
    s.adobe = -1; /* neither JFIF nor Adobe, ids 1, 2, 3: YCbCr */
    CHECK(routes(&s, FL_JPEG_ROUTE_HARDWARE, ""));
    spec rgb = BASELINE("11 11 11");
    rgb.ids = "RGB";
    rgb.jfif = 0;
    CHECK(routes(&rgb, FL_JPEG_ROUTE_CPU, "component ids 'R', 'G', 'B'"));
    rgb.adobe = 1; /* an Adobe segment overrides the ids */
    CHECK(routes(&rgb, FL_JPEG_ROUTE_HARDWARE, ""));
    rgb.adobe = -1;
    rgb.jfif = 1;
    CHECK(routes(&rgb, FL_JPEG_ROUTE_HARDWARE, ""));
}

static void test_sampling_outside_nvjpegs_list_goes_to_the_cpu(void) {
    const char *other[] = {"31 11 11", "14 11 11", "44 11 11", "22 21 11",
                           "22 22 22", "11 22 22", "24 11 11", "33 11 11"};
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
        spec s = BASELINE(other[i]);
        CHECK(routes(&s, FL_JPEG_ROUTE_CPU, "chroma sampling"));
    }
}

/* Fill bytes before a marker, RST0-7 and TEM between segments, and the segments libjpeg
 * skips (COM, DAC, DNL, DRI, APPn) all pass on the way to the frame. */
static void test_fill_bytes_and_standalone_markers_are_skipped(void) {
    spec s = BASELINE("21 11 11");
    jpeg plain, j;
    build(&plain, &s);
    memset(&j, 0, sizeof j);
    put2(&j, 0xFFD8);
    put(&j, "\xFF\xFF\xFF", 3);
    put(&j, "\xFF\xD0\xFF\x01\xFF\xD7", 6);
    segment(&j, 0xFE, "a comment", 9);
    segment(&j, 0xE1, "Exif\0\0", 6);
    segment(&j, 0xCC, "\x01\x10", 2);
    segment(&j, 0xDD, "\x00\x04", 2);
    segment(&j, 0xDC, "\x00\x10", 2);
    size_t skipped = j.n - 2;
    put(&j, plain.b + 2, plain.n - 2);
    fl_jpeg_header h;
    CHECK(accepted(&j, &h));
    CHECK(h.frame_offset == plain.sof_at + skipped && h.scan_offset == plain.sos_at + skipped);
    CHECK(h.width == 32 && h.h_sampling[0] == 2 && h.v_sampling[0] == 1);
    /* fill bytes right before the SOF and SOS markers: the offset is the 0xFF before the code */
    memset(&j, 0, sizeof j);
    put(&j, plain.b, plain.sof_at);
    put1(&j, 0xFF);
    put(&j, plain.b + plain.sof_at, plain.sos_at - plain.sof_at);
    put(&j, "\xFF\xFF", 2);
    put(&j, plain.b + plain.sos_at, plain.n - plain.sos_at);
    CHECK(accepted(&j, &h) && h.frame_offset == plain.sof_at + 1);
    CHECK(h.scan_offset == plain.sos_at + 3 && j.b[h.scan_offset + 1] == 0xDA);
    /* empty DQT and DHT segments are legal (libjpeg reads them) */
    memset(&j, 0, sizeof j);
    put2(&j, 0xFFD8);
    segment(&j, 0xDB, "", 0);
    segment(&j, 0xC4, "", 0);
    put(&j, plain.b + 2, plain.n - 2);
    CHECK(accepted(&j, &h));
    /* a second table in one DQT/DHT segment, and a 16-bit quantization table */
    memset(&j, 0, sizeof j);
    put2(&j, 0xFFD8);
    uint8_t tables[2 * 129] = {0x10};
    tables[129] = 0x11;
    segment(&j, 0xDB, tables, sizeof tables);
    uint8_t huff[2 * 19] = {0x00, 0, 2, [19] = 0x11, [21] = 2};
    segment(&j, 0xC4, huff, sizeof huff);
    put(&j, plain.b + 2, plain.n - 2);
    CHECK(accepted(&j, &h));
}

/* Every cut of valid headers of each kind, from 0 bytes to one short of the scan header's
 * end, is refused (never read past, never accepted). */
static void test_truncation_at_every_byte_is_refused(void) {
    spec kinds[] = {
        BASELINE("22 11 11"),
        {0xC2, 8, 640, 480, 3, "11 11 11", NULL, 0, 1, 1},
        {0xC1, 12, 1, 1, 1, "11", NULL, 0, -1, 0},
        {0xC0, 8, 65535, 65535, 4, "11 11 11 11", NULL, 0, 2, 0},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        jpeg j;
        build(&j, &kinds[k]);
        char needle[64];
        for (size_t cut = 0; cut < j.scan_end; cut++) {
            snprintf(needle, sizeof needle, "truncated at byte %zu", cut);
            CHECK(refused(j.b, cut, cut < 2 ? "not a JPEG: no SOI marker" : needle));
        }
        fl_jpeg_header h;
        CHECK(parse(j.b, j.scan_end, &h) == FL_OK && h.height == kinds[k].height);
    }
}

static void test_not_a_jpeg_is_refused(void) {
    CHECK(refused(NULL, 0, "not a JPEG: no SOI marker"));
    CHECK(refused("\xFF", 1, "not a JPEG: no SOI marker"));
    CHECK(refused("\xFF\xD9\xFF\xD8", 4, "not a JPEG: no SOI marker"));
    CHECK(refused("\x89PNG\r\n\x1a\n", 8, "not a JPEG: no SOI marker"));
    CHECK(refused("\xFF\xFF\xD8", 3, "not a JPEG: no SOI marker")); /* no fill before SOI */
    CHECK(refused("\xFF\xD8", 2, "truncated at byte 2: a marker must follow"));
    CHECK(refused("\xFF\xD8\xFF\xFF\xFF", 5, "truncated at byte 5: fill bytes without a marker"));
}

static void test_markers_out_of_order_are_refused(void) {
    spec s = BASELINE("22 11 11");
    jpeg plain, j;
    build(&plain, &s);
    CHECK(refused("\xFF\xD8\xFF\xDA\x00\x08\x01\x01\x00\x00\x3F\x00", 12,
                  "scan before the frame header at byte 2"));
    CHECK(refused("\xFF\xD8\xFF\xD9", 4, "end of image at byte 2, before the frame header"));
    CHECK(refused("\xFF\xD8\xFF\xD8", 4, "second SOI marker at byte 2"));
    /* EOI, a second SOF, a DHP between the frame header and the scan */
    const char *between[] = {"\xFF\xD9", "\xFF\xC2\x00\x0B\x08\x00\x01\x00\x01\x01\x01\x11\x00",
                             "\xFF\xDE\x00\x0B\x08\x00\x01\x00\x01\x01\x01\x11\x00"};
    const size_t sizes[] = {2, 13, 13};
    const char *needles[] = {"end of image at byte 108, before the first scan",
                             "second frame header (SOF2) at byte 108, the first at byte 89",
                             "DHP marker after the frame header at byte 108"};
    for (int i = 0; i < 3; i++) {
        memset(&j, 0, sizeof j);
        put(&j, plain.b, plain.sof_at + 19);
        put(&j, between[i], sizes[i]);
        put(&j, plain.b + plain.sof_at + 19, plain.n - plain.sof_at - 19);
        CHECK(refused(j.b, j.n, needles[i]));
    }
}

static void test_bad_bytes_between_segments_are_refused(void) {
    spec s = BASELINE("22 11 11");
    jpeg plain, j;
    build(&plain, &s);
    const char *inserted[] = {"\x00",     "\xFF\x00", "\xFF\xC8", "\xFF\xF7",
                              "\xFF\x02", "\xFF\xBF", "\xFF\xFD"};
    const char *needles[] = {
        "expected a marker at byte 89, found 0x00", "expected a marker at byte 89, found 0xFF00",
        "unsupported marker 0xFFC8 at byte 89",     "unsupported marker 0xFFF7 at byte 89",
        "unsupported marker 0xFF02 at byte 89",     "unsupported marker 0xFFBF at byte 89",
        "unsupported marker 0xFFFD at byte 89"};
    for (int i = 0; i < 7; i++) {
        memset(&j, 0, sizeof j);
        put(&j, plain.b, plain.sof_at);
        put(&j, inserted[i], i == 0 ? 1 : 2);
        put(&j, plain.b + plain.sof_at, plain.n - plain.sof_at);
        CHECK(refused(j.b, j.n, needles[i]));
    }
}

static void test_bad_segment_lengths_are_refused(void) {
    CHECK(refused("\xFF\xD8\xFF\xE0\x00\x00", 6, "bad segment length 0 at byte 4 (APP0)"));
    CHECK(refused("\xFF\xD8\xFF\xDB\x00\x01", 6, "bad segment length 1 at byte 4 (DQT)"));
    CHECK(refused("\xFF\xD8\xFF\xE1\xFF\xFF\x00", 7,
                  "truncated at byte 7: the APP1 segment at byte 2 is 65535 bytes long"));
    CHECK(refused("\xFF\xD8\xFF\xE1\x00", 5,
                  "truncated at byte 5: the APP1 segment at byte 2 has no length"));
    CHECK(refused("\xFF\xD8\xFF\xDD\x00\x05\x00\x01\x02", 9,
                  "bad segment length 5 at byte 4 (DRI: a DRI segment is 4 bytes)"));
    /* a frame header whose length disagrees with its component count */
    CHECK(refused("\xFF\xD8\xFF\xC0\x00\x0C\x08\x00\x01\x00\x01\x01\x01\x11\x00\x00", 16,
                  "bad segment length 12 at byte 4 (SOF0: 8 bytes + 3 per component)"));
    CHECK(refused("\xFF\xD8\xFF\xC0\x00\x07\x08\x00\x01\x00\x01", 11,
                  "bad segment length 7 at byte 4 (SOF0: a frame header holds at least 8 bytes)"));
}

/* A frame header from its fields, after SOI: returns the length written into b. */
static size_t frame_with(uint8_t *b, int code, int precision, unsigned h, unsigned w, int n,
                         const uint8_t *components) {
    jpeg j;
    memset(&j, 0, sizeof j);
    put2(&j, 0xFFD8);
    uint8_t body[6 + 3 * 8] = {(uint8_t)precision, (uint8_t)(h >> 8), (uint8_t)h,
                               (uint8_t)(w >> 8),  (uint8_t)w,        (uint8_t)n};
    memcpy(body + 6, components, 3 * (size_t)(n < 8 ? n : 8));
    segment(&j, code, body, 6 + 3 * (size_t)(n < 8 ? n : 8));
    memcpy(b, j.b, j.n);
    return j.n;
}

static void test_bad_frame_headers_are_refused(void) {
    static const uint8_t ycc[] = {1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1, 4, 0x11, 1, 5, 0x11, 1};
    static const uint8_t zero_h[] = {1, 0x22, 0, 2, 0x01, 1, 3, 0x11, 1};
    static const uint8_t zero_v[] = {1, 0x20, 0, 2, 0x11, 1, 3, 0x11, 1};
    static const uint8_t five[] = {1, 0x22, 0, 2, 0x11, 1, 3, 0x15, 1};
    static const uint8_t table4[] = {1, 0x22, 0, 2, 0x11, 4, 3, 0x11, 1};
    static const uint8_t twice[] = {1, 0x22, 0, 2, 0x11, 1, 1, 0x11, 1};
    static const struct {
        int code, precision;
        unsigned h, w;
        int n;
        const uint8_t *components;
        const char *needle; /* also names the case when it fails */
    } cases[] = {
        {0xC0, 8, 0, 32, 3, ycc, "frame of 32 x 0 pixels at byte 2 (a height defined by a DNL marker"},
        {0xC0, 8, 16, 0, 3, ycc, "frame of 0 x 16 pixels at byte 2"},
        {0xC0, 8, 16, 32, 0, ycc, "0 components in the frame header at byte 2"},
        {0xC0, 8, 16, 32, 5, ycc, "5 components in the frame header at byte 2 (1 to 4 are supported)"},
        {0xC0, 12, 16, 32, 3, ycc, "precision of 12 bits in the frame header at byte 2"},
        {0xC1, 7, 16, 32, 3, ycc, "precision of 7 bits"},
        {0xC2, 16, 16, 32, 3, ycc, "precision of 16 bits"},
        {0xC3, 1, 16, 32, 3, ycc, "precision of 1 bits"},
        {0xC3, 17, 16, 32, 3, ycc, "precision of 17 bits"},
        {0xC0, 8, 16, 32, 3, zero_h, "sampling factor 0 for component 1 at byte 16 (1 to 4)"},
        {0xC0, 8, 16, 32, 3, zero_v, "sampling factor 0 for component 0 at byte 13"},
        {0xC0, 8, 16, 32, 3, five, "sampling factor 5 for component 2 at byte 19"},
        {0xC0, 8, 16, 32, 3, table4, "quantization table 4 for component 1 at byte 17 (0 to 3)"},
        {0xC0, 8, 16, 32, 3, twice, "component id 1 repeated at byte 18"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t b[64];
        size_t n = frame_with(b, cases[i].code, cases[i].precision, cases[i].h, cases[i].w,
                              cases[i].n, cases[i].components);
        CHECK(refused(b, n, cases[i].needle));
    }
}

/* The first scan's header: 1 to (frame components) components, each in the frame, once. */
static void test_bad_scan_headers_are_refused(void) {
    spec s = BASELINE("22 11 11");
    jpeg plain, j;
    build(&plain, &s);
    const struct {
        const char *body;
        size_t n;
        const char *needle;
    } cases[] = {
        {"\x00\x00\x3F\x00", 4, "scan of 0 components at byte 130 (the frame has 3)"},
        {"", 0, "scan of 0 components at byte 130"},
        {"\x04\x01\x00\x02\x11\x03\x11\x04\x11\x00\x3F\x00", 12, "scan of 4 components"},
        {"\x01\x09\x00\x00\x3F\x00", 6, "scan at byte 130 names component id 9 not in the frame"},
        {"\x02\x02\x00\x02\x11\x00\x3F\x00", 8, "scan at byte 130 names component id 2 twice"},
        {"\x01\x01\x00\x00\x3F\x00\x00", 7,
         "bad segment length 9 at byte 132 (SOS: 6 bytes + 2 per component)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memset(&j, 0, sizeof j);
        put(&j, plain.b, plain.sos_at);
        segment(&j, 0xDA, cases[i].body, cases[i].n);
        CHECK(refused(j.b, j.n, cases[i].needle));
    }
    /* a scan of one component of three is the start of a non-interleaved image: fine */
    memset(&j, 0, sizeof j);
    put(&j, plain.b, plain.sos_at);
    segment(&j, 0xDA, "\x01\x02\x11\x00\x3F\x00", 6);
    fl_jpeg_header h;
    CHECK(accepted(&j, &h) && h.scan_offset == plain.sos_at);
}

static void test_bad_tables_are_refused(void) {
    spec s = BASELINE("22 11 11");
    jpeg plain, j;
    build(&plain, &s);
    uint8_t dqt_p2[65] = {0x20}, dqt_t4[65] = {0x04}, dqt_short[64] = {0x00}, dqt_long[66] = {0};
    uint8_t dqt16_short[100] = {0x10};
    uint8_t dht_c2[18] = {0x20, 1}, dht_t4[18] = {0x14, 1}, dht_short[16] = {0};
    uint8_t dht_many[17 + 257] = {0x10}, dht_values_short[18] = {0x00, 2};
    for (int k = 1; k <= 16; k++)
        dht_many[k] = 16;
    dht_many[16] = 17; /* 257 codes */
    const struct {
        int code;
        const uint8_t *body;
        size_t n;
        const char *needle;
    } cases[] = {
        {0xDB, dqt_p2, sizeof dqt_p2, "quantization table 0 of precision 2 at byte 93"},
        {0xDB, dqt_t4, sizeof dqt_t4, "quantization table 4 of precision 0 at byte 93"},
        {0xDB, dqt_short, sizeof dqt_short, "bad segment length 66 at byte 91 (DQT: a table runs"},
        {0xDB, dqt_long, sizeof dqt_long, "bad segment length 68 at byte 91 (DQT"},
        {0xDB, dqt16_short, sizeof dqt16_short, "bad segment length 102 at byte 91 (DQT"},
        {0xC4, dht_c2, sizeof dht_c2, "Huffman table class 2 number 0 at byte 93"},
        {0xC4, dht_t4, sizeof dht_t4, "Huffman table class 1 number 4 at byte 93"},
        {0xC4, dht_short, sizeof dht_short, "bad segment length 18 at byte 91 (DHT"},
        {0xC4, dht_many, sizeof dht_many, "Huffman table of 257 codes at byte 93 (at most 256)"},
        {0xC4, dht_values_short, sizeof dht_values_short, "bad segment length 20 at byte 91 (DHT"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memset(&j, 0, sizeof j);
        put(&j, plain.b, plain.sof_at);
        segment(&j, cases[i].code, cases[i].body, cases[i].n);
        put(&j, plain.b + plain.sof_at, plain.n - plain.sof_at);
        CHECK(refused(j.b, j.n, cases[i].needle));
    }
}

/* JFIF and Adobe segments too short for libjpeg to read as such are plain APPn segments. */
static void test_short_jfif_and_adobe_segments_do_not_count(void) {
    spec s = BASELINE("11 11 11");
    s.jfif = 0;
    jpeg plain, j;
    build(&plain, &s);
    memset(&j, 0, sizeof j);
    put2(&j, 0xFFD8);
    segment(&j, 0xE0, "JFIF\0\1\1\0\0\1\0\1\0", 13);   /* 13 of the 14 bytes */
    segment(&j, 0xEE, "Adobe\0\x64\0\0\0\0", 11);      /* 11 of the 12 */
    segment(&j, 0xE0, "JFXX\0\1\1\0\0\1\0\1\0\0", 14); /* not JFIF */
    segment(&j, 0xEE, "Adobf\0\x64\0\0\0\0\0", 12);    /* not Adobe */
    put(&j, plain.b + 2, plain.n - 2);
    fl_jpeg_header h;
    CHECK(accepted(&j, &h) && h.jfif == 0 && h.adobe_transform == -1);
}

typedef struct thread_case {
    size_t cut;   /* each thread refuses a different cut */
    int failures; /* counted here: CHECK's counter is not shared across threads */
} thread_case;

static void *parse_in_a_loop(void *arg) {
    thread_case *t = arg;
    spec s = BASELINE("22 11 11");
    jpeg j;
    build(&j, &s);
    char needle[64];
    snprintf(needle, sizeof needle, "truncated at byte %zu", t->cut);
    for (int i = 0; i < 2000; i++) {
        fl_jpeg_header h;
        if (fl_jpeg_header_parse(j.b, j.n, &h) != FL_OK || h.scan_offset != j.sos_at)
            t->failures++;
        if (fl_jpeg_header_parse(j.b, t->cut, &h) != FL_EDECODE ||
            strstr(fl_error_detail(), needle) == NULL)
            t->failures++;
    }
    return NULL;
}

/* The parser keeps nothing between calls; each thread reads its own error detail. */
static void test_threads_parse_independently(void) {
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    thread_case cases[THREADS];
    for (int i = 0; i < THREADS; i++) {
        cases[i] = (thread_case){.cut = 20 + 30 * (size_t)i, .failures = 0};
        CHECK(pthread_create(&threads[i], NULL, parse_in_a_loop, &cases[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        CHECK(cases[i].failures == 0);
    }
}

int main(void) {
    RUN(test_baseline_420_jfif_parses_and_routes_to_the_engine);
    RUN(test_engine_takes_444_422_420_440_and_grayscale);
    RUN(test_cuda_decoder_takes_411_410_and_8_bit_extended);
    RUN(test_processes_other_than_huffman_sequential_go_to_the_cpu);
    RUN(test_a_dhp_segment_makes_the_frame_hierarchical);
    RUN(test_2_and_4_components_and_12_bit_go_to_the_cpu);
    RUN(test_rgb_without_colour_transform_goes_to_the_cpu);
    RUN(test_sampling_outside_nvjpegs_list_goes_to_the_cpu);
    RUN(test_fill_bytes_and_standalone_markers_are_skipped);
    RUN(test_truncation_at_every_byte_is_refused);
    RUN(test_not_a_jpeg_is_refused);
    RUN(test_markers_out_of_order_are_refused);
    RUN(test_bad_bytes_between_segments_are_refused);
    RUN(test_bad_segment_lengths_are_refused);
    RUN(test_bad_frame_headers_are_refused);
    RUN(test_bad_scan_headers_are_refused);
    RUN(test_bad_tables_are_refused);
    RUN(test_short_jfif_and_adobe_segments_do_not_count);
    RUN(test_threads_parse_independently);
    return check_failures != 0;
}
