/* fl_ops.h - fused preprocessing kernels on contiguous arrays (the core of fastloop.ops).
 *
 * Every kernel reads its input once and writes its output once, runs on an fl_exec (the
 * caller's thread, or split over pool workers), and needs no Python. Arrays are
 * C-contiguous; shapes and dtypes have been checked by the caller except where a return
 * code says otherwise. Results never depend on the thread count: random choices are drawn
 * per sample from (seed, sample index) by fl_rng.
 */
#ifndef FL_OPS_H
#define FL_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "base/fl_dtype.h"
#include "base/fl_pool.h"

/* A batch of n images of h x w pixels with c channels. */
typedef struct fl_images {
    size_t n, h, w, c;
} fl_images;

/* Memory order of an image: interleaved (h, w, c) or planar (c, h, w). */
typedef enum fl_layout { FL_HWC = 0, FL_CHW = 1 } fl_layout;

/* Normalization: dst = (src * scale - mean[ch]) / std[ch] as float32, with scale 1/255 for
 * uint8 input (as torchvision's ToTensor) and 1 for float32/float64 input. `src_layout` and
 * `dst_layout` may differ (HWC -> CHW transposes in the same pass). Returns 0, or FL_EINVAL
 * for another src dtype, c == 0, or a std of 0 (detail names the channel). */
int fl_normalize(fl_exec exec, const void *src, fl_dtype src_dtype, fl_layout src_layout,
                 float *dst, fl_layout dst_layout, fl_images dims, const float *mean,
                 const float *std);

/* Element-wise type conversion of `count` elements, as NumPy's astype() except that
 * float -> integer saturates at the integer's range and maps NaN to 0 (C leaves those
 * undefined). Integer -> integer wraps, as NumPy. Returns 0 or FL_EINVAL (bad dtype). */
int fl_cast(fl_exec exec, const void *src, fl_dtype src_dtype, void *dst, fl_dtype dst_dtype,
            size_t count);

/* Crops every image i of `src` to out_h x out_w at (tops[i], lefts[i]). Elements are
 * `itemsize` bytes. Returns 0, or FL_EINVAL when a crop does not fit its image (detail
 * names the sample). */
int fl_crop(fl_exec exec, const void *src, void *dst, size_t itemsize, fl_layout layout,
            fl_images dims, size_t out_h, size_t out_w, const int64_t *tops, const int64_t *lefts);

/* Fills tops/lefts (n each) with uniform random offsets of an out_h x out_w crop inside an
 * h x w image, drawn per sample from (seed, ids[i]), or (seed, i) when ids is NULL.
 * out_h <= h, out_w <= w. */
void fl_crop_offsets_random(uint64_t seed, const int64_t *ids, size_t n, size_t h, size_t w,
                            size_t out_h, size_t out_w, int64_t *tops, int64_t *lefts);

/* Fills tops/lefts (n each) with the offsets of a centered out_h x out_w crop, rounded as
 * torchvision's center_crop does (int(round(d / 2)), halves rounding to even). */
void fl_crop_offsets_center(size_t n, size_t h, size_t w, size_t out_h, size_t out_w,
                            int64_t *tops, int64_t *lefts);

/* Mirrors image i left-right where flip[i] != 0, else copies it. dst may be src (in place),
 * but must not otherwise overlap it. Never fails. */
void fl_hflip(fl_exec exec, const void *src, void *dst, size_t itemsize, fl_layout layout,
              fl_images dims, const uint8_t *flip);

/* Sets flip[i] = 1 with probability p, drawn per sample from (seed, ids[i]), or (seed, i)
 * when ids is NULL. */
void fl_hflip_draw(uint64_t seed, const int64_t *ids, double p, size_t n, uint8_t *flip);

/* Copies `count` buffers of `nbytes` each, back to back, into dst (a batch). Never fails. */
void fl_stack(fl_exec exec, const void *const *srcs, size_t count, size_t nbytes, void *dst);

/* dst = src / max(src) over `count` elements, as NumPy computes x / x.max(): float32 in
 * gives float32 out, every other dtype gives float64 out; a NaN anywhere makes every output
 * NaN. Returns 0, or FL_EINVAL for count 0 (the max of nothing). */
int fl_divide_by_max(fl_exec exec, const void *src, fl_dtype src_dtype, void *dst, size_t count);

/* The output dtype of fl_divide_by_max() for a given input dtype. */
fl_dtype fl_divide_by_max_dtype(fl_dtype src_dtype);

/* Antialiased bilinear resampling of uint8 images, equal to Pillow's ImagingResample
 * (BILINEAR) and so to torchvision's Resize(antialias=True) on PIL images: separable,
 * horizontal pass then vertical, the filter's support widened by the downscale factor,
 * coefficients in 22-bit fixed point, intermediate rows rounded to uint8.
 *
 * One axis: output pixels [first, first + n) of a resize of the source span [b0, b1) (in
 * source pixels, fractional allowed) to `out_size` pixels, reading source pixels in
 * [0, in_size) only (Pillow's clipping at the image edge). */
typedef struct fl_resample_axis {
    size_t n, ksize;
    int32_t *lo, *count; /* per output pixel: first source pixel and how many */
    int32_t *k;          /* n * ksize fixed-point weights */
} fl_resample_axis;

/* Computes an axis's coefficients. Returns 0, FL_EINVAL (empty span, first + n > out_size, a
 * side over INT32_MAX, weights larger than memory), FL_EOVERFLOW or FL_ENOMEM.
 * fl_resample_axis_free() releases them (also after a failure). */
int fl_resample_axis_init(fl_resample_axis *a, size_t in_size, double b0, double b1,
                          size_t out_size, size_t first, size_t n);
void fl_resample_axis_free(fl_resample_axis *a);

/* The source pixels [lo, hi) an axis reads. */
static inline size_t fl_resample_axis_lo(const fl_resample_axis *a) { return (size_t)a->lo[0]; }
static inline size_t fl_resample_axis_hi(const fl_resample_axis *a) {
    return (size_t)(a->lo[a->n - 1] + a->count[a->n - 1]);
}

/* Resamples into dst (ay->n rows of ax->n pixels of c channels, contiguous) from src, whose
 * row 0 / column 0 are source pixel (y0, x0) of the axes' frame and which holds at least
 * the pixels the axes read; rows `stride` bytes apart. tmp: fl_resample_tmp_bytes() bytes
 * (0, or FL_EOVERFLOW/FL_EINVAL when they overflow or exceed memory). fl_resample never fails. */
int fl_resample_tmp_bytes(const fl_resample_axis *ax, const fl_resample_axis *ay, size_t c, size_t *bytes);
void fl_resample(const fl_resample_axis *ax, const fl_resample_axis *ay, const uint8_t *src,
                 size_t stride, size_t x0, size_t y0, size_t c, uint8_t *tmp, uint8_t *dst);

/* Resizes one h x w x c uint8 image to out_h x out_w with fl_resample. Returns 0, FL_EINVAL
 * (a zero size) or FL_ENOMEM. */
int fl_resize(const uint8_t *src, size_t h, size_t w, size_t c, uint8_t *dst, size_t out_h,
              size_t out_w);

#endif
