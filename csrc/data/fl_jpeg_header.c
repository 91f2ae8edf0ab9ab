/* fl_jpeg_header.c - a strict walk over a JPEG's markers to its first scan header (ITU-T T.81
 * annex B, with libjpeg's reading of the APP0/APP14 segments), and nvJPEG's routing rules. */
#include "data/fl_jpeg_header.h"

#include <stdio.h>
#include <string.h>

#include "base/fl_error.h"

/* Marker codes: the byte after 0xFF (T.81 table B.1). */
enum {
    M_TEM = 0x01,
    M_SOF0 = 0xC0, /* SOF0-SOF15 are 0xC0-0xCF, less DHT, JPG and DAC */
    M_DHT = 0xC4,
    M_JPG = 0xC8,
    M_DAC = 0xCC,
    M_RST0 = 0xD0,
    M_RST7 = 0xD7,
    M_SOI = 0xD8,
    M_EOI = 0xD9,
    M_SOS = 0xDA,
    M_DQT = 0xDB,
    M_DNL = 0xDC,
    M_DRI = 0xDD,
    M_DHP = 0xDE,
    M_EXP = 0xDF,
    M_APP0 = 0xE0,
    M_APP14 = 0xEE,
    M_APP15 = 0xEF,
    M_COM = 0xFE,
};

/* libjpeg's minimum APP0/APP14 payloads for JFIF and Adobe (APP0_DATA_LEN, APP14_DATA_LEN). */
enum { JFIF_MIN = 14, ADOBE_MIN = 12, QUANT_TABLES = 4, HUFF_TABLES = 4 };

typedef struct walker {
    const uint8_t *data;
    size_t len;
    size_t pos;       /* the next byte to read */
    fl_jpeg_header h; /* filled as the segments come */
    int have_frame;
    int hierarchical; /* a DHP or EXP segment came before the frame */
} walker;

static unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

static int is_sof(int code) {
    return code >= M_SOF0 && code <= 0xCF && code != M_DHT && code != M_JPG && code != M_DAC;
}

/* "SOF2", "APP14", "DQT"...: the name of a marker with a segment (one take_marker reads) for a
 * detail, written into buf (8 bytes) where it has a number. */
static const char *marker_name(int code, char *buf) {
    static const char *const fixed[] = {[M_SOI - M_SOI] = "SOI", [M_EOI - M_SOI] = "EOI",
                                        [M_SOS - M_SOI] = "SOS", [M_DQT - M_SOI] = "DQT",
                                        [M_DNL - M_SOI] = "DNL", [M_DRI - M_SOI] = "DRI",
                                        [M_DHP - M_SOI] = "DHP", [M_EXP - M_SOI] = "EXP"};
    if (code >= M_SOI && code <= M_EXP)
        return fixed[code - M_SOI];
    if (is_sof(code))
        snprintf(buf, 8, "SOF%d", (code - M_SOF0) & 15);
    else if (code >= M_APP0 && code <= M_APP15)
        snprintf(buf, 8, "APP%d", (code - M_APP0) & 15);
    else
        return code == M_DHT ? "DHT" : code == M_DAC ? "DAC" : "COM";
    return buf;
}

/* Moves past the next marker: 0xFF, any fill bytes (more 0xFF), then the code. Sets *code
 * and *at (the offset of the 0xFF right before the code). */
static int next_marker(walker *w, int *code, size_t *at) {
    if (w->pos >= w->len)
        return fl_error_set(FL_EDECODE, "truncated at byte %zu: a marker must follow", w->len);
    if (w->data[w->pos] != 0xFF)
        return fl_error_set(FL_EDECODE, "expected a marker at byte %zu, found 0x%02X", w->pos,
                            w->data[w->pos]);
    size_t p = w->pos;
    while (p < w->len && w->data[p] == 0xFF)
        p++;
    if (p == w->len)
        return fl_error_set(FL_EDECODE, "truncated at byte %zu: fill bytes without a marker",
                            w->len);
    if (w->data[p] == 0x00)
        return fl_error_set(FL_EDECODE, "expected a marker at byte %zu, found 0xFF00", p - 1);
    *code = w->data[p];
    *at = p - 1;
    w->pos = p + 1;
    return FL_OK;
}

