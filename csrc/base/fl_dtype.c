/* fl_dtype.c - sizes and names of the supported element types. */
#include "base/fl_dtype.h"

size_t fl_dtype_size(fl_dtype dtype) {
    switch (dtype) {
#define FL__DTYPE_SIZE(name, ctype, text, kind) \
    case FL_##name:                             \
        return sizeof(ctype);
        FL_DTYPE_MAP(FL__DTYPE_SIZE)
#undef FL__DTYPE_SIZE
    default:
        return 0;
    }
}

const char *fl_dtype_name(fl_dtype dtype) {
    switch (dtype) {
#define FL__DTYPE_NAME(name, ctype, text, kind) \
    case FL_##name:                             \
        return text;
        FL_DTYPE_MAP(FL__DTYPE_NAME)
#undef FL__DTYPE_NAME
    default:
        return "unknown";
    }
}

char fl_dtype_kind(fl_dtype dtype) {
    switch (dtype) {
#define FL__DTYPE_KIND(name, ctype, text, kind) \
    case FL_##name:                             \
        return kind;
        FL_DTYPE_MAP(FL__DTYPE_KIND)
#undef FL__DTYPE_KIND
    default:
        return 0;
    }
}

int fl_dtype_is_float(fl_dtype dtype) { return dtype == FL_FLOAT32 || dtype == FL_FLOAT64; }
