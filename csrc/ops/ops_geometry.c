/* ops_geometry.c - fl_crop() and fl_hflip(): moving pixels without touching their values.
 *
 * Both work on rows: a row is w pixels of one image (HWC) or one channel plane (CHW), so a
 * "pixel" is c elements (HWC) or one element (CHW). Rows are the unit of parallel work.
 */
#include <string.h>

#include "base/fl_error.h"
#include "ops/fl_ops.h"
#include "base/fl_rng.h"

/* Bytes per pixel and pixel rows per image in a layout. */
static size_t pixel_bytes(fl_layout layout, fl_images d, size_t itemsize) {
    return layout == FL_HWC ? d.c * itemsize : itemsize;
}
static size_t rows_per_image(fl_layout layout, fl_images d, size_t height) {
    return layout == FL_HWC ? height : d.c * height;
}

/* ---- crop ---- */

typedef struct crop_job {
    const unsigned char *src;
    unsigned char *dst;
    size_t pixel;              /* bytes per pixel */
    size_t src_rows, dst_rows; /* rows per image */
    size_t h, w, out_h, out_w;
    const int64_t *tops, *lefts;
} crop_job;

static void crop_range(void *ctx, size_t begin, size_t end) {
    const crop_job *job = ctx;
    const size_t src_row = job->w * job->pixel, dst_row = job->out_w * job->pixel;
    for (size_t row = begin; row < end; row++) {
        size_t n = row / job->dst_rows, r = row % job->dst_rows;
        size_t plane = r / job->out_h, y = r % job->out_h; /* plane is 0 for HWC */
        size_t src_y = plane * job->h + (size_t)job->tops[n] + y;
        const unsigned char *s =
            job->src + (n * job->src_rows + src_y) * src_row + (size_t)job->lefts[n] * job->pixel;
        memcpy(job->dst + row * dst_row, s, dst_row);
    }
}

int fl_crop(fl_exec exec, const void *src, void *dst, size_t itemsize, fl_layout layout,
            fl_images dims, size_t out_h, size_t out_w, const int64_t *tops, const int64_t *lefts) {
    for (size_t n = 0; n < dims.n; n++) {
        if (tops[n] < 0 || lefts[n] < 0 || (size_t)tops[n] + out_h > dims.h ||
            (size_t)lefts[n] + out_w > dims.w)
            return fl_error_set(FL_EINVAL,
                                "a %zux%zu crop at (top=%lld, left=%lld) does not fit "
                                "sample %zu, a %zux%zu image",
                                out_h, out_w, (long long)tops[n], (long long)lefts[n], n, dims.h,
                                dims.w);
    }
    crop_job job = {src,
                    dst,
                    pixel_bytes(layout, dims, itemsize),
                    rows_per_image(layout, dims, dims.h),
                    rows_per_image(layout, dims, out_h),
                    dims.h,
                    dims.w,
                    out_h,
                    out_w,
                    tops,
                    lefts};
    size_t grain = (1 << 20) / (out_w * job.pixel + 1) + 1; /* ~1 MiB a chunk */
    fl_exec_run(exec, dims.n * job.dst_rows, grain, crop_range, &job);
    return FL_OK;
}

/* The id a random draw of sample i uses. */
static uint64_t sample_id(const int64_t *ids, size_t i) { return ids ? (uint64_t)ids[i] : i; }

void fl_crop_offsets_random(uint64_t seed, const int64_t *ids, size_t n, size_t h, size_t w,
                            size_t out_h, size_t out_w, int64_t *tops, int64_t *lefts) {
    for (size_t i = 0; i < n; i++) {
        fl_rng rng = fl_rng_for_sample(seed, sample_id(ids, i));
        tops[i] = (int64_t)fl_rng_below(&rng, h - out_h + 1);
        lefts[i] = (int64_t)fl_rng_below(&rng, w - out_w + 1);
    }
}