/* Moves past the segment of the marker at `at`: its 2-byte length (itself included) and its
 * payload, which must lie inside the data. Sets *body and *body_len to the payload. */
static int take_segment(walker *w, int code, size_t at, const uint8_t **body, size_t *body_len) {
    char name[8];
    if (w->len - w->pos < 2)
        return fl_error_set(FL_EDECODE,
                            "truncated at byte %zu: the %s segment at byte %zu has no length",
                            w->len, marker_name(code, name), at);
    unsigned length = be16(w->data + w->pos);
    if (length < 2)
        return fl_error_set(FL_EDECODE, "bad segment length %u at byte %zu (%s)", length, w->pos,
                            marker_name(code, name));
    if (w->len - w->pos < length)
        return fl_error_set(FL_EDECODE,
                            "truncated at byte %zu: the %s segment at byte %zu is %u bytes long",
                            w->len, marker_name(code, name), at, length);
    *body = w->data + w->pos + 2;
    *body_len = length - 2;
    w->pos += length;
    return FL_OK;
}

static int bad_length(const walker *w, const uint8_t *body, int code, const char *why) {
    char name[8];
    size_t length_at = (size_t)(body - w->data) - 2;
    return fl_error_set(FL_EDECODE, "bad segment length %u at byte %zu (%s: %s)",
                        be16(w->data + length_at), length_at, marker_name(code, name), why);
}

/* The precisions T.81 allows a frame type: 8 for baseline, 8 or 12 for the other DCT
 * processes, 2 to 16 for lossless (SOF3, 7, 11, 15). */
static int precision_allowed(int code, int precision) {
    if (code == M_SOF0)
        return precision == 8;
    if ((code & 3) == 3)
        return precision >= 2 && precision <= 16;
    return precision == 8 || precision == 12;
}

static fl_jpeg_process process_of(int code, int hierarchical) {
    if (hierarchical || (code >= 0xC5 && code <= 0xC7) || code >= 0xCD)
        return FL_JPEG_HIERARCHICAL;
    if (code >= 0xC9)
        return FL_JPEG_ARITHMETIC;
    static const fl_jpeg_process sequential[] = {FL_JPEG_BASELINE, FL_JPEG_EXTENDED,
                                                 FL_JPEG_PROGRESSIVE, FL_JPEG_LOSSLESS};
    return sequential[code - M_SOF0];
}

/* The component specifications of a frame header: ids, sampling factors, table numbers. */
static int read_components(walker *w, const uint8_t *spec, size_t at) {
    fl_jpeg_header *h = &w->h;
    for (int i = 0; i < h->components; i++, spec += 3) {
        size_t byte = at + 10 + 3 * (size_t)i;
        int hs = spec[1] >> 4, vs = spec[1] & 15;
        if (hs < 1 || hs > 4 || vs < 1 || vs > 4)
            return fl_error_set(FL_EDECODE,
                                "sampling factor %d for component %d at byte %zu (1 to 4)",
                                hs < 1 || hs > 4 ? hs : vs, i, byte + 1);
        if (spec[2] >= QUANT_TABLES)
            return fl_error_set(FL_EDECODE,
                                "quantization table %d for component %d at byte %zu (0 to 3)",
                                spec[2], i, byte + 2);
        for (int j = 0; j < i; j++)
            if (h->component_id[j] == spec[0])
                return fl_error_set(FL_EDECODE, "component id %d repeated at byte %zu", spec[0],
                                    byte);
        h->component_id[i] = spec[0];
        h->h_sampling[i] = (uint8_t)hs;
        h->v_sampling[i] = (uint8_t)vs;
    }
    return FL_OK;
}

