/* fl_summary.c - histogram, image (PNG over a dlopened zlib) and text summaries. */
#include "monitor/fl_summary.h"

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_crc.h"
#include "base/fl_dl.h"
#include "base/fl_error.h"
#include "base/fl_time.h"
#include "monitor/fl_tfevents.h"

enum {
    EVENT_WALL_TIME = 1,
    EVENT_STEP = 2,
    EVENT_SUMMARY = 5,
    SUMMARY_VALUE = 1,
    VALUE_TAG = 1,
    VALUE_IMAGE = 4,
    VALUE_HISTO = 5,
    VALUE_TENSOR = 8,
    VALUE_METADATA = 9,
    IMAGE_HEIGHT = 1,
    IMAGE_WIDTH = 2,
    IMAGE_COLORSPACE = 3,
    IMAGE_ENCODED = 4,
    HISTO_MIN = 1,
    HISTO_MAX = 2,
    HISTO_NUM = 3,
    HISTO_SUM = 4,
    HISTO_SUM_SQUARES = 5,
    HISTO_BUCKET_LIMIT = 6,
    HISTO_BUCKET = 7,
    METADATA_PLUGIN_DATA = 1,
    PLUGIN_NAME = 1,
    TENSOR_DTYPE = 1,
    TENSOR_SHAPE = 2,
    TENSOR_STRING_VAL = 8,
    DT_STRING = 7,
};

fl_summary *fl_summary_new(fl_summary_kind kind, size_t payload_bytes) {
    fl_summary *s = malloc(sizeof *s + payload_bytes); /* the payload is the caller's to fill */
    if (s != NULL) {
        memset(s, 0, sizeof *s);
        s->kind = kind;
        s->wall_time = fl_wall_time();
        s->step = -1;
    }
    return s;
}

/* ---- zlib, loaded once ---- */

typedef unsigned long (*compress_bound_fn)(unsigned long);
typedef int (*compress2_fn)(unsigned char *, unsigned long *, const unsigned char *, unsigned long, int);

static struct {
    pthread_once_t once;
    compress_bound_fn bound;
    compress2_fn compress;
    char why[200];
} zlib = {.once = PTHREAD_ONCE_INIT};

static void load_zlib(void) {
    void *handle = fl_dl_open("libz.so.1", "zlib");
    if (handle == NULL) {
        snprintf(zlib.why, sizeof zlib.why, "%s", fl_error_detail());
        fl_error_clear();
        return;
    }
    *(void **)&zlib.bound = dlsym(handle, "compressBound");
    *(void **)&zlib.compress = dlsym(handle, "compress2");
    if (zlib.bound == NULL || zlib.compress == NULL)
        snprintf(zlib.why, sizeof zlib.why, "libz.so.1 lacks compressBound/compress2");
}

/* ---- PNG ---- */

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* One chunk: length, type, data, CRC-32 of type + data. */
static void png_chunk(fl_buf *out, const char type[4], const unsigned char *data, size_t len) {
    unsigned char head[8];
    put_be32(head, (uint32_t)len);
    memcpy(head + 4, type, 4);
    fl_buf_append(out, head, 8);
    fl_buf_append(out, data, len);
    uint32_t crc = fl_crc32(fl_crc32(0, type, 4), data, len);
    unsigned char tail[4];
    put_be32(tail, crc);
    fl_buf_append(out, tail, 4);
}

