/* fl_pipeline_image.c - geometry per image (which source span makes which output window),
 * the choice of decode scale and rectangle, and the resampling into the output. */
#include "data/fl_pipeline_image.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "base/fl_rng.h"
#include "base/fl_size.h"
#include "ops/fl_ops.h"

/* Where one image's output comes from, in full-scale source pixels. */
typedef struct frame {
    double bx0, by0, bx1, by1; /* the span resized to the whole output (full_w x full_h) */
    size_t cx0, cy0, cx1, cy1; /* the pixels it may read (a crop: torchvision crops first) */
    size_t full_w, full_h;     /* the size of the whole resize */
    size_t ox, oy;             /* the output window's origin in it (a centre crop) */
} frame;

int fl_image_geometry_check(const fl_image_geometry *g) {
    size_t pixels, bytes;
    if (g->out_h == 0 || g->out_w == 0)
        return fl_error_set(FL_EINVAL, "the output size must be positive");
    /* a side at most INT32_MAX (PNG's limit) keeps resize_h x a side within 64 bits */
    if (g->out_h > INT32_MAX || g->out_w > INT32_MAX || g->resize_h > INT32_MAX || g->resize_w > INT32_MAX)
        return fl_error_set(FL_EINVAL, "size: an image side is at most %d pixels", INT32_MAX);
    int rc = fl_size_mul(g->out_h, g->out_w, "size (height x width)", &pixels);
    if (rc == FL_OK)
        rc = fl_size_mul(pixels, 3, "size (height x width x 3 channels)", &bytes);
    if (rc != FL_OK)
        return rc;
    if (g->kind == FL_GEOMETRY_RESIZED_CROP) {
        if (!(g->scale[0] > 0 && g->scale[0] <= g->scale[1]) || !(g->ratio[0] > 0 && g->ratio[0] <= g->ratio[1]))
            return fl_error_set(FL_EINVAL, "RandomResizedCrop needs 0 < scale[0] <= scale[1] and "
                                "0 < ratio[0] <= ratio[1]");
        return FL_OK;
    }
    if (g->kind != FL_GEOMETRY_RESIZE || g->resize_h == 0)
        return fl_error_set(FL_EINVAL, "unknown geometry or a zero resize");
    if (g->resize_w != 0 && (g->out_h > g->resize_h || g->out_w > g->resize_w))
        return fl_error_set(FL_EINVAL, "a %zux%zu centre crop does not fit the %zux%zu resize",
                            g->out_h, g->out_w, g->resize_h, g->resize_w);
    return FL_OK;
}

static double uniform(fl_rng *rng, double lo, double hi) { return lo + (hi - lo) * fl_rng_uniform(rng); }

void fl_resized_crop_params(uint64_t seed, int64_t id, size_t h, size_t w, const double scale[2],
                            const double ratio[2], size_t *top, size_t *left, size_t *ch,
                            size_t *cw) {
    fl_rng rng = fl_rng_for_sample(seed, (uint64_t)id);
    double area = (double)h * (double)w, log_lo = log(ratio[0]), log_hi = log(ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * uniform(&rng, scale[0], scale[1]);
        double aspect = exp(uniform(&rng, log_lo, log_hi));
        double cwd = nearbyint(sqrt(target * aspect)), chd = nearbyint(sqrt(target / aspect));
        if (cwd > 0 && cwd <= (double)w && chd > 0 && chd <= (double)h) {
            *cw = (size_t)cwd, *ch = (size_t)chd;
            *top = (size_t)fl_rng_below(&rng, h - *ch + 1);
            *left = (size_t)fl_rng_below(&rng, w - *cw + 1);
            return;
        }
    }
    double in_ratio = (double)w / (double)h; /* the fallback: a centre crop */
    if (in_ratio < ratio[0]) {
        *cw = w;
        *ch = (size_t)nearbyint((double)w / ratio[0]);
    } else if (in_ratio > ratio[1]) {
        *ch = h;
        *cw = (size_t)nearbyint((double)h * ratio[1]);
    } else {
        *cw = w, *ch = h;
    }
    *ch = *ch < 1 ? 1 : *ch > h ? h : *ch;
    *cw = *cw < 1 ? 1 : *cw > w ? w : *cw;
    *top = (h - *ch) / 2;
    *left = (w - *cw) / 2;
}

