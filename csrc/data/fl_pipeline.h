/* fl_pipeline.h - a fixed sequence of fastloop.ops kernels applied to a batch of images with
 * no Python at all: what loader workers run on every batch.
 *
 * Steps: crop (random or center), horizontal flip (with a probability), normalize (to
 * float32, optionally HWC <-> CHW), cast. Random choices for image i are drawn from
 * (seed, step number, ids[i]), where ids are the images' dataset indices: a sample gets the
 * same augmentation whichever worker, batch or thread count handles it. A pipeline is
 * immutable once built, so any number of threads may run it at once.
 */
#ifndef FL_PIPELINE_H
#define FL_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "ops/fl_ops.h"

typedef struct fl_pipeline fl_pipeline;

/* An empty pipeline for images in `layout`. Returns 0 or FL_ENOMEM. */
int fl_pipeline_new(fl_layout layout, fl_pipeline **out);
void fl_pipeline_free(fl_pipeline *p);

/* Appending steps. Return 0, FL_EINVAL (bad parameter; detail says which) or FL_ENOMEM. */
int fl_pipeline_crop(fl_pipeline *p, size_t out_h, size_t out_w, int center);
int fl_pipeline_hflip(fl_pipeline *p, double probability);
int fl_pipeline_normalize(fl_pipeline *p, const float *mean, const float *std, size_t channels,
                          fl_layout out_layout);
int fl_pipeline_cast(fl_pipeline *p, fl_dtype dtype);

/* What the pipeline makes of one image of `in` geometry (in.n ignored) and dtype: the output
 * geometry, dtype and layout, and the scratch bytes fl_pipeline_run() needs per image.
 * Returns 0 or FL_EINVAL when a step cannot apply (a crop larger than the image, a channel
 * count that does not match, an input dtype normalize does not take; detail names the step),
 * or FL_EOVERFLOW when an image's bytes do not fit in a size_t. */
int fl_pipeline_plan(const fl_pipeline *p, fl_images in, fl_dtype in_dtype, fl_images *out,
                     fl_dtype *out_dtype, fl_layout *out_layout, size_t *scratch_per_image);

/* The bytes of one image of `dims` (n ignored) and dtype. Returns 0 or FL_EOVERFLOW. */
int fl_pipeline_image_bytes(fl_images dims, fl_dtype dtype, size_t *bytes);

/* Runs the pipeline on in.n images at src into dst (both C-contiguous; dst sized by plan),
 * using scratch (in.n * scratch_per_image bytes). ids: in.n dataset indices for the random
 * draws (NULL: 0..n-1). Returns 0, FL_EINVAL (as plan) or FL_ENOMEM. */
int fl_pipeline_run(const fl_pipeline *p, fl_exec exec, const void *src, fl_images in,
                    fl_dtype in_dtype, void *dst, void *scratch, uint64_t seed,
                    const int64_t *ids);

/* For a pipeline of horizontal flips only (what is left of an image pipeline when the GPU
 * decodes): whether image `id` comes out mirrored under `seed`, drawn as fl_pipeline_run
 * draws it (an even number of flips cancels out). Returns 0 with *flip, or FL_EINVAL when a
 * step is not a flip (detail names it). NULL pipeline: *flip = 0. */
int fl_pipeline_draw_flip(const fl_pipeline *p, uint64_t seed, int64_t id, int *flip);

/* Number of steps (0 for an empty pipeline, which copies). */
size_t fl_pipeline_steps(const fl_pipeline *p);

#endif