/* Python's round(d / 2), which rounds halves to even: 2.5 -> 2, 3.5 -> 4. */
static int64_t center_offset(size_t full, size_t part) {
    size_t twice = full - part, half = twice / 2;
    return (int64_t)(twice % 2 == 0 || half % 2 == 0 ? half : half + 1);
}

void fl_crop_offsets_center(size_t n, size_t h, size_t w, size_t out_h, size_t out_w,
                            int64_t *tops, int64_t *lefts) {
    for (size_t i = 0; i < n; i++) {
        tops[i] = center_offset(h, out_h);
        lefts[i] = center_offset(w, out_w);
    }
}

/* ---- hflip ---- */

typedef struct hflip_job {
    const unsigned char *src;
    unsigned char *dst;
    size_t pixel, w, rows_per_image;
    const uint8_t *flip;
} hflip_job;

/* Reverses the pixel order of one row into a separate buffer. Inlined with a constant
 * `pixel` for the common sizes, so each memcpy becomes one or two moves. */
static inline __attribute__((always_inline)) void
reverse_row(unsigned char *restrict d, const unsigned char *restrict s, size_t w, size_t pixel) {
    for (size_t x = 0; x < w; x++)
        memcpy(d + x * pixel, s + (w - 1 - x) * pixel, pixel);
}

static void reverse_row_any(unsigned char *restrict d, const unsigned char *restrict s, size_t w,
                            size_t pixel) {
    switch (pixel) {
    case 1:
        reverse_row(d, s, w, 1);
        break;
    case 2:
        reverse_row(d, s, w, 2);
        break;
    case 3:
        reverse_row(d, s, w, 3);
        break;
    case 4:
        reverse_row(d, s, w, 4);
        break;
    case 8:
        reverse_row(d, s, w, 8);
        break;
    case 12:
        reverse_row(d, s, w, 12);
        break;
    case 16:
        reverse_row(d, s, w, 16);
        break;
    default:
        reverse_row(d, s, w, pixel);
        break;
    }
}

/* Reverses the pixel order of one row where it stands, swapping through a small buffer. */
static void reverse_row_in_place(unsigned char *row, size_t w, size_t pixel) {
    unsigned char spare[64];
    for (size_t x = 0; x < w / 2; x++) {
        unsigned char *a = row + x * pixel, *b = row + (w - 1 - x) * pixel;
        for (size_t done = 0; done < pixel; done += sizeof spare) {
            size_t part = pixel - done < sizeof spare ? pixel - done : sizeof spare;
            memcpy(spare, a + done, part);
            memcpy(a + done, b + done, part);
            memcpy(b + done, spare, part);
        }
    }
}

static void hflip_range(void *ctx, size_t begin, size_t end) {
    const hflip_job *job = ctx;
    const size_t row_bytes = job->w * job->pixel;
    for (size_t row = begin; row < end; row++) {
        const unsigned char *s = job->src + row * row_bytes;
        unsigned char *d = job->dst + row * row_bytes;
        int flip = job->flip[row / job->rows_per_image] != 0;
        if (flip && s == d)
            reverse_row_in_place(d, job->w, job->pixel);
        else if (flip)
            reverse_row_any(d, s, job->w, job->pixel);
        else if (s != d)
            memcpy(d, s, row_bytes);
    }
}

void fl_hflip(fl_exec exec, const void *src, void *dst, size_t itemsize, fl_layout layout,
              fl_images dims, const uint8_t *flip) {
    hflip_job job = {
        src, dst, pixel_bytes(layout, dims, itemsize), dims.w, rows_per_image(layout, dims, dims.h),
        flip};
    size_t grain = (1 << 20) / (dims.w * job.pixel + 1) + 1; /* ~1 MiB a chunk */
    fl_exec_run(exec, dims.n * job.rows_per_image, grain, hflip_range, &job);
}

void fl_hflip_draw(uint64_t seed, const int64_t *ids, double p, size_t n, uint8_t *flip) {
    for (size_t i = 0; i < n; i++) {
        fl_rng rng = fl_rng_for_sample(seed, sample_id(ids, i));
        flip[i] = fl_rng_uniform(&rng) < p;
    }
}
