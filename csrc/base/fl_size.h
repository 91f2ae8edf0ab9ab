/* fl_size.h - checked arithmetic for every size computed from user input: batch size x
 * sample bytes, workers x prefetch, slots x stride, width x height x channels, header fields
 * (as NumPy's npy_mul_sizes_with_overflow). A wrapped size is a heap overflow, not an error:
 * compute such sizes here, never with a bare `*` or `+`.
 *
 * A size is valid up to FL_SIZE_MAX (PTRDIFF_MAX: the most bytes one object may span, what
 * malloc and NumPy allow). Each call returns 0, or an error with a detail that names `what`
 * (the user's argument: "batch_size x sample bytes"); *out is left unchanged on failure.
 * Pure functions (but for the thread-local detail); never block, never allocate.
 */
#ifndef FL_SIZE_H
#define FL_SIZE_H

#include <stddef.h>
#include <stdint.h>

#define FL_SIZE_MAX ((size_t)PTRDIFF_MAX)

/* *out = a * b, a + b, or a rounded up to a multiple of `align` (> 0). Return 0 or
 * FL_EOVERFLOW (past FL_SIZE_MAX). */
int fl_size_mul(size_t a, size_t b, const char *what, size_t *out);
int fl_size_add(size_t a, size_t b, const char *what, size_t *out);
int fl_size_align(size_t a, size_t align, const char *what, size_t *out);

/* Returns 0 when `bytes` fit in this machine's physical memory, else FL_EINVAL naming `what`:
 * buffers that must all be resident (batch slots) and could only fail or thrash. */
int fl_size_fits_memory(size_t bytes, const char *what);

#endif