/* The frame header (B.2.2): precision, height, width, components. */
static int read_frame(walker *w, int code, size_t at, const uint8_t *body, size_t n) {
    fl_jpeg_header *h = &w->h;
    if (n < 6)
        return bad_length(w, body, code, "a frame header holds at least 8 bytes");
    int precision = body[0], components = body[5];
    unsigned height = be16(body + 1), width = be16(body + 3);
    if (components < 1 || components > FL_JPEG_MAX_COMPONENTS)
        return fl_error_set(FL_EDECODE,
                            "%d components in the frame header at byte %zu (1 to 4 are supported)",
                            components, at);
    if (n != 6 + 3 * (size_t)components)
        return bad_length(w, body, code, "8 bytes + 3 per component");
    if (!precision_allowed(code, precision))
        return fl_error_set(FL_EDECODE, "precision of %d bits in the frame header at byte %zu",
                            precision, at);
    if (height == 0)
        return fl_error_set(FL_EDECODE,
                            "frame of %u x 0 pixels at byte %zu (a height defined by a DNL marker "
                            "is not supported)",
                            width, at);
    if (width == 0)
        return fl_error_set(FL_EDECODE, "frame of 0 x %u pixels at byte %zu", height, at);
    h->precision = precision;
    h->height = height;
    h->width = width;
    h->components = components;
    h->process = process_of(code, w->hierarchical);
    h->frame_offset = at;
    w->have_frame = 1;
    return read_components(w, body + 6, at);
}

/* The scan header (B.2.3): which frame components the first scan holds. */
static int read_scan(walker *w, size_t at, const uint8_t *body, size_t n) {
    const fl_jpeg_header *h = &w->h;
    int count = n > 0 ? body[0] : 0;
    if (count < 1 || count > h->components)
        return fl_error_set(FL_EDECODE, "scan of %d components at byte %zu (the frame has %d)",
                            count, at, h->components);
    if (n != 4 + 2 * (size_t)count)
        return bad_length(w, body, M_SOS, "6 bytes + 2 per component");
    int used = 0;
    for (int i = 0; i < count; i++) {
        int id = body[1 + 2 * i], k = 0;
        while (k < h->components && h->component_id[k] != id)
            k++;
        if (k == h->components || (used & (1 << k)))
            return fl_error_set(FL_EDECODE, "scan at byte %zu names component id %d %s", at, id,
                                k == h->components ? "not in the frame" : "twice");
        used |= 1 << k;
    }
    w->h.scan_offset = at;
    return FL_OK;
}

/* DQT (B.2.4.1): tables of 64 entries of 8 or 16 bits, numbered 0 to 3, filling the segment. */
static int check_dqt(const walker *w, const uint8_t *body, size_t n) {
    for (size_t i = 0; i < n;) {
        int precision = body[i] >> 4, index = body[i] & 15;
        if (precision > 1 || index >= QUANT_TABLES)
            return fl_error_set(FL_EDECODE, "quantization table %d of precision %d at byte %zu",
                                index, precision, (size_t)(body - w->data) + i);
        size_t size = 1 + 64 * (size_t)(precision + 1);
        if (n - i < size)
            return bad_length(w, body, M_DQT, "a table runs past the segment");
        i += size;
    }
    return FL_OK;
}

/* DHT (B.2.4.2): tables of 16 code counts and as many values, class 0/1, number 0 to 3. */
static int check_dht(const walker *w, const uint8_t *body, size_t n) {
    for (size_t i = 0; i < n;) {
        int table_class = body[i] >> 4, index = body[i] & 15;
        if (table_class > 1 || index >= HUFF_TABLES)
            return fl_error_set(FL_EDECODE, "Huffman table class %d number %d at byte %zu",
                                table_class, index, (size_t)(body - w->data) + i);
        if (n - i < 17)
            return bad_length(w, body, M_DHT, "a table runs past the segment");
        size_t codes = 0;
        for (int k = 1; k <= 16; k++)
            codes += body[i + (size_t)k];
        if (codes > 256)
            return fl_error_set(FL_EDECODE, "Huffman table of %zu codes at byte %zu (at most 256)",
                                codes, (size_t)(body - w->data) + i);
        if (n - i - 17 < codes)
            return bad_length(w, body, M_DHT, "a table runs past the segment");
        i += 17 + codes;
    }
    return FL_OK;
}

