/* fl_pipeline.c - planning and running a pipeline of ops kernels over a batch. Each step
 * reads the current buffer and writes the next: scratch halves in turn, the last step dst. */
#include "data/fl_pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "base/fl_rng.h"
#include "base/fl_size.h"

enum { MAX_STEPS = 16 };

typedef enum step_kind { STEP_CROP, STEP_HFLIP, STEP_NORMALIZE, STEP_CAST } step_kind;

typedef struct step {
    step_kind kind;
    size_t out_h, out_w;     /* crop */
    int center;              /* crop */
    double probability;      /* hflip */
    float *mean, *std;       /* normalize, `channels` each */
    size_t channels;
    fl_layout out_layout;    /* normalize */
    fl_dtype dtype;          /* cast */
} step;

struct fl_pipeline {
    fl_layout layout;
    step steps[MAX_STEPS];
    size_t n;
};

/* The state of a batch between steps. */
typedef struct stage {
    fl_images dims;
    fl_dtype dtype;
    fl_layout layout;
} stage;

int fl_pipeline_new(fl_layout layout, fl_pipeline **out) {
    *out = calloc(1, sizeof **out);
    if (*out == NULL)
        return FL_ENOMEM;
    (*out)->layout = layout;
    return FL_OK;
}

void fl_pipeline_free(fl_pipeline *p) {
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->n; i++) {
        free(p->steps[i].mean);
        free(p->steps[i].std);
    }
    free(p);
}

size_t fl_pipeline_steps(const fl_pipeline *p) { return p->n; }