void fl_resize_size(const fl_image_geometry *g, size_t h, size_t w, size_t *rh, size_t *rw) {
    if (g->resize_w != 0) {
        *rh = g->resize_h, *rw = g->resize_w;
        return;
    }
    size_t shorter = w <= h ? w : h, longer = w <= h ? h : w;
    size_t new_long = (size_t)((double)(g->resize_h * longer) / (double)shorter);
    new_long = new_long < 1 ? 1 : new_long;
    *rw = w <= h ? g->resize_h : new_long;
    *rh = w <= h ? new_long : g->resize_h;
}

/* torchvision's centre-crop offset: int(round((size - out) / 2.0)), halves to even. */
static size_t center_offset(size_t size, size_t out) { return (size_t)nearbyint((double)(size - out) / 2.0); }

static int frame_of(const fl_image_geometry *g, size_t h, size_t w, uint64_t seed, int64_t id, frame *f) {
    if (g->kind == FL_GEOMETRY_RESIZED_CROP) {
        size_t top, left, ch, cw;
        fl_resized_crop_params(seed, id, h, w, g->scale, g->ratio, &top, &left, &ch, &cw);
        *f = (frame){(double)left, (double)top, (double)(left + cw), (double)(top + ch),
                     left, top, left + cw, top + ch, g->out_w, g->out_h, 0, 0};
        return FL_OK;
    }
    size_t rh, rw;
    fl_resize_size(g, h, w, &rh, &rw);
    if (g->out_h > rh || g->out_w > rw)
        return fl_error_set(FL_EINVAL, "a %zux%zu centre crop does not fit the image resized to %zux%zu",
                            g->out_h, g->out_w, rh, rw);
    *f = (frame){0, 0, (double)w, (double)h, 0, 0, w, h, rw, rh,
                 center_offset(rw, g->out_w), center_offset(rh, g->out_h)};
    return FL_OK;
}

/* The largest DCT scale-down (1/8..1/1) that leaves the span at least the output's size. */
static unsigned pick_denom(const frame *f) {
    for (unsigned d = 8; d > 1; d /= 2)
        if ((f->bx1 - f->bx0) / d >= (double)f->full_w && (f->by1 - f->by0) / d >= (double)f->full_h)
            return d;
    return 1;
}

/* The axes of frame f seen at scale 1/d in an image of scaled size sw x sh; *sx0, *sy0: the
 * frame's origin in the scaled image. */
static int axes_of(const fl_image_geometry *g, const frame *f, unsigned d, size_t sw, size_t sh,
                   fl_resample_axis *ax, fl_resample_axis *ay, size_t *sx0, size_t *sy0) {
    size_t x0 = f->cx0 / d, y0 = f->cy0 / d;
    size_t x1 = fl_image_scaled(f->cx1, d), y1 = fl_image_scaled(f->cy1, d);
    x1 = x1 > sw ? sw : x1, y1 = y1 > sh ? sh : y1;
    *sx0 = x0, *sy0 = y0;
    memset(ay, 0, sizeof *ay);
    int rc = fl_resample_axis_init(ax, x1 - x0, f->bx0 / d - (double)x0, f->bx1 / d - (double)x0,
                                   f->full_w, f->ox, g->out_w);
    if (rc == FL_OK)
        rc = fl_resample_axis_init(ay, y1 - y0, f->by0 / d - (double)y0, f->by1 / d - (double)y0,
                                   f->full_h, f->oy, g->out_h);
    return rc;
}

/* Resamples from pixels whose (0, 0) is the frame's source pixel (px, py) of the scaled
 * image, into dst; the scratch is the decoder's when there is one. */
static int resample(fl_decoder *d, const fl_resample_axis *ax, const fl_resample_axis *ay,
                    const uint8_t *pixels, size_t stride, size_t c, uint8_t *dst) {
    size_t bytes;
    int rc = fl_resample_tmp_bytes(ax, ay, c, &bytes);
    if (rc != FL_OK)
        return rc;
    uint8_t *tmp = d != NULL ? fl_decoder_scratch(d, bytes) : malloc(bytes);
    if (tmp == NULL)
        return FL_ENOMEM;
    fl_resample(ax, ay, pixels, stride, fl_resample_axis_lo(ax), fl_resample_axis_lo(ay), c, tmp, dst);
    if (d == NULL)
        free(tmp);
    return FL_OK;
}