int fl_png_encode(fl_buf *out, const unsigned char *hwc, int height, int width, int channels) {
    static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    static const unsigned char color_type[5] = {0, 0, 4, 2, 6}; /* by channels: gray, -, RGB, RGBA */
    if (height < 1 || width < 1 || (channels != 1 && channels != 3 && channels != 4))
        return fl_error_set(FL_EINVAL, "image of %dx%dx%d: need height, width >= 1 and 1, 3 or "
                            "4 channels", height, width, channels);
    pthread_once(&zlib.once, load_zlib);
    if (zlib.compress == NULL)
        return fl_error_set(FL_EINVAL, "%s", zlib.why);
    size_t row = (size_t)width * (size_t)channels;
    size_t raw_len = (row + 1) * (size_t)height; /* each row starts with filter type 0 */
    unsigned char *raw = malloc(raw_len);
    unsigned long packed_len = zlib.bound((unsigned long)raw_len);
    unsigned char *packed = malloc(packed_len);
    int rc = FL_ENOMEM;
    if (raw != NULL && packed != NULL) {
        for (int y = 0; y < height; y++) {
            raw[(size_t)y * (row + 1)] = 0;
            memcpy(raw + (size_t)y * (row + 1) + 1, hwc + (size_t)y * row, row);
        }
        rc = zlib.compress(packed, &packed_len, raw, (unsigned long)raw_len, 6) == 0
                 ? FL_OK
                 : fl_error_set(FL_EINVAL, "zlib could not compress a %dx%d image", height, width);
    }
    if (rc == FL_OK) {
        unsigned char ihdr[13];
        put_be32(ihdr, (uint32_t)width);
        put_be32(ihdr + 4, (uint32_t)height);
        ihdr[8] = 8; /* bits per channel */
        ihdr[9] = color_type[channels];
        ihdr[10] = ihdr[11] = ihdr[12] = 0; /* deflate, adaptive filtering, no interlace */
        fl_buf_append(out, signature, sizeof signature);
        png_chunk(out, "IHDR", ihdr, sizeof ihdr);
        png_chunk(out, "IDAT", packed, packed_len);
        png_chunk(out, "IEND", ihdr, 0);
        if (out->failed)
            rc = FL_ENOMEM;
    }
    free(raw);
    free(packed);
    return rc;
}

/* ---- Summary.Value bodies ---- */

static int encode_image(fl_buf *value, const fl_summary *s) {
    fl_buf png = {0}, image = {0};
    int rc = fl_png_encode(&png, s->payload, s->height, s->width, s->channels);
    if (rc == FL_OK) {
        fl_pb_field_varint(&image, IMAGE_HEIGHT, (uint64_t)s->height);
        fl_pb_field_varint(&image, IMAGE_WIDTH, (uint64_t)s->width);
        fl_pb_field_varint(&image, IMAGE_COLORSPACE, (uint64_t)s->channels);
        fl_pb_field_bytes(&image, IMAGE_ENCODED, png.data, png.len);
        fl_pb_field_bytes(value, VALUE_IMAGE, image.data, image.len);
        rc = image.failed ? FL_ENOMEM : FL_OK;
    }
    fl_buf_free(&png);
    fl_buf_free(&image);
    return rc;
}

/* Packed repeated double field. */
static void packed_doubles(fl_buf *b, int field, const double *values, size_t n) {
    fl_pb_field_bytes(b, field, values, n * sizeof *values); /* little-endian, as wire fixed64 */
}

/* The bucket of x: clamped in double before the cast (NaN or +-inf cast to int is undefined). */
static int bucket_of(double x, double lo, double width, int bins) {
    double at = width > 0 ? (x - lo) / width : 0;
    if (!(at >= 0))
        return x > lo ? bins - 1 : 0; /* below the range, or inf/inf */
    return at >= bins ? bins - 1 : (int)at;
}

/* min, max, num, sum, sum of squares, and `bins` equal-width buckets from the finite min to
 * the finite max (NaNs are left out; +-inf land in the end buckets and in min/max; the last
 * bucket's limit is DBL_MAX, as TensorFlow writes it). */
static int encode_histogram(fl_buf *value, const fl_summary *s) {
    const double *x = (const double *)(const void *)s->payload;
    double lo = INFINITY, hi = -INFINITY, finite_lo = INFINITY, finite_hi = -INFINITY;
    double sum = 0, squares = 0;
    size_t num = 0;
    for (size_t i = 0; i < s->count; i++) {
        if (isnan(x[i]))
            continue;
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        if (isfinite(x[i])) {
            finite_lo = x[i] < finite_lo ? x[i] : finite_lo;
            finite_hi = x[i] > finite_hi ? x[i] : finite_hi;
        }
        sum += x[i];
        squares += x[i] * x[i];
        num++;
    }
    if (num == 0)
        lo = hi = 0;
    if (finite_lo > finite_hi)
        finite_lo = finite_hi = 0;
    int bins = s->bins < 1 ? 1 : s->bins;
    double *limits = malloc((size_t)bins * sizeof *limits), *counts = calloc((size_t)bins, sizeof *counts);
    if (limits == NULL || counts == NULL) {
        free(limits);
        free(counts);
        return FL_ENOMEM;
    }
    double width = (finite_hi - finite_lo) / bins;
    if (isinf(width)) /* -1e308 to 1e308: the span overflows, its bins-th part does not */
        width = finite_hi / bins - finite_lo / bins;
    for (int b = 0; b < bins; b++)
        limits[b] = b == bins - 1 ? DBL_MAX : finite_lo + width * (b + 1);
    for (size_t i = 0; i < s->count; i++)
        if (!isnan(x[i]))
            counts[bucket_of(x[i], finite_lo, width, bins)] += 1;
    fl_buf histo = {0};
    fl_pb_field_double(&histo, HISTO_MIN, lo);
    fl_pb_field_double(&histo, HISTO_MAX, hi);
    fl_pb_field_double(&histo, HISTO_NUM, (double)num);
    fl_pb_field_double(&histo, HISTO_SUM, sum);
    fl_pb_field_double(&histo, HISTO_SUM_SQUARES, squares);
    packed_doubles(&histo, HISTO_BUCKET_LIMIT, limits, (size_t)bins);
    packed_doubles(&histo, HISTO_BUCKET, counts, (size_t)bins);
    fl_pb_field_bytes(value, VALUE_HISTO, histo.data, histo.len);
    int rc = histo.failed ? FL_ENOMEM : FL_OK;
    fl_buf_free(&histo);
    free(limits);
    free(counts);
    return rc;
}

