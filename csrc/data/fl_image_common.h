/* fl_image_common.h - internal to the image code: the decoder's state and the helpers that
 * fl_image.c and both codecs (fl_image_jpeg.c, fl_image_png.c) call. They live apart from
 * fl_image.c, which calls the codecs, so no call goes from a codec back into its caller. */
#ifndef FL_IMAGE_COMMON_H
#define FL_IMAGE_COMMON_H

#include "data/fl_image.h"

typedef struct jpeg_state jpeg_state;

struct fl_decoder {
    jpeg_state *jpeg; /* created on the first JPEG */
    uint8_t *buffer;  /* the decoded rows, grown as needed */
    size_t capacity;
    uint8_t *scratch; /* fl_decoder_scratch's, grown as needed */
    size_t scratch_capacity;
};

/* A buffer of at least `bytes` in d->buffer. Returns 0 or FL_ENOMEM. */
int image_buffer(fl_decoder *d, size_t bytes);

/* The pixel cap's check (fl_image_max_pixels), with the message every codec gives. */
int image_check_size(size_t width, size_t height);

#endif
