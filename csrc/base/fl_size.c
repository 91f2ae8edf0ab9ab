/* fl_size.c - checked size arithmetic (fl_size.h). */
#include "base/fl_size.h"

#include <unistd.h>

#include "base/fl_error.h"

static int too_large(const char *what, size_t a, const char *op, size_t b) {
    return fl_error_set(FL_EOVERFLOW, "%s is too large: %zu %s %zu is more than %zu", what, a, op, b,
                        FL_SIZE_MAX);
}

int fl_size_mul(size_t a, size_t b, const char *what, size_t *out) {
    size_t product = 0;
    if (__builtin_mul_overflow(a, b, &product) || product > FL_SIZE_MAX)
        return too_large(what, a, "x", b);
    *out = product;
    return FL_OK;
}

int fl_size_add(size_t a, size_t b, const char *what, size_t *out) {
    size_t sum = 0;
    if (__builtin_add_overflow(a, b, &sum) || sum > FL_SIZE_MAX)
        return too_large(what, a, "+", b);
    *out = sum;
    return FL_OK;
}

int fl_size_align(size_t a, size_t align, const char *what, size_t *out) {
    size_t padded = 0;
    int rc = fl_size_add(a, align - 1, what, &padded);
    if (rc == FL_OK)
        *out = padded / align * align;
    return rc;
}

int fl_size_fits_memory(size_t bytes, const char *what) {
    if (bytes <= ((size_t)1 << 30)) /* every machine this runs on has a GiB: no system call */
        return FL_OK;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t memory;
    if (pages <= 0 || page <= 0 || __builtin_mul_overflow((size_t)pages, (size_t)page, &memory))
        return FL_OK; /* unknown: leave it to the allocator */
    if (bytes <= memory)
        return FL_OK;
    return fl_error_set(FL_EINVAL, "%s needs %zu bytes, more than this machine's %zu bytes of memory", what,
                        bytes, memory);
}
