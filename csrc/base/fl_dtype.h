/* fl_dtype.h - the element types the kernels understand, and their C types. */
#ifndef FL_DTYPE_H
#define FL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/* X(enum suffix, C type, NumPy name, NumPy kind) for every supported element type. */
#define FL_DTYPE_MAP(X)                \
    X(UINT8, uint8_t, "uint8", 'u')    \
    X(INT8, int8_t, "int8", 'i')       \
    X(UINT16, uint16_t, "uint16", 'u') \
    X(INT16, int16_t, "int16", 'i')    \
    X(UINT32, uint32_t, "uint32", 'u') \
    X(INT32, int32_t, "int32", 'i')    \
    X(UINT64, uint64_t, "uint64", 'u') \
    X(INT64, int64_t, "int64", 'i')    \
    X(FLOAT32, float, "float32", 'f')  \
    X(FLOAT64, double, "float64", 'f')

/* X-macro expansions inside enums confuse clang-format. */
/* clang-format off */
typedef enum fl_dtype {
#define FL__DTYPE_ENUM(name, ctype, text, kind) FL_##name,
    FL_DTYPE_MAP(FL__DTYPE_ENUM)
#undef FL__DTYPE_ENUM
    FL_DTYPE_COUNT
} fl_dtype;
/* clang-format on */

/* Bytes per element, or 0 for a value outside the enum. */
size_t fl_dtype_size(fl_dtype dtype);

/* NumPy's name for the type ("float32"), or "unknown". */
const char *fl_dtype_name(fl_dtype dtype);

/* NumPy's kind letter: 'u' unsigned, 'i' signed integer, 'f' float; 0 if unknown. */
char fl_dtype_kind(fl_dtype dtype);

/* 1 for FLOAT32 and FLOAT64, else 0. */
int fl_dtype_is_float(fl_dtype dtype);

#endif
