/* ops_resize.c - antialiased bilinear resampling of uint8 images, Pillow's ImagingResample
 * (libImaging/Resample.c: precompute_coeffs, normalize_coeffs_8bpc, the two passes)
 * rewritten for a window of output pixels, so a crop of a resize costs only the crop. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "ops/fl_ops.h"

enum { PRECISION_BITS = 32 - 8 - 2 }; /* Pillow's: room for 8-bit samples times weights */

static double bilinear(double x) {
    x = x < 0 ? -x : x;
    return x < 1 ? 1 - x : 0;
}

void fl_resample_axis_free(fl_resample_axis *a) {
    free(a->lo);
    free(a->count);
    free(a->k);
    memset(a, 0, sizeof *a);
}

int fl_resample_axis_init(fl_resample_axis *a, size_t in_size, double b0, double b1,
                          size_t out_size, size_t first, size_t n) {
    memset(a, 0, sizeof *a);
    if (!(b1 > b0) || out_size == 0 || n == 0 || first + n > out_size || in_size == 0)
        return fl_error_set(FL_EINVAL, "resample: empty span or window outside the output");
    double scale = (b1 - b0) / (double)out_size, filterscale = scale < 1 ? 1 : scale;
    double support = filterscale; /* bilinear's support is 1 */
    size_t ksize = (size_t)ceil(support) * 2 + 1;
    double *pre = malloc(ksize * sizeof *pre);
    a->lo = malloc(n * sizeof *a->lo);
    a->count = malloc(n * sizeof *a->count);
    a->k = calloc(n * ksize, sizeof *a->k);
    if (!pre || !a->lo || !a->count || !a->k) {
        free(pre);
        fl_resample_axis_free(a);
        return FL_ENOMEM;
    }
    a->n = n;
    a->ksize = ksize;
    for (size_t i = 0; i < n; i++) {
        double center = b0 + ((double)(first + i) + 0.5) * scale, ww = 0, ss = 1 / filterscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        xmin = xmin < 0 ? 0 : xmin;
        xmax = xmax > (int)in_size ? (int)in_size : xmax;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            pre[x] = bilinear((x + xmin - center + 0.5) * ss);
            ww += pre[x];
        }
        for (int x = 0; x < xmax; x++) {
            double w = ww != 0 ? pre[x] / ww : pre[x];
            a->k[i * ksize + (size_t)x] = (int32_t)(w < 0 ? -0.5 + w * (1 << PRECISION_BITS)
                                                          : 0.5 + w * (1 << PRECISION_BITS));
        }
        a->lo[i] = xmin;
        a->count[i] = xmax;
    }
    free(pre);
    return FL_OK;
}

static inline uint8_t clip8(int32_t v) {
    v >>= PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One row: out[i] = sum_k in[lo[i] + k] * w[i][k], per channel; RGB with its three sums in
 * one pass over the taps. */
static void horizontal_row(const fl_resample_axis *ax, const uint8_t *in, size_t x0, size_t c,
                           uint8_t *out) {
    for (size_t i = 0; i < ax->n; i++) {
        const int32_t *k = ax->k + i * ax->ksize;
        const uint8_t *p = in + ((size_t)ax->lo[i] - x0) * c;
        int32_t count = ax->count[i];
        if (c == 3) {
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int32_t x = 0; x < count; x++, p += 3) {
                s0 += p[0] * k[x];
                s1 += p[1] * k[x];
                s2 += p[2] * k[x];
            }
            out[i * 3] = clip8(s0), out[i * 3 + 1] = clip8(s1), out[i * 3 + 2] = clip8(s2);
            continue;
        }
        for (size_t ch = 0; ch < c; ch++) {
            int32_t ss = 1 << (PRECISION_BITS - 1);
            for (int32_t x = 0; x < count; x++)
                ss += p[(size_t)x * c + ch] * k[x];
            out[i * c + ch] = clip8(ss);
        }
    }
}

/* One output row from `count` rows of tmp starting at `rows`, `row_bytes` apart: a row at a
 * time into int32 sums (acc, row_bytes of them), so the inner loop vectorizes. */
static void vertical_row(const int32_t *k, int32_t count, const uint8_t *rows, size_t row_bytes,
                         int32_t *acc, uint8_t *out) {
    for (size_t j = 0; j < row_bytes; j++)
        acc[j] = 1 << (PRECISION_BITS - 1);
    for (int32_t y = 0; y < count; y++) {
        const uint8_t *row = rows + (size_t)y * row_bytes;
        int32_t w = k[y];
        for (size_t j = 0; j < row_bytes; j++)
            acc[j] += row[j] * w;
    }
    for (size_t j = 0; j < row_bytes; j++)
        out[j] = clip8(acc[j]);
}

void fl_resample(const fl_resample_axis *ax, const fl_resample_axis *ay, const uint8_t *src,
                 size_t stride, size_t x0, size_t y0, size_t c, uint8_t *tmp, uint8_t *dst) {
    size_t first = fl_resample_axis_lo(ay), last = fl_resample_axis_hi(ay);
    size_t row_bytes = ax->n * c;
    for (size_t y = first; y < last; y++)
        horizontal_row(ax, src + (y - y0) * stride, x0, c, tmp + (y - first) * row_bytes);
    int32_t *acc = (int32_t *)(tmp + (last - first) * row_bytes + (-(last - first) * row_bytes & 3));
    for (size_t i = 0; i < ay->n; i++)
        vertical_row(ay->k + i * ay->ksize, ay->count[i], tmp + ((size_t)ay->lo[i] - first) * row_bytes,
                     row_bytes, acc, dst + i * row_bytes);
}

size_t fl_resample_tmp_bytes(const fl_resample_axis *ax, const fl_resample_axis *ay, size_t c) {
    size_t rows = fl_resample_axis_hi(ay) - fl_resample_axis_lo(ay);
    return rows * ax->n * c + 3 + ax->n * c * sizeof(int32_t);
}

int fl_resize(const uint8_t *src, size_t h, size_t w, size_t c, uint8_t *dst, size_t out_h,
              size_t out_w) {
    if (h == 0 || w == 0 || c == 0 || out_h == 0 || out_w == 0)
        return fl_error_set(FL_EINVAL, "resize: sizes must be positive (%zux%zu -> %zux%zu)", h,
                            w, out_h, out_w);
    fl_resample_axis ax, ay;
    int rc = fl_resample_axis_init(&ax, w, 0, (double)w, out_w, 0, out_w);
    if (rc == FL_OK)
        rc = fl_resample_axis_init(&ay, h, 0, (double)h, out_h, 0, out_h);
    else
        memset(&ay, 0, sizeof ay);
    uint8_t *tmp = rc == FL_OK ? malloc(fl_resample_tmp_bytes(&ax, &ay, c)) : NULL;
    if (rc == FL_OK && tmp == NULL)
        rc = FL_ENOMEM;
    if (rc == FL_OK)
        fl_resample(&ax, &ay, src, w * c, 0, 0, c, tmp, dst);
    free(tmp);
    fl_resample_axis_free(&ax);
    fl_resample_axis_free(&ay);
    return rc;
}
