/* fuzz_jpeg_header.c - libFuzzer target for fl_jpeg_header_parse and fl_jpeg_route_of: any input
 * either parses into a header that satisfies every documented invariant (its frame and scan
 * headers inside the data, saying what the header says; the same header from the bytes up to the
 * scan header's end, a refusal one byte short of it) and routes the same way every time, within
 * the routing rules; or is refused with FL_EDECODE, a printable detail and *out untouched.
 * replay_jpeg_header.c includes this file to run the corpus without clang. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/fl_error.h"
#include "data/fl_jpeg_header.h"
#include "fuzz_checks.h"

static unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

/* The process a SOFn code names, DHP aside (hierarchical either way). */
static int code_fits(int code, fl_jpeg_process process) {
    switch (code) {
    case 0xC0:
        return process == FL_JPEG_BASELINE || process == FL_JPEG_HIERARCHICAL;
    case 0xC1:
        return process == FL_JPEG_EXTENDED || process == FL_JPEG_HIERARCHICAL;
    case 0xC2:
        return process == FL_JPEG_PROGRESSIVE || process == FL_JPEG_HIERARCHICAL;
    case 0xC3:
        return process == FL_JPEG_LOSSLESS || process == FL_JPEG_HIERARCHICAL;
    case 0xC5:
    case 0xC6:
    case 0xC7:
    case 0xCD:
    case 0xCE:
    case 0xCF:
        return process == FL_JPEG_HIERARCHICAL;
    case 0xC9:
    case 0xCA:
    case 0xCB:
        return process == FL_JPEG_ARITHMETIC || process == FL_JPEG_HIERARCHICAL;
    default:
        return 0;
    }
}

/* The frame header at frame_offset holds what the header says. */
static void check_frame(const fl_jpeg_header *h, const uint8_t *data, size_t size) {
    size_t n = (size_t)h->components;
    INVARIANT(h->frame_offset < size && size - h->frame_offset >= 10 + 3 * n);
    const uint8_t *f = data + h->frame_offset;
    INVARIANT(f[0] == 0xFF && code_fits(f[1], h->process) && be16(f + 2) == 8 + 3 * n);
    INVARIANT(f[4] == h->precision && be16(f + 5) == h->height && be16(f + 7) == h->width);
    INVARIANT(f[9] == h->components);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *c = f + 10 + 3 * i;
        INVARIANT(c[0] == h->component_id[i]);
        INVARIANT(c[1] >> 4 == h->h_sampling[i] && (c[1] & 15) == h->v_sampling[i]);
        INVARIANT(h->h_sampling[i] >= 1 && h->h_sampling[i] <= 4);
        INVARIANT(h->v_sampling[i] >= 1 && h->v_sampling[i] <= 4 && c[2] <= 3);
        for (size_t j = 0; j < i; j++)
            INVARIANT(h->component_id[j] != h->component_id[i]);
    }
}

/* The end of the first scan's header, which lies after the frame header, inside the data. */
static size_t scan_end(const fl_jpeg_header *h, const uint8_t *data, size_t size) {
    INVARIANT(h->scan_offset > h->frame_offset && h->scan_offset < size);
    INVARIANT(size - h->scan_offset >= 5);
    const uint8_t *s = data + h->scan_offset;
    INVARIANT(s[0] == 0xFF && s[1] == 0xDA && s[4] >= 1 && s[4] <= h->components);
    INVARIANT(be16(s + 2) == 6 + 2 * (unsigned)s[4] && size - h->scan_offset - 2 >= be16(s + 2));
    return h->scan_offset + 2 + be16(s + 2);
}

static void check_header(const fl_jpeg_header *h) {
    INVARIANT(h->width >= 1 && h->width <= 65535 && h->height >= 1 && h->height <= 65535);
    INVARIANT(h->components >= 1 && h->components <= FL_JPEG_MAX_COMPONENTS);
    INVARIANT(h->precision >= 2 && h->precision <= 16);
    INVARIANT(h->process >= FL_JPEG_BASELINE && h->process <= FL_JPEG_ARITHMETIC);
    INVARIANT(h->process != FL_JPEG_BASELINE || h->precision == 8);
    INVARIANT(h->adobe_transform >= -1 && h->adobe_transform <= 255);
    INVARIANT(h->jfif == 0 || h->jfif == 1);
}

static int same_header(const fl_jpeg_header *a, const fl_jpeg_header *b) {
    return a->width == b->width && a->height == b->height && a->components == b->components &&
           a->precision == b->precision && a->process == b->process &&
           memcmp(a->component_id, b->component_id, sizeof a->component_id) == 0 &&
           memcmp(a->h_sampling, b->h_sampling, sizeof a->h_sampling) == 0 &&
           memcmp(a->v_sampling, b->v_sampling, sizeof a->v_sampling) == 0 &&
           a->adobe_transform == b->adobe_transform && a->jfif == b->jfif &&
           a->frame_offset == b->frame_offset && a->scan_offset == b->scan_offset;
}

/* The route is the same every time and keeps to the rules the header states. */
static void check_route(const fl_jpeg_header *h) {
    const char *why = NULL, *again = NULL;
    fl_jpeg_route route = fl_jpeg_route_of(h, &why);
    INVARIANT(fl_jpeg_route_of(h, &again) == route && again == why && why != NULL);
    INVARIANT(route >= FL_JPEG_ROUTE_HARDWARE && route <= FL_JPEG_ROUTE_CPU);
    INVARIANT((route == FL_JPEG_ROUTE_HARDWARE) == (why[0] == '\0') && printable(why));
    int huffman_8bit = (h->process == FL_JPEG_BASELINE || h->process == FL_JPEG_EXTENDED) &&
                       h->precision == 8 && (h->components == 1 || h->components == 3);
    if (!huffman_8bit)
        INVARIANT(route == FL_JPEG_ROUTE_CPU);
    if (route == FL_JPEG_ROUTE_HARDWARE)
        INVARIANT(h->process == FL_JPEG_BASELINE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fl_jpeg_header h, again, untouched;
    memset(&h, 0x5A, sizeof h);
    untouched = h;
    fl_error_clear();
    int rc = fl_jpeg_header_parse(data, size, &h);
    if (rc != FL_OK) {
        INVARIANT(rc == FL_EDECODE && memcmp(&h, &untouched, sizeof h) == 0);
        INVARIANT(fl_error_detail()[0] != '\0' && printable(fl_error_detail()));
        return 0;
    }
    check_header(&h);
    check_frame(&h, data, size);
    size_t end = scan_end(&h, data, size);
    check_route(&h);
    /* Nothing after the scan header is read: those bytes alone parse the same, one less fails. */
    INVARIANT(fl_jpeg_header_parse(data, end, &again) == FL_OK && same_header(&h, &again));
    INVARIANT(fl_jpeg_header_parse(data, end - 1, &again) == FL_EDECODE);
    return 0;
}
