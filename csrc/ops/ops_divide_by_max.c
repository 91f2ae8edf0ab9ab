/* ops_divide_by_max.c - fl_divide_by_max(): x / x.max() in two parallel passes (a max
 * reduction, then the division), bit-for-bit what NumPy computes. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "base/fl_error.h"
#include "ops/fl_ops.h"
#include "base/fl_simd.h"

/* The running maximum, kept in the source type so int64 stays exact until the divide. */
typedef union any_value {
    uint8_t UINT8;
    int8_t INT8;
    uint16_t UINT16;
    int16_t INT16;
    uint32_t UINT32;
    int32_t INT32;
    uint64_t UINT64;
    int64_t INT64;
    float FLOAT32;
    double FLOAT64;
} any_value;

typedef struct max_job {
    const void *src;
    void *dst;
    pthread_mutex_t lock; /* protects max, have_max and saw_nan while partial results merge */
    any_value max;
    int have_max;
    int saw_nan;
} max_job;

/* X(enum suffix, C type, output C type) */
#define DIVIDE_TYPES(X)         \
    X(UINT8, uint8_t, double)   \
    X(INT8, int8_t, double)     \
    X(UINT16, uint16_t, double) \
    X(INT16, int16_t, double)   \
    X(UINT32, uint32_t, double) \
    X(INT32, int32_t, double)   \
    X(UINT64, uint64_t, double) \
    X(INT64, int64_t, double)   \
    X(FLOAT32, float, float)    \
    X(FLOAT64, double, double)

/* Max of s[0, n) for floats, in SIMD lanes, setting *saw_nan when a NaN is seen. Compilers
 * vectorize a floating-point max reduction only under -ffinite-math-only, which would also
 * delete the NaN test, so the lanes are spelled out with GCC vector extensions: four
 * independent accumulators hide the compare-and-blend latency. */
#define DEFINE_FLOAT_MAX(T, MASK_T)                                                             \
    typedef T T##_vector __attribute__((vector_size(32)));                                      \
    typedef MASK_T T##_mask __attribute__((vector_size(32)));                                   \
    FL_SIMD_CLONES static T float_max_##T(const T *s, size_t n, int *saw_nan) {                 \
        enum { LANES = 32 / sizeof(T), STEP = 4 * LANES };                                      \
        T m = s[0];                                                                             \
        int nan = 0;                                                                            \
        size_t i = 0;                                                                           \
        if (n >= STEP) {                                                                        \
            T##_vector best[4];                                                                 \
            T##_mask nan_lanes = {0};                                                           \
            for (int k = 0; k < 4; k++)                                                         \
                memcpy(&best[k], s + k * LANES, sizeof best[k]);                                \
            for (; i + STEP <= n; i += STEP) {                                                  \
                for (int k = 0; k < 4; k++) {                                                   \
                    T##_vector v;                                                               \
                    memcpy(&v, s + i + k * LANES, sizeof v);                                    \
                    T##_mask greater = v > best[k];                                             \
                    best[k] =                                                                   \
                        (T##_vector)((greater & (T##_mask)v) | (~greater & (T##_mask)best[k])); \
                    nan_lanes |= v != v;                                                        \
                }                                                                               \
            }                                                                                   \
            for (int k = 0; k < 4; k++)                                                         \
                for (int lane = 0; lane < LANES; lane++) {                                      \
                    m = best[k][lane] > m ? best[k][lane] : m;                                  \
                    nan |= nan_lanes[lane] != 0;                                                \
                }                                                                               \
        }                                                                                       \
        for (; i < n; i++) {                                                                    \
            m = s[i] > m ? s[i] : m;                                                            \
            nan |= s[i] != s[i];                                                                \
        }                                                                                       \
        *saw_nan = nan;                                                                         \
        return m;                                                                               \
    }
DEFINE_FLOAT_MAX(float, int32_t)
DEFINE_FLOAT_MAX(double, int64_t)

#define DEFINE_DIVIDE(NAME, T, OUT_T)                                               \
    FL_SIMD_CLONES static T integer_max_##NAME(const T *restrict s, size_t n) {     \
        T m = s[0];                                                                 \
        for (size_t i = 0; i < n; i++)                                              \
            m = s[i] > m ? s[i] : m;                                                \
        return m;                                                                   \
    }                                                                               \
    static T local_max_##NAME(const T *s, size_t n, int *nan) {                     \
        *nan = 0;                                                                   \
        return _Generic((T)0,                                                       \
            float: (T)float_max_float((const float *)s, n, nan),                    \
            double: (T)float_max_double((const double *)s, n, nan),                 \
            default: integer_max_##NAME(s, n));                                     \
    }                                                                               \
    static void max_##NAME(void *ctx, size_t begin, size_t end) {                   \
        max_job *job = ctx;                                                         \
        int nan;                                                                    \
        T m = local_max_##NAME((const T *)job->src + begin, end - begin, &nan);     \
        pthread_mutex_lock(&job->lock);                                             \
        if (!job->have_max || m > job->max.NAME)                                    \
            job->max.NAME = m;                                                      \
        job->have_max = 1;                                                          \
        job->saw_nan |= nan;                                                        \
        pthread_mutex_unlock(&job->lock);                                           \
    }                                                                               \
    FL_SIMD_CLONES static void divide_##NAME(void *ctx, size_t begin, size_t end) { \
        const max_job *job = ctx; /* no restrict: dst may be src (in place) */      \
        const T *s = (const T *)job->src;                                           \
        OUT_T *d = (OUT_T *)job->dst;                                               \
        const OUT_T m = job->saw_nan ? (OUT_T)NAN : (OUT_T)job->max.NAME;           \
        for (size_t i = begin; i < end; i++)                                        \
            d[i] = (OUT_T)s[i] / m;                                                 \
    }
DIVIDE_TYPES(DEFINE_DIVIDE)

fl_dtype fl_divide_by_max_dtype(fl_dtype src_dtype) {
    return src_dtype == FL_FLOAT32 ? FL_FLOAT32 : FL_FLOAT64;
}

int fl_divide_by_max(fl_exec exec, const void *src, fl_dtype src_dtype, void *dst, size_t count) {
    if (count == 0)
        return fl_error_set(FL_EINVAL, "the max of an empty array is undefined");
    fl_range_fn max_pass, divide_pass;
    switch (src_dtype) {
#define SELECT_DIVIDE(NAME, T, OUT_T) \
    case FL_##NAME:                   \
        max_pass = max_##NAME;        \
        divide_pass = divide_##NAME;  \
        break;
        DIVIDE_TYPES(SELECT_DIVIDE)
#undef SELECT_DIVIDE
    default:
        return fl_error_set(FL_EINVAL, "unknown dtype");
    }
    max_job job = {.src = src, .dst = dst};
    if (pthread_mutex_init(&job.lock, NULL) != 0)
        return FL_ESYS;
    /* grains of roughly 50 us of work each, so a worker's wake-up pays for itself */
    fl_exec_run(exec, count, 1 << 20, max_pass, &job);
    fl_exec_run(exec, count, 1 << 18, divide_pass, &job);
    pthread_mutex_destroy(&job.lock);
    return FL_OK;
}
