/* ops_resize.c - antialiased bilinear resampling of uint8 images, Pillow's ImagingResample
 * (libImaging/Resample.c: precompute_coeffs, normalize_coeffs_8bpc, the two passes)
 * rewritten for a window of output pixels, so a crop of a resize costs only the crop. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "base/fl_simd.h"
#include "base/fl_size.h"
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
    if (in_size > INT32_MAX || out_size > INT32_MAX) /* source positions are int32 */
        return fl_error_set(FL_EINVAL, "resample: a side of more than %d pixels (%zu -> %zu)", INT32_MAX,
                            in_size, out_size);
    double scale = (b1 - b0) / (double)out_size, filterscale = scale < 1 ? 1 : scale;
    double support = filterscale; /* bilinear's support is 1 */
    size_t ksize = (size_t)ceil(support) * 2 + 1, weights;
    int rc = fl_size_mul(n, ksize * sizeof *a->k, "resample: the filter of the output size", &weights);
    if (rc == FL_OK)
        rc = fl_size_fits_memory(weights, "resample: the filter of the output size");
    if (rc != FL_OK)
        return rc;
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

/* Copies an h x w block of c-byte pixels (rows in_stride bytes apart) transposed: out's
 * row x, h * c bytes long, holds column x. In tiles, so both sides stay in cache. 3-byte
 * pixels move as 4-byte words, one load and one store each: the extra byte read is the next
 * one in the block's memory (inside it but on the last row, which moves bytewise), the one
 * written is the first of the pixel below, written after it (rows go in order). */
static void transpose(const uint8_t *in, size_t in_stride, size_t h, size_t w, size_t c, uint8_t *out) {
    enum { TILE = 16 };
    size_t out_stride = h * c;
    for (size_t ty = 0; ty < h; ty += TILE) {
        size_t y_end = ty + TILE < h ? ty + TILE : h;
        for (size_t tx = 0; tx < w; tx += TILE) {
            size_t x_end = tx + TILE < w ? tx + TILE : w;
            for (size_t y = ty; y < y_end; y++) {
                const uint8_t *p = in + y * in_stride + tx * c;
                uint8_t *q = out + tx * out_stride + y * c;
                if (c == 3 && y + 1 < h)
                    for (size_t x = tx; x < x_end; x++, p += 3, q += out_stride) {
                        uint32_t word;
                        memcpy(&word, p, 4);
                        memcpy(q, &word, 4);
                    }
                else
                    for (size_t x = tx; x < x_end; x++, p += c, q += out_stride)
                        for (size_t ch = 0; ch < c; ch++)
                            q[ch] = p[ch];
            }
        }
    }
}

/* out[j] = sum_y rows[y * row_bytes + j] * k[y] for `count` rows, rounded as Pillow rounds:
 * a row at a time into int32 sums (acc, row_bytes of them), so the inner loop vectorizes.
 * Both passes use it: the horizontal one on transposed pixels. */
FL_SIMD_CLONES static void weighted_rows(const int32_t *k, int32_t count, const uint8_t *rows,
                                         size_t row_bytes, int32_t *restrict acc, uint8_t *restrict out) {
    for (size_t j = 0; j < row_bytes; j++)
        acc[j] = 1 << (PRECISION_BITS - 1);
    for (int32_t y = 0; y < count; y++) {
        const uint8_t *restrict row = rows + (size_t)y * row_bytes;
        int32_t w = k[y];
        for (size_t j = 0; j < row_bytes; j++)
            acc[j] += row[j] * w;
    }
    for (size_t j = 0; j < row_bytes; j++)
        out[j] = clip8(acc[j]);
}

/* Where the scratch parts start in tmp: the source window transposed (cols x rows), the
 * horizontal pass still transposed (n x rows), the same back in rows (rows x n), then the
 * int32 sums; `bytes` in all. */
typedef struct scratch_layout {
    size_t narrowed, rowwise, acc, bytes;
} scratch_layout;

