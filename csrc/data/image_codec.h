/* image_codec.h - internal to fl_image.c, fl_image_jpeg.c and fl_image_png.c: the entry points
 * of each codec, which fl_image.c calls (what the codecs call back: fl_image_common.h). */
#ifndef FL_IMAGE_CODEC_H
#define FL_IMAGE_CODEC_H

#include "data/fl_image_common.h"

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