/* A text summary's tag is "<tag>/text_summary", as torch's SummaryWriter.add_text and
 * tensorboard's own text_summary write it (tensorboard/plugins/text/summary.py), so a dashboard
 * made for one finds the other's. */
#define TEXT_SUFFIX "/text_summary"

/* The text plugin's form: metadata naming the plugin, and a scalar DT_STRING tensor. */
static int encode_text(fl_buf *value, const fl_summary *s) {
    static const char plugin[] = "text";
    fl_buf name = {0}, metadata = {0}, tensor = {0};
    fl_pb_field_bytes(&name, PLUGIN_NAME, plugin, sizeof plugin - 1);
    fl_pb_field_bytes(&metadata, METADATA_PLUGIN_DATA, name.data, name.len);
    fl_pb_field_varint(&tensor, TENSOR_DTYPE, DT_STRING);
    fl_pb_field_bytes(&tensor, TENSOR_SHAPE, plugin, 0); /* no dims: a scalar */
    fl_pb_field_bytes(&tensor, TENSOR_STRING_VAL, s->payload, s->count);
    fl_pb_field_bytes(value, VALUE_METADATA, metadata.data, metadata.len);
    fl_pb_field_bytes(value, VALUE_TENSOR, tensor.data, tensor.len);
    int rc = name.failed || metadata.failed || tensor.failed ? FL_ENOMEM : FL_OK;
    fl_buf_free(&name);
    fl_buf_free(&metadata);
    fl_buf_free(&tensor);
    return rc;
}

int fl_tfevents_append_summary(fl_buf *out, const fl_summary *s) {
    fl_buf value = {0}, summary = {0}, event = {0};
    char tag[sizeof s->tag + sizeof TEXT_SUFFIX];
    int tag_len = snprintf(tag, sizeof tag, "%.*s%s", (int)strnlen(s->tag, sizeof s->tag), s->tag,
                           s->kind == FL_SUMMARY_TEXT ? TEXT_SUFFIX : "");
    fl_pb_field_bytes(&value, VALUE_TAG, tag, (size_t)tag_len);
    int rc = s->kind == FL_SUMMARY_IMAGE       ? encode_image(&value, s)
             : s->kind == FL_SUMMARY_HISTOGRAM ? encode_histogram(&value, s)
             : s->kind == FL_SUMMARY_TEXT      ? encode_text(&value, s)
                                               : fl_error_set(FL_EINVAL, "unknown summary kind %d", s->kind);
    if (rc == FL_OK) {
        fl_pb_field_bytes(&summary, SUMMARY_VALUE, value.data, value.len);
        fl_pb_field_double(&event, EVENT_WALL_TIME, s->wall_time);
        fl_pb_field_varint(&event, EVENT_STEP, (uint64_t)s->step);
        fl_pb_field_bytes(&event, EVENT_SUMMARY, summary.data, summary.len);
        if (value.failed || summary.failed || event.failed)
            rc = FL_ENOMEM;
        else
            fl_tfrecord_append(out, event.data, event.len);
    }
    fl_buf_free(&value);
    fl_buf_free(&summary);
    fl_buf_free(&event);
    return rc;
}