/* APP0 and APP14 as libjpeg reads them (jdmarker.c examine_app0/examine_app14). */
static void note_app(walker *w, int code, const uint8_t *body, size_t n) {
    if (code == M_APP0 && n >= JFIF_MIN && memcmp(body, "JFIF", 5) == 0)
        w->h.jfif = 1;
    if (code == M_APP14 && n >= ADOBE_MIN && memcmp(body, "Adobe", 5) == 0)
        w->h.adobe_transform = body[11];
}

/* A segment with a length: a frame header, a table, an APPn... */
static int read_segment(walker *w, int code, size_t at) {
    const uint8_t *body = NULL;
    size_t n = 0;
    int rc = take_segment(w, code, at, &body, &n);
    if (rc != FL_OK)
        return rc;
    if (is_sof(code))
        return read_frame(w, code, at, body, n);
    switch (code) {
    case M_SOS:
        return read_scan(w, at, body, n);
    case M_DQT:
        return check_dqt(w, body, n);
    case M_DHT:
        return check_dht(w, body, n);
    case M_DRI:
        return n == 2 ? FL_OK : bad_length(w, body, code, "a DRI segment is 4 bytes");
    case M_DHP:
    case M_EXP:
        w->hierarchical = 1;
        return FL_OK;
    default: /* APPn, COM, DAC, DNL */
        note_app(w, code, body, n);
        return FL_OK;
    }
}

/* One marker: returns 1 once the first scan header is read, 0 to go on, or an error. */
static int take_marker(walker *w, int code, size_t at) {
    char name[8];
    if (code == M_TEM || (code >= M_RST0 && code <= M_RST7))
        return 0; /* standalone, no segment; libjpeg skips them */
    if (code == M_SOI)
        return fl_error_set(FL_EDECODE, "second SOI marker at byte %zu", at);
    if (code == M_EOI)
        return fl_error_set(FL_EDECODE, "end of image at byte %zu, before the %s", at,
                            w->have_frame ? "first scan" : "frame header");
    if (code == M_SOS && !w->have_frame)
        return fl_error_set(FL_EDECODE, "scan before the frame header at byte %zu", at);
    if (is_sof(code) && w->have_frame)
        return fl_error_set(FL_EDECODE,
                            "second frame header (%s) at byte %zu, the first at byte %zu",
                            marker_name(code, name), at, w->h.frame_offset);
    if (code == M_DHP && w->have_frame)
        return fl_error_set(FL_EDECODE, "DHP marker after the frame header at byte %zu", at);
    int known = is_sof(code) || code == M_DHT || code == M_DAC || code == M_COM ||
                (code >= M_SOS && code <= M_APP15);
    if (!known)
        return fl_error_set(FL_EDECODE, "unsupported marker 0xFF%02X at byte %zu", code, at);
    int rc = read_segment(w, code, at);
    return rc != FL_OK ? rc : code == M_SOS;
}

int fl_jpeg_header_parse(const void *data, size_t len, fl_jpeg_header *out) {
    walker w = {.data = data, .len = len, .pos = 2};
    w.h.adobe_transform = -1;
    if (len < 2 || w.data[0] != 0xFF || w.data[1] != M_SOI)
        return fl_error_set(FL_EDECODE, "not a JPEG: no SOI marker");
    for (;;) {
        int code = 0, rc;
        size_t at = 0;
        if ((rc = next_marker(&w, &code, &at)) != FL_OK)
            return rc;
        if ((rc = take_marker(&w, code, at)) < 0)
            return rc;
        if (rc == 1)
            break;
    }
    *out = w.h;
    return FL_OK;
}

