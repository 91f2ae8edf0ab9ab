/* image_codec.h - internal to fl_image.c, fl_image_jpeg.c and fl_image_png.c: the decoder's
 * state and the entry points of each codec. */
#ifndef FL_IMAGE_CODEC_H
#define FL_IMAGE_CODEC_H

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

/* The pixel cap's check, with the message every codec gives. */
int image_check_size(size_t width, size_t height);

int jpeg_codec_load(const char *path);
const char *jpeg_codec_describe(void);
void jpeg_state_free(jpeg_state *s);
int jpeg_probe(fl_decoder *d, const void *data, size_t len, fl_image_info *info);
int jpeg_decode(fl_decoder *d, const void *data, size_t len, unsigned denom,
                const fl_image_rect *want, fl_decoded *out);

int png_codec_load(const char *path);
const char *png_codec_describe(void);
int png_probe(const void *data, size_t len, fl_image_info *info);
int png_decode(fl_decoder *d, const void *data, size_t len, const fl_image_rect *want,
               fl_decoded *out);

#endif
