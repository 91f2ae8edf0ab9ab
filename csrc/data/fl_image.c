/* fl_image.c - format sniffing, the decoder's life and dispatch to the JPEG and PNG codecs (the
 * pixel cap and the output buffer they share: fl_image_common.c). */
#include "data/fl_image.h"

#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "data/image_codec.h"

fl_image_format fl_image_sniff(const void *data, size_t len) {
    const unsigned char *b = data;
    if (len >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF)
        return FL_IMAGE_JPEG;
    if (len >= 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0)
        return FL_IMAGE_PNG;
    return FL_IMAGE_UNKNOWN;
}

int fl_image_load_jpeg(const char *path) { return jpeg_codec_load(path); }

int fl_image_load_png(const char *path) { return png_codec_load(path); }

const char *fl_image_codec(fl_image_format format) {
    return format == FL_IMAGE_JPEG ? jpeg_codec_describe()
           : format == FL_IMAGE_PNG ? png_codec_describe() : NULL;
}

int fl_decoder_new(fl_decoder **out) {
    *out = calloc(1, sizeof **out);
    return *out == NULL ? FL_ENOMEM : FL_OK;
}

uint8_t *fl_decoder_scratch(fl_decoder *d, size_t bytes) {
    if (bytes > d->scratch_capacity) {
        free(d->scratch); /* nothing in it is kept: no copy as realloc would make */
        d->scratch = malloc(bytes);
        d->scratch_capacity = d->scratch ? bytes : 0;
    }
    return d->scratch;
}

void fl_decoder_free(fl_decoder *d) {
    if (d == NULL)
        return;
    jpeg_state_free(d->jpeg);
    free(d->buffer);
    free(d->scratch);
    free(d);
}

/* The format of data, or FL_EDECODE / FL_EUNAVAILABLE saying why it cannot be decoded. */
static int usable_format(const void *data, size_t len, fl_image_format *format) {
    const unsigned char *b = data;
    *format = fl_image_sniff(data, len);
    if (*format == FL_IMAGE_UNKNOWN) {
        if (len == 0)
            return fl_error_set(FL_EDECODE, "empty data (0 bytes): not an image");
        return fl_error_set(FL_EDECODE, "not a JPEG or PNG image (%zu bytes starting %02x %02x %02x %02x)",
                            len, b[0], len > 1 ? b[1] : 0, len > 2 ? b[2] : 0, len > 3 ? b[3] : 0);
    }
    if (fl_image_codec(*format) == NULL)
        return fl_error_set(FL_EUNAVAILABLE, "no %s decoder is loaded (fastloop.images.info() says "
                            "what was tried)", *format == FL_IMAGE_JPEG ? "JPEG" : "PNG");
    return FL_OK;
}

int fl_image_probe(fl_decoder *d, const void *data, size_t len, fl_image_info *info) {
    fl_image_format format;
    int rc = usable_format(data, len, &format);
    if (rc != FL_OK)
        return rc;
    rc = format == FL_IMAGE_JPEG ? jpeg_probe(d, data, len, info) : png_probe(data, len, info);
    if (rc == FL_OK)
        rc = image_check_size(info->width, info->height);
    return rc;
}

int fl_image_decode(fl_decoder *d, const void *data, size_t len, unsigned denom,
                    const fl_image_rect *want, fl_decoded *out) {
    fl_image_format format;
    int rc = usable_format(data, len, &format);
    if (rc != FL_OK)
        return rc;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8)
        return fl_error_set(FL_EINVAL, "scale 1/%u: the decoders scale by 1, 1/2, 1/4 or 1/8", denom);
    if (format == FL_IMAGE_PNG && denom != 1)
        return fl_error_set(FL_EINVAL, "PNG images decode at full scale only");
    if (want != NULL && (want->x0 >= want->x1 || want->y0 >= want->y1))
        return fl_error_set(FL_EINVAL, "an empty rectangle to decode");
    return format == FL_IMAGE_JPEG ? jpeg_decode(d, data, len, denom, want, out)
                                   : png_decode(d, data, len, want, out);
}