int fl_image_transform(fl_decoder *d, const fl_image_geometry *g, const void *data, size_t len,
                       uint64_t seed, int64_t id, uint8_t *dst) {
    fl_image_info info;
    int rc = fl_image_probe(d, data, len, &info);
    frame f = {0};
    if (rc == FL_OK)
        rc = frame_of(g, info.height, info.width, seed, id, &f);
    if (rc != FL_OK)
        return rc;
    unsigned denom = g->dct_scaling && info.format == FL_IMAGE_JPEG ? pick_denom(&f) : 1;
    size_t sw = fl_image_scaled(info.width, denom), sh = fl_image_scaled(info.height, denom);
    fl_resample_axis ax, ay;
    size_t sx0, sy0;
    rc = axes_of(g, &f, denom, sw, sh, &ax, &ay, &sx0, &sy0);
    fl_decoded out;
    if (rc == FL_OK) {
        size_t fx = fl_resample_axis_lo(&ax), fy = fl_resample_axis_lo(&ay); /* frame coords */
        fl_image_rect want = {sx0 + fx, sy0 + fy, sx0 + fl_resample_axis_hi(&ax), sy0 + fl_resample_axis_hi(&ay)};
        rc = fl_image_decode(d, data, len, denom, &want, &out);
        if (rc == FL_OK && (out.width != sw || out.height != sh))
            rc = fl_error_set(FL_EINVAL, "decoded %zux%zu at 1/%u, expected %zux%zu", out.width,
                              out.height, denom, sw, sh);
        if (rc == FL_OK) {
            const uint8_t *at = out.pixels + (want.y0 - out.held.y0) * out.stride + (want.x0 - out.held.x0) * 3;
            rc = resample(d, &ax, &ay, at, out.stride, 3, dst);
        }
    }
    fl_resample_axis_free(&ax);
    fl_resample_axis_free(&ay);
    return rc;
}

int fl_image_gpu_plan(const fl_image_geometry *g, size_t h, size_t w, uint64_t seed, int64_t id,
                      fl_image_rect *rect, fl_resample_axis *ax, fl_resample_axis *ay) {
    frame f = {0};
    memset(ax, 0, sizeof *ax);
    memset(ay, 0, sizeof *ay);
    int rc = frame_of(g, h, w, seed, id, &f);
    size_t sx0, sy0;
    if (rc == FL_OK)
        rc = axes_of(g, &f, 1, w, h, ax, ay, &sx0, &sy0);
    if (rc != FL_OK)
        return rc;
    const int32_t fx = ax->lo[0], fy = ay->lo[0]; /* the first pixel each axis reads */
    *rect = (fl_image_rect){sx0 + (size_t)fx, sy0 + (size_t)fy, sx0 + fl_resample_axis_hi(ax),
                            sy0 + fl_resample_axis_hi(ay)};
    for (size_t i = 0; i < ax->n; i++)
        ax->lo[i] -= fx;
    for (size_t i = 0; i < ay->n; i++)
        ay->lo[i] -= fy;
    return FL_OK;
}

int fl_image_transform_pixels(const fl_image_geometry *g, const uint8_t *src, size_t h, size_t w,
                              size_t c, uint64_t seed, int64_t id, uint8_t *dst) {
    frame f = {0};
    int rc = frame_of(g, h, w, seed, id, &f);
    if (rc != FL_OK)
        return rc;
    fl_resample_axis ax, ay;
    size_t sx0, sy0;
    rc = axes_of(g, &f, 1, w, h, &ax, &ay, &sx0, &sy0);
    if (rc == FL_OK) {
        size_t fx = fl_resample_axis_lo(&ax), fy = fl_resample_axis_lo(&ay);
        rc = resample(NULL, &ax, &ay, src + ((sy0 + fy) * w + sx0 + fx) * c, w * c, c, dst);
    }
    fl_resample_axis_free(&ax);
    fl_resample_axis_free(&ay);
    return rc;
}