/* ---- routing ---- */

/* The colour space libjpeg gives 3 components (jdapimin.c default_decompress_parms): RGB, not
 * YCbCr, when there is no JFIF segment and either Adobe's transform is 0 or, without an Adobe
 * segment, the component ids spell 'R', 'G', 'B'. nvJPEG would convert them from YCbCr. */
static const char *rgb_reason(const fl_jpeg_header *h) {
    if (h->jfif)
        return NULL;
    if (h->adobe_transform >= 0)
        return h->adobe_transform == 0 ? "RGB without colour transform (Adobe transform 0)" : NULL;
    if (h->component_id[0] == 'R' && h->component_id[1] == 'G' && h->component_id[2] == 'B')
        return "RGB without colour transform (component ids 'R', 'G', 'B')";
    return NULL;
}

typedef enum subsampling { SUB_ENGINE, SUB_411, SUB_410, SUB_OTHER } subsampling;

/* Chroma subsampling of 3 components: luma's sampling factors over chroma at 1x1. */
static subsampling subsampling_of(const fl_jpeg_header *h) {
    if (h->h_sampling[1] != 1 || h->v_sampling[1] != 1 || h->h_sampling[2] != 1 ||
        h->v_sampling[2] != 1)
        return SUB_OTHER;
    int luma = h->h_sampling[0] * 10 + h->v_sampling[0];
    switch (luma) {
    case 11: /* 4:4:4 */
    case 21: /* 4:2:2 */
    case 22: /* 4:2:0 */
    case 12: /* 4:4:0 */
        return SUB_ENGINE;
    case 41:
        return SUB_411;
    case 42:
        return SUB_410;
    default:
        return SUB_OTHER;
    }
}

/* Why only the CPU decoder can take the image, or NULL. */
static const char *cpu_reason(const fl_jpeg_header *h) {
    switch (h->process) {
    case FL_JPEG_PROGRESSIVE:
        return "progressive";
    case FL_JPEG_LOSSLESS:
        return "lossless";
    case FL_JPEG_HIERARCHICAL:
        return "hierarchical";
    case FL_JPEG_ARITHMETIC:
        return "arithmetic coding";
    default:
        break;
    }
    if (h->precision != 8)
        return "samples of more than 8 bits";
    if (h->components == 2)
        return "2 components";
    if (h->components == 4)
        return h->adobe_transform == 2 ? "4 components (YCCK)" : "4 components (CMYK)";
    if (h->components == 3) {
        const char *rgb = rgb_reason(h);
        if (rgb != NULL)
            return rgb;
        if (subsampling_of(h) == SUB_OTHER)
            return "chroma sampling outside nvJPEG's 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:1:0";
    }
    return NULL;
}

/* Why the CUDA decoder, not the engine, takes an image the CPU need not, or NULL. */
static const char *cuda_reason(const fl_jpeg_header *h) {
    if (h->process == FL_JPEG_EXTENDED)
        return "extended sequential (SOF1) frame";
    if (h->components == 3 && subsampling_of(h) == SUB_411)
        return "4:1:1 chroma subsampling";
    if (h->components == 3 && subsampling_of(h) == SUB_410)
        return "4:1:0 chroma subsampling";
    return NULL;
}

fl_jpeg_route fl_jpeg_route_of(const fl_jpeg_header *h, const char **why) {
    fl_jpeg_route route = FL_JPEG_ROUTE_HARDWARE;
    const char *reason = cpu_reason(h);
    if (reason != NULL)
        route = FL_JPEG_ROUTE_CPU;
    else if ((reason = cuda_reason(h)) != NULL)
        route = FL_JPEG_ROUTE_CUDA;
    if (why != NULL)
        *why = reason != NULL ? reason : "";
    return route;
}