static step *append(fl_pipeline *p, step_kind kind) {
    if (p->n == MAX_STEPS) {
        fl_error_set(FL_EINVAL, "a pipeline holds at most %d steps", MAX_STEPS);
        return NULL;
    }
    step *s = &p->steps[p->n++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    return s;
}

int fl_pipeline_crop(fl_pipeline *p, size_t out_h, size_t out_w, int center) {
    if (out_h == 0 || out_w == 0)
        return fl_error_set(FL_EINVAL, "crop size must be positive");
    step *s = append(p, STEP_CROP);
    if (s == NULL)
        return FL_EINVAL;
    s->out_h = out_h;
    s->out_w = out_w;
    s->center = center;
    return FL_OK;
}

int fl_pipeline_hflip(fl_pipeline *p, double probability) {
    if (!(probability >= 0 && probability <= 1))
        return fl_error_set(FL_EINVAL, "flip probability must be in [0, 1]");
    step *s = append(p, STEP_HFLIP);
    if (s == NULL)
        return FL_EINVAL;
    s->probability = probability;
    return FL_OK;
}

int fl_pipeline_normalize(fl_pipeline *p, const float *mean, const float *std, size_t channels,
                          fl_layout out_layout) {
    for (size_t c = 0; c < channels; c++)
        if (std[c] == 0)
            return fl_error_set(FL_EINVAL, "std[%zu] is 0", c);
    step *s = append(p, STEP_NORMALIZE);
    if (s == NULL)
        return FL_EINVAL;
    s->mean = malloc(channels * sizeof *s->mean);
    s->std = malloc(channels * sizeof *s->std);
    if (s->mean == NULL || s->std == NULL) {
        p->n--; /* forget the half-made step; its pointers are freed here */
        free(s->mean);
        free(s->std);
        return FL_ENOMEM;
    }
    memcpy(s->mean, mean, channels * sizeof *mean);
    memcpy(s->std, std, channels * sizeof *std);
    s->channels = channels;
    s->out_layout = out_layout;
    return FL_OK;
}

int fl_pipeline_cast(fl_pipeline *p, fl_dtype dtype) {
    step *s = append(p, STEP_CAST);
    if (s == NULL)
        return FL_EINVAL;
    s->dtype = dtype;
    return FL_OK;
}

int fl_pipeline_image_bytes(fl_images dims, fl_dtype dtype, size_t *bytes) {
    size_t pixels, values;
    const char *what = "an image of this shape (height x width x channels x item size)";
    int rc = fl_size_mul(dims.h, dims.w, what, &pixels);
    if (rc == FL_OK)
        rc = fl_size_mul(pixels, dims.c, what, &values);
    if (rc == FL_OK)
        rc = fl_size_mul(values, fl_dtype_size(dtype), what, bytes);
    return rc;
}

/* The stage after step i, or FL_EINVAL when it cannot apply to `st`. */
static int advance(const step *s, size_t i, stage *st) {
    switch (s->kind) {
    case STEP_CROP:
        if (s->out_h > st->dims.h || s->out_w > st->dims.w)
            return fl_error_set(FL_EINVAL, "step %zu: a %zux%zu crop does not fit %zux%zu images",
                                i, s->out_h, s->out_w, st->dims.h, st->dims.w);
        st->dims.h = s->out_h;
        st->dims.w = s->out_w;
        return FL_OK;
    case STEP_HFLIP:
        return FL_OK;
    case STEP_NORMALIZE:
        if (st->dtype != FL_UINT8 && st->dtype != FL_FLOAT32 && st->dtype != FL_FLOAT64)
            return fl_error_set(FL_EINVAL, "step %zu: normalize takes uint8/float32/float64, not %s",
                                i, fl_dtype_name(st->dtype));
        if (s->channels != st->dims.c)
            return fl_error_set(FL_EINVAL, "step %zu: normalize has %zu channels, images have %zu",
                                i, s->channels, st->dims.c);
        st->dtype = FL_FLOAT32;
        st->layout = s->out_layout;
        return FL_OK;
    case STEP_CAST:
        st->dtype = s->dtype;
        return FL_OK;
    }
    return FL_EINVAL;
}

int fl_pipeline_plan(const fl_pipeline *p, fl_images in, fl_dtype in_dtype, fl_images *out,
                     fl_dtype *out_dtype, fl_layout *out_layout, size_t *scratch_per_image) {
    stage st = {in, in_dtype, p->layout};
    st.dims.n = 1;
    size_t largest = 0, bytes;
    int rc = fl_pipeline_image_bytes(st.dims, st.dtype, &bytes);
    for (size_t i = 0; i < p->n && rc == FL_OK; i++) {
        rc = advance(&p->steps[i], i, &st);
        if (rc == FL_OK)
            rc = fl_pipeline_image_bytes(st.dims, st.dtype, &bytes); /* a cast may grow it */
        if (rc == FL_OK && i + 1 < p->n && bytes > largest)
            largest = bytes; /* intermediate results live in scratch */
    }
    if (rc == FL_OK) /* two halves, written in turn */
        rc = fl_size_mul(2, largest, "the pipeline's scratch (two images of the input shape, after each step)", scratch_per_image);
    if (rc != FL_OK)
        return rc;
    *out = st.dims;
    *out_dtype = st.dtype;
    *out_layout = st.layout;
    return FL_OK;
}

/* The seed of step i's draws: independent per step. */
static uint64_t step_seed_of(uint64_t seed, size_t i) { return seed ^ (0xD1B54A32D192ED03ULL * (i + 1)); }

int fl_pipeline_draw_flip(const fl_pipeline *p, uint64_t seed, int64_t id, int *flip) {
    *flip = 0;
    for (size_t i = 0; p != NULL && i < p->n; i++) {
        if (p->steps[i].kind != STEP_HFLIP)
            return fl_error_set(FL_EINVAL, "step %zu is not a flip: only flips may follow a decode on the GPU", i);
        uint8_t mirrored;
        fl_hflip_draw(step_seed_of(seed, i), &id, p->steps[i].probability, 1, &mirrored);
        *flip ^= mirrored != 0;
    }
    return FL_OK;
}

/* Runs step i from `cur` (in stage st) into `next`. */
static int run_step(const step *s, size_t i, fl_exec exec, const void *cur, stage st, void *next,
                    uint64_t seed, const int64_t *ids) {
    const size_t n = st.dims.n, itemsize = fl_dtype_size(st.dtype);
    uint64_t step_seed = step_seed_of(seed, i);
    int rc = FL_OK;
    switch (s->kind) {
    case STEP_CROP: {
        int64_t *offsets = malloc(2 * (n ? n : 1) * sizeof *offsets);
        if (offsets == NULL)
            return FL_ENOMEM;
        if (s->center) {
            fl_crop_offsets_center(n, st.dims.h, st.dims.w, s->out_h, s->out_w, offsets, offsets + n);
        } else {
            fl_crop_offsets_random(step_seed, ids, n, st.dims.h, st.dims.w, s->out_h, s->out_w,
                                   offsets, offsets + n);
        }
        rc = fl_crop(exec, cur, next, itemsize, st.layout, st.dims, s->out_h, s->out_w, offsets,
                     offsets + n);
        free(offsets);
        return rc;
    }
    case STEP_HFLIP: {
        uint8_t *flip = malloc(n ? n : 1);
        if (flip == NULL)
            return FL_ENOMEM;
        fl_hflip_draw(step_seed, ids, s->probability, n, flip);
        fl_hflip(exec, cur, next, itemsize, st.layout, st.dims, flip);
        free(flip);
        return FL_OK;
    }
    case STEP_NORMALIZE:
        return fl_normalize(exec, cur, st.dtype, st.layout, next, s->out_layout, st.dims, s->mean,
                            s->std);
    case STEP_CAST:
        return fl_cast(exec, cur, st.dtype, next, s->dtype, n * st.dims.h * st.dims.w * st.dims.c);
    }
    return FL_EINVAL;
}

int fl_pipeline_run(const fl_pipeline *p, fl_exec exec, const void *src, fl_images in,
                    fl_dtype in_dtype, void *dst, void *scratch, uint64_t seed,
                    const int64_t *ids) {
    stage st = {in, in_dtype, p->layout};
    if (p->n == 0) {
        size_t one, all;
        int rc = fl_pipeline_image_bytes(in, in_dtype, &one);
        if (rc == FL_OK && (rc = fl_size_mul(in.n, one, "the batch's bytes", &all)) == FL_OK)
            memcpy(dst, src, all);
        return rc;
    }
    fl_images one = in;
    fl_dtype out_dtype;
    fl_layout out_layout;
    size_t scratch_per_image;
    fl_images out_dims;
    int rc = fl_pipeline_plan(p, one, in_dtype, &out_dims, &out_dtype, &out_layout, &scratch_per_image);
    if (rc != FL_OK)
        return rc;
    unsigned char *halves[2] = {scratch, (unsigned char *)scratch + in.n * scratch_per_image / 2};
    const void *cur = src;
    for (size_t i = 0; i < p->n && rc == FL_OK; i++) {
        void *next = i + 1 == p->n ? dst : halves[i % 2];
        rc = run_step(&p->steps[i], i, exec, cur, st, next, seed, ids);
        advance(&p->steps[i], i, &st);
        cur = next;
    }
    return rc;
}
