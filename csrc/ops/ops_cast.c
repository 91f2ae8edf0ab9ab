/* ops_cast.c - fl_cast(): element-wise conversion between every pair of supported dtypes.
 *
 * One loop per (source, destination) pair: CAST_SOURCES lists the sources and CAST_FROM
 * spells out the destinations (the preprocessor cannot nest one X-macro inside itself).
 */
#include <stdint.h>

#include "base/fl_error.h"
#include "ops/fl_ops.h"
#include "base/fl_simd.h"

/* X(enum suffix, C type, is float) for every source type. */
#define CAST_SOURCES(X)    \
    X(UINT8, uint8_t, 0)   \
    X(INT8, int8_t, 0)     \
    X(UINT16, uint16_t, 0) \
    X(INT16, int16_t, 0)   \
    X(UINT32, uint32_t, 0) \
    X(INT32, int32_t, 0)   \
    X(UINT64, uint64_t, 0) \
    X(INT64, int64_t, 0)   \
    X(FLOAT32, float, 1)   \
    X(FLOAT64, double, 1)

/* float -> integer, saturating; NaN -> 0. In double, which holds every float exactly; the
 * bounds round up to a power of two at 32/64 bits, so `>= hi` catches every overflow. */
#define SATURATE(value, DT, LO, HI)       \
    ((value) != (value)        ? (DT)0    \
     : (value) <= (double)(LO) ? (DT)(LO) \
     : (value) >= (double)(HI) ? (DT)(HI) \
                               : (DT)(value))

typedef struct cast_job {
    const void *src;
    void *dst;
} cast_job;

#define DEFINE_CAST_PAIR(SN, ST, S_FLOAT, DN, DT, D_FLOAT, D_LO, D_HI)                 \
    FL_SIMD_CLONES static void cast_##SN##_##DN(void *ctx, size_t begin, size_t end) { \
        const cast_job *job = ctx;                                                     \
        const ST *restrict s = (const ST *)job->src;                                   \
        DT *restrict d = (DT *)job->dst;                                               \
        for (size_t i = begin; i < end; i++) {                                         \
            if (S_FLOAT && !D_FLOAT) {                                                 \
                double v = (double)s[i];                                               \
                d[i] = SATURATE(v, DT, D_LO, D_HI);                                    \
            } else {                                                                   \
                d[i] = (DT)s[i];                                                       \
            }                                                                          \
        }                                                                              \
    }

/* Every destination of one source: (enum suffix, C type, is float, lowest, highest). */
#define CAST_FROM(SN, ST, S_FLOAT)                                             \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, UINT8, uint8_t, 0, 0, UINT8_MAX)         \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, INT8, int8_t, 0, INT8_MIN, INT8_MAX)     \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, UINT16, uint16_t, 0, 0, UINT16_MAX)      \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, INT16, int16_t, 0, INT16_MIN, INT16_MAX) \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, UINT32, uint32_t, 0, 0, UINT32_MAX)      \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, INT32, int32_t, 0, INT32_MIN, INT32_MAX) \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, UINT64, uint64_t, 0, 0, UINT64_MAX)      \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, INT64, int64_t, 0, INT64_MIN, INT64_MAX) \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, FLOAT32, float, 1, 0, 0)                 \
    DEFINE_CAST_PAIR(SN, ST, S_FLOAT, FLOAT64, double, 1, 0, 0)

CAST_SOURCES(CAST_FROM)

#define TABLE_ENTRIES(SN)                                             \
    [FL_UINT8] = cast_##SN##_UINT8, [FL_INT8] = cast_##SN##_INT8,     \
    [FL_UINT16] = cast_##SN##_UINT16, [FL_INT16] = cast_##SN##_INT16, \
    [FL_UINT32] = cast_##SN##_UINT32, [FL_INT32] = cast_##SN##_INT32, \
    [FL_UINT64] = cast_##SN##_UINT64, [FL_INT64] = cast_##SN##_INT64, \
    [FL_FLOAT32] = cast_##SN##_FLOAT32, [FL_FLOAT64] = cast_##SN##_FLOAT64

static const fl_range_fn cast_table[FL_DTYPE_COUNT][FL_DTYPE_COUNT] = {
    [FL_UINT8] = {TABLE_ENTRIES(UINT8)},     [FL_INT8] = {TABLE_ENTRIES(INT8)},
    [FL_UINT16] = {TABLE_ENTRIES(UINT16)},   [FL_INT16] = {TABLE_ENTRIES(INT16)},
    [FL_UINT32] = {TABLE_ENTRIES(UINT32)},   [FL_INT32] = {TABLE_ENTRIES(INT32)},
    [FL_UINT64] = {TABLE_ENTRIES(UINT64)},   [FL_INT64] = {TABLE_ENTRIES(INT64)},
    [FL_FLOAT32] = {TABLE_ENTRIES(FLOAT32)}, [FL_FLOAT64] = {TABLE_ENTRIES(FLOAT64)},
};

int fl_cast(fl_exec exec, const void *src, fl_dtype src_dtype, void *dst, fl_dtype dst_dtype,
            size_t count) {
    if ((unsigned)src_dtype >= FL_DTYPE_COUNT || (unsigned)dst_dtype >= FL_DTYPE_COUNT)
        return fl_error_set(FL_EINVAL, "unknown dtype");
    cast_job job = {src, dst};
    fl_exec_run(exec, count, 256 << 10, cast_table[src_dtype][dst_dtype], &job);
    return FL_OK;
}
