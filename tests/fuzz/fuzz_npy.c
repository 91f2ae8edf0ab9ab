/* fuzz_npy.c - libFuzzer target for fl_npy_parse_header: any input either parses into a header
 * that satisfies every documented invariant, or is refused with FL_EINVAL / FL_EAGAIN and a
 * printable detail. replay_npy.c includes this file to run the corpus without clang. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "data/fl_npy.h"
#include "fuzz_checks.h"

/* product(shape) * itemsize, recomputed independently; 0 on overflow past PTRDIFF_MAX. */
static int expected_data_len(const fl_npy_header *h, size_t *out) {
    size_t total = h->itemsize;
    int empty = 0;
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] == 0) {
            empty = 1;
            continue;
        }
        if (__builtin_mul_overflow(total, (size_t)h->shape[d], &total) ||
            total > (size_t)PTRDIFF_MAX)
            return 0;
    }
    *out = empty ? 0 : total;
    return 1;
}

static void check_header(const fl_npy_header *h, size_t size) {
    INVARIANT(h->major >= 1 && h->major <= 3 && h->minor == 0);
    INVARIANT(h->ndim >= 0 && h->ndim <= FL_NPY_MAX_DIMS);
    INVARIANT(h->itemsize > 0);
    INVARIANT(h->header_len >= 10 && h->header_len <= size);
    INVARIANT(memchr(h->descr, '\0', sizeof h->descr) != NULL && printable(h->descr));
    INVARIANT(h->descr[0] == h->byteorder && strchr("<>|", h->byteorder) != NULL);
    INVARIANT(h->descr[1] == h->kind && h->kind != '\0' && strchr("biufcUSVMm", h->kind));
    INVARIANT(h->fortran_order == 0 || h->fortran_order == 1);
    for (int d = 0; d < h->ndim; d++)
        INVARIANT(h->shape[d] >= 0);
    size_t data_len;
    INVARIANT(expected_data_len(h, &data_len) && data_len == h->data_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fl_npy_header h, again;
    fl_error_clear();
    int rc = fl_npy_parse_header(data, size, &h);
    if (rc != FL_OK) {
        INVARIANT(rc == FL_EINVAL || rc == FL_EAGAIN);
        INVARIANT(fl_error_detail()[0] != '\0' && printable(fl_error_detail()));
        return 0;
    }
    check_header(&h, size);
    /* The header alone parses the same; one byte less asks for more. */
    INVARIANT(fl_npy_parse_header(data, h.header_len, &again) == FL_OK);
    INVARIANT(memcmp(&h, &again, sizeof h) == 0);
    INVARIANT(fl_npy_parse_header(data, h.header_len - 1, &again) == FL_EAGAIN);
    return 0;
}
