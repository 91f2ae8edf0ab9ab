/* fl_pipeline_image.h - the fused per-image path of an image pipeline: decode (only the
 * rows and columns needed, at a DCT-reduced scale where the output allows) -> crop ->
 * resize, straight into a uint8 RGB output, with nothing bigger than one image held.
 *
 * Two geometries, as torchvision's transforms define them: RandomResizedCrop (a crop of
 * random area and aspect ratio, drawn from (seed, sample index) with torchvision's rule:
 * ten tries, then the centre-crop fallback; resized to out_h x out_w) and Resize (shorter
 * side, or exact) followed by a centre crop to out_h x out_w (no crop when equal). The
 * resampling is fl_resample (Pillow's antialiased bilinear). A geometry is plain data:
 * any number of threads may use one at once; each thread brings its own fl_decoder.
 */
#ifndef FL_PIPELINE_IMAGE_H
#define FL_PIPELINE_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "data/fl_image.h"
#include "ops/fl_ops.h"

typedef enum fl_geometry_kind { FL_GEOMETRY_RESIZED_CROP = 1, FL_GEOMETRY_RESIZE = 2 } fl_geometry_kind;

typedef struct fl_image_geometry {
    fl_geometry_kind kind;
    size_t out_h, out_w;       /* the output image */
    double scale[2], ratio[2]; /* resized crop: area fraction and aspect ratio ranges */
    size_t resize_h, resize_w; /* resize: exact size, or resize_w == 0: shorter side resize_h */
    int dct_scaling;           /* JPEG may decode at 1/2..1/8 when the output needs no more */
} fl_image_geometry;

/* Checks a geometry's parameters (sides at most INT32_MAX, the output's bytes within a size).
 * Returns 0, FL_EINVAL or FL_EOVERFLOW (detail says which). */
int fl_image_geometry_check(const fl_image_geometry *g);

/* torchvision's RandomResizedCrop.get_params for an h x w image, drawn from (seed, id):
 * the crop's top, left, height, width. Never fails. */
void fl_resized_crop_params(uint64_t seed, int64_t id, size_t h, size_t w, const double scale[2],
                            const double ratio[2], size_t *top, size_t *left, size_t *ch,
                            size_t *cw);

/* The size Resize gives an h x w image (torchvision's rounding). */
void fl_resize_size(const fl_image_geometry *g, size_t h, size_t w, size_t *rh, size_t *rw);

/* Decodes the encoded image `data` and writes its out_h x out_w x 3 uint8 result to dst.
 * Returns 0, or the decoder's errors (FL_EINVAL, FL_EUNAVAILABLE, FL_ENOMEM), or FL_EINVAL
 * when the centre crop is larger than the resized image. */
int fl_image_transform(fl_decoder *d, const fl_image_geometry *g, const void *data, size_t len,
                       uint64_t seed, int64_t id, uint8_t *dst);

/* What a GPU decoder needs to make image `id` of h x w pixels as fl_image_transform does
 * at full scale (no DCT scaling): the rectangle of source pixels to decode (exactly those
 * the resampling reads) and the two axes of fl_resample over it, their lo[] made relative
 * to the rectangle's origin. Returns 0 (the caller frees both axes with
 * fl_resample_axis_free, also on failure), FL_EINVAL (a centre crop larger than the
 * resized image) or FL_ENOMEM. */
int fl_image_gpu_plan(const fl_image_geometry *g, size_t h, size_t w, uint64_t seed, int64_t id,
                      fl_image_rect *rect, fl_resample_axis *ax, fl_resample_axis *ay);

/* The same for an h x w x c uint8 image already decoded (c of any count). */
int fl_image_transform_pixels(const fl_image_geometry *g, const uint8_t *src, size_t h, size_t w,
                              size_t c, uint64_t seed, int64_t id, uint8_t *dst);

#endif