static scratch_layout layout_of(const fl_resample_axis *ax, const fl_resample_axis *ay, size_t c) {
    size_t rows = fl_resample_axis_hi(ay) - fl_resample_axis_lo(ay);
    size_t cols = fl_resample_axis_hi(ax) - fl_resample_axis_lo(ax);
    size_t longest = rows > ax->n ? rows : ax->n;
    scratch_layout l;
    l.narrowed = cols * rows * c;
    l.rowwise = l.narrowed + ax->n * rows * c;
    l.acc = l.rowwise + rows * ax->n * c;
    l.acc += -l.acc & (sizeof(int32_t) - 1);
    l.bytes = l.acc + longest * c * sizeof(int32_t);
    return l;
}

/* layout_of's sizes, checked: its largest terms are (cols + 2 n) x rows x c and a row of sums. */
static int checked_tmp_bytes(const fl_resample_axis *ax, const fl_resample_axis *ay, size_t c) {
    const char *what = "resample: the scratch of the output size";
    size_t rows = fl_resample_axis_hi(ay) - fl_resample_axis_lo(ay);
    size_t cols = fl_resample_axis_hi(ax) - fl_resample_axis_lo(ax), across, area, bytes, sums;
    int rc = fl_size_add(cols, 2 * ax->n, what, &across); /* n <= INT32_MAX: 2 n fits */
    if (rc == FL_OK)
        rc = fl_size_mul(across, rows, what, &area);
    if (rc == FL_OK)
        rc = fl_size_mul(area, c, what, &bytes);
    if (rc == FL_OK)
        rc = fl_size_mul((rows > ax->n ? rows : ax->n) + 1, c * sizeof(int32_t), what, &sums);
    if (rc == FL_OK)
        rc = fl_size_add(bytes, sums, what, &bytes);
    return rc == FL_OK ? fl_size_fits_memory(bytes, what) : rc;
}

/* Pillow's two passes (horizontal, then vertical, each rounded to uint8), the horizontal one
 * on the transposed window so that both run as vectorized weighted sums of whole rows. */
void fl_resample(const fl_resample_axis *ax, const fl_resample_axis *ay, const uint8_t *src,
                 size_t stride, size_t x0, size_t y0, size_t c, uint8_t *tmp, uint8_t *dst) {
    size_t first = fl_resample_axis_lo(ay), rows = fl_resample_axis_hi(ay) - first;
    size_t left = fl_resample_axis_lo(ax), cols = fl_resample_axis_hi(ax) - left;
    size_t column_bytes = rows * c, row_bytes = ax->n * c;
    scratch_layout l = layout_of(ax, ay, c);
    uint8_t *across = tmp, *narrowed = tmp + l.narrowed, *rowwise = tmp + l.rowwise;
    int32_t *acc = (int32_t *)(tmp + l.acc);
    transpose(src + (first - y0) * stride + (left - x0) * c, stride, rows, cols, c, across);
    for (size_t i = 0; i < ax->n; i++)
        weighted_rows(ax->k + i * ax->ksize, ax->count[i], across + ((size_t)ax->lo[i] - left) * column_bytes,
                      column_bytes, acc, narrowed + i * column_bytes);
    transpose(narrowed, column_bytes, ax->n, rows, c, rowwise);
    for (size_t i = 0; i < ay->n; i++)
        weighted_rows(ay->k + i * ay->ksize, ay->count[i], rowwise + ((size_t)ay->lo[i] - first) * row_bytes,
                      row_bytes, acc, dst + i * row_bytes);
}

int fl_resample_tmp_bytes(const fl_resample_axis *ax, const fl_resample_axis *ay, size_t c, size_t *bytes) {
    int rc = checked_tmp_bytes(ax, ay, c);
    if (rc == FL_OK)
        *bytes = layout_of(ax, ay, c).bytes;
    return rc;
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
    size_t tmp_bytes = 0;
    if (rc == FL_OK)
        rc = fl_resample_tmp_bytes(&ax, &ay, c, &tmp_bytes);
    uint8_t *tmp = rc == FL_OK ? malloc(tmp_bytes) : NULL;
    if (rc == FL_OK && tmp == NULL)
        rc = FL_ENOMEM;
    if (rc == FL_OK)
        fl_resample(&ax, &ay, src, w * c, 0, 0, c, tmp, dst);
    free(tmp);
    fl_resample_axis_free(&ax);
    fl_resample_axis_free(&ay);
    return rc;
}
