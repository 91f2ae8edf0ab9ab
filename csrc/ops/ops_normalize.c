/* ops_normalize.c - fl_normalize(): scale, subtract mean, divide by std, and optionally
 * transpose HWC <-> CHW, in one read of the input and one write of the output. */
#include <stdlib.h>

#include "base/fl_error.h"
#include "ops/fl_ops.h"
#include "base/fl_simd.h"
#include "ops/ops_normalize_rgb.h"

typedef struct normalize_job {
    const void *src;
    float *dst;
    fl_layout src_layout, dst_layout;
    fl_images dims;
    const float *a; /* per channel: scale / std */
    const float *b; /* per channel: -mean / std */
    int rgb_fast;   /* use fl_normalize_rgb_u8_row() for each row */
} normalize_job;

#define ROW_T uint8_t
#define ROW_NAME(name) name##_u8
#include "ops/ops_normalize_rows.inc"
#undef ROW_T
#undef ROW_NAME

#define ROW_T float
#define ROW_NAME(name) name##_f32
#include "ops/ops_normalize_rows.inc"
#undef ROW_T
#undef ROW_NAME

#define ROW_T double
#define ROW_NAME(name) name##_f64
#include "ops/ops_normalize_rows.inc"
#undef ROW_T
#undef ROW_NAME

/* uint8 RGB HWC -> CHW rows through the hand-vectorized loop. Consecutive rows of one image
 * are contiguous in the source and in each output plane, so each image's share of
 * [begin, end) goes through as one long row. */
static void normalize_rgb_rows(const normalize_job *job, size_t begin, size_t end) {
    const fl_images d = job->dims;
    const size_t plane = d.h * d.w;
    for (size_t row = begin; row < end;) {
        const size_t n = row / d.h, y = row % d.h;
        const size_t rows = (end - row < d.h - y) ? end - row : d.h - y;
        const uint8_t *s = (const uint8_t *)job->src + (n * plane + y * d.w) * 3;
        float *o = job->dst + n * plane * 3 + y * d.w;
        fl_normalize_rgb_u8_row(s, o, o + plane, o + 2 * plane, rows * d.w, job->a, job->b);
        row += rows;
    }
}

static void normalize_range_u8(void *ctx, size_t begin, size_t end) {
    const normalize_job *job = ctx;
    if (job->rgb_fast)
        normalize_rgb_rows(job, begin, end);
    else
        normalize_rows_u8(job, begin, end);
}
static void normalize_range_f32(void *job, size_t begin, size_t end) {
    normalize_rows_f32(job, begin, end);
}
static void normalize_range_f64(void *job, size_t begin, size_t end) {
    normalize_rows_f64(job, begin, end);
}

/* Rows per chunk: about 256K elements (~50 us), enough to pay for waking a worker (tens of
 * microseconds on a virtual machine); one 224x224x3 image is never split. */
static size_t grain_rows(fl_images dims) {
    size_t row_elements = dims.w * dims.c;
    size_t rows = ((256 << 10) + row_elements - 1) / (row_elements ? row_elements : 1);
    return rows ? rows : 1;
}

int fl_normalize(fl_exec exec, const void *src, fl_dtype src_dtype, fl_layout src_layout,
                 float *dst, fl_layout dst_layout, fl_images dims, const float *mean,
                 const float *std) {
    fl_range_fn range;
    float scale = 1.0f;
    switch (src_dtype) {
    case FL_UINT8:
        range = normalize_range_u8;
        scale = 1.0f / 255.0f;
        break;
    case FL_FLOAT32:
        range = normalize_range_f32;
        break;
    case FL_FLOAT64:
        range = normalize_range_f64;
        break;
    default:
        return fl_error_set(FL_EINVAL, "normalize takes uint8, float32 or float64, not %s",
                            fl_dtype_name(src_dtype));
    }
    if (dims.c == 0)
        return fl_error_set(FL_EINVAL, "images have no channels");
    float *coefficients = malloc(2 * dims.c * sizeof *coefficients);
    if (coefficients == NULL)
        return FL_ENOMEM;
    float *a = coefficients, *b = coefficients + dims.c;
    for (size_t ch = 0; ch < dims.c; ch++) {
        if (std[ch] == 0.0f) {
            free(coefficients);
            return fl_error_set(FL_EINVAL, "std[%zu] is 0", ch);
        }
        a[ch] = scale / std[ch];
        b[ch] = -mean[ch] / std[ch];
    }
    int rgb_fast = src_dtype == FL_UINT8 && dims.c == 3 && src_layout == FL_HWC &&
                   dst_layout == FL_CHW && fl_normalize_rgb_u8_available();
    normalize_job job = {src, dst, src_layout, dst_layout, dims, a, b, rgb_fast};
    fl_exec_run(exec, dims.n * dims.h, grain_rows(dims), range, &job);
    free(coefficients);
    return FL_OK;
}
