/* fl_image_common.c - the pixel cap and the decoder's output buffer, which fl_image.c and
 * both codecs use (see fl_image_common.h). */
#include "data/fl_image_common.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "base/fl_error.h"
#include "base/fl_size.h"

static _Atomic uint64_t max_pixels = FL_IMAGE_MAX_PIXELS;

void fl_image_set_max_pixels(uint64_t n) { atomic_store_explicit(&max_pixels, n, memory_order_relaxed); }

uint64_t fl_image_max_pixels(void) { return atomic_load_explicit(&max_pixels, memory_order_relaxed); }

int image_check_size(size_t width, size_t height) {
    if (width == 0 || height == 0)
        return fl_error_set(FL_EDECODE, "the image header says %zux%zu pixels", width, height);
    uint64_t cap = fl_image_max_pixels();
    size_t pixels, bytes; /* header fields: a decode buffer of up to 4 bytes a pixel (CMYK) must fit */
    int rc = fl_size_mul(width, height, "the image header's width x height", &pixels);
    if (rc == FL_OK)
        rc = fl_size_mul(pixels, 4, "the image header's width x height", &bytes);
    if (rc != FL_OK)
        return rc;
    if (pixels > cap)
        return fl_error_set(FL_EINVAL, "the image is %zux%zu (width x height), more than the %llu-pixel cap "
                            "(fastloop.images.set_max_pixels raises it)", width, height,
                            (unsigned long long)cap);
    return FL_OK;
}

int image_buffer(fl_decoder *d, size_t bytes) {
    if (bytes <= d->capacity)
        return FL_OK;
    uint8_t *grown = realloc(d->buffer, bytes);
    if (grown == NULL)
        return FL_ENOMEM;
    d->buffer = grown;
    d->capacity = bytes;
    return FL_OK;
}
