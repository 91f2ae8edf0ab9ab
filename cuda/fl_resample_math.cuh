/* fl_resample_math.cuh - one output pixel of each of fl_gpu_decode's two kernels: the
 * horizontal pass over a decoded rectangle (region-relative: the rectangle's origin inside
 * the decoded buffer, the staged tables' columns relative to it), and the vertical pass that
 * also mirrors, normalizes, lays out and casts. fl_resample's arithmetic (ops_resize.c:
 * Pillow's 22-bit weights, sums from a half, rows rounded to uint8 between the passes), so a
 * resampled image equals the CPU path's given the same decoded pixels. The kernels run these
 * once per pixel; the tests' host build runs them over every pixel (fl_gpu_math.cuh). */
#ifndef FL_RESAMPLE_MATH_CUH
#define FL_RESAMPLE_MATH_CUH

#include "fl_gpu_math.cuh"

enum { FL_GPU_PRECISION_BITS = 22 }; /* fl_resample's fixed point */

/* What the kernels know of one image. */
typedef struct fl_gpu_image_desc {
    const uint8_t *src;    /* the decoded RGB rectangle (or whole image), or the CPU's pixels */
    long long pitch;       /* bytes per src row */
    int x0, y0;            /* the rectangle's origin inside src (0, 0 for a region decode) */
    int rows;              /* rectangle rows the first pass makes */
    int resample;          /* 1: two passes from src; 0: src holds the finished out_h x out_w x 3 */
    int flip, taps_x, taps_y;
    int index;             /* the image's place in the batch */
    const int32_t *tables; /* lo_x count_x k_x lo_y count_y k_y (fl_gpu_stage.h) */
    uint8_t *tmp;          /* rows x out_w x 3: the first pass's output */
} fl_gpu_image_desc;

typedef struct fl_gpu_resample_params {
    const fl_gpu_image_desc *descs;
    int out_h, out_w, dst_chw;
    float a[3], b[3];
    void *dst;
    int dtype; /* fl_cuda_out_dtype */
} fl_gpu_resample_params;

/* One axis of the staged tables: per output pixel the first source pixel, how many, weights. */
typedef struct fl_gpu_axis {
    const int32_t *lo, *count, *k;
    int taps;
} fl_gpu_axis;

/* The horizontal table (out_w columns) and, after it, the vertical one (out_h rows). */
FL_GPU_FN fl_gpu_axis fl_gpu_axis_x(const fl_gpu_image_desc *d, int out_w) {
    fl_gpu_axis a = {d->tables, d->tables + out_w, d->tables + 2 * out_w, d->taps_x};
    return a;
}

FL_GPU_FN fl_gpu_axis fl_gpu_axis_y(const fl_gpu_image_desc *d, int out_h, int out_w) {
    const int32_t *lo = d->tables + (long long)out_w * (2 + d->taps_x);
    fl_gpu_axis a = {lo, lo + out_h, lo + 2 * out_h, d->taps_y};
    return a;
}

/* ops_resize.c's clip8: the sum's integer part, clamped to uint8. */
FL_GPU_FN uint8_t fl_gpu_clip8(int32_t v) {
    v >>= FL_GPU_PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Output pixel o of axis a from the 3-byte pixels at `first`, `stride` bytes apart, into out. */
FL_GPU_FN void fl_gpu_taps(const fl_gpu_axis *a, int o, const uint8_t *first, int stride, uint8_t out[3]) {
    const int32_t *w = a->k + (long long)o * a->taps;
    int32_t acc[3] = {1 << (FL_GPU_PRECISION_BITS - 1), 1 << (FL_GPU_PRECISION_BITS - 1),
                      1 << (FL_GPU_PRECISION_BITS - 1)};
    for (int t = 0; t < a->count[o]; t++)
        for (int ch = 0; ch < 3; ch++)
            acc[ch] += first[(long long)t * stride + ch] * w[t];
    for (int ch = 0; ch < 3; ch++)
        out[ch] = fl_gpu_clip8(acc[ch]);
}

/* Pass 1, item i of rows x out_w: rectangle row i / out_w resampled to column i % out_w. */
FL_GPU_FN void fl_gpu_horizontal_pixel(const fl_gpu_image_desc *d, int out_w, long long i) {
    const fl_gpu_axis ax = fl_gpu_axis_x(d, out_w);
    const int y = (int)(i / out_w), x = (int)(i % out_w);
    const uint8_t *row = d->src + (d->y0 + y) * d->pitch + (d->x0 + (long long)ax.lo[x]) * 3;
    fl_gpu_taps(&ax, x, row, 3, d->tmp + i * 3);
}

/* Pass 2, pixel i of out_h x out_w: the column resampled down (or the CPU's pixel read),
 * mirrored, normalized, laid out and cast into the batch. */
FL_GPU_FN void fl_gpu_vertical_pixel(const fl_gpu_resample_params *p, const fl_gpu_image_desc *d, long long i) {
    const long long plane = (long long)p->out_h * p->out_w;
    const int y = (int)(i / p->out_w), x = (int)(i % p->out_w), sx = (int)fl_gpu_flip_x(d->flip, x, p->out_w);
    uint8_t v[3];
    if (d->resample) {
        const fl_gpu_axis ay = fl_gpu_axis_y(d, p->out_h, p->out_w);
        fl_gpu_taps(&ay, y, d->tmp + ((long long)ay.lo[y] * p->out_w + sx) * 3, p->out_w * 3, v);
    } else {
        const uint8_t *px = d->src + ((long long)y * p->out_w + sx) * 3;
        v[0] = px[0], v[1] = px[1], v[2] = px[2];
    }
    for (int ch = 0; ch < 3; ch++)
        fl_gpu_store(p->dst, p->dtype, d->index * 3 * plane + fl_gpu_index(p->dst_chw, ch, i, plane, 3),
                     fl_gpu_normalize(v[ch], p->a[ch], p->b[ch]));
}

#endif
