/* fl_image.h - JPEG and PNG decoding to 8-bit RGB through libjpeg-turbo and libpng16.
 *
 * The codecs are libjpeg-turbo (the libjpeg.so.62 ABI) and libpng16: linked into the binary
 * when it was built with FL_JPEG_LINKED / FL_PNG_LINKED (the wheels: setup.py links the static
 * archives of the build machine's -dev packages), else dlopened by path; either way selected
 * by fl_image_load_jpeg/png the first time Python asks for them, so fastloop builds and
 * imports without either. A build without a codec's headers has no such codec (loading it
 * fails with FL_EUNAVAILABLE saying so). Every image becomes RGB as PIL's Image.convert("RGB") makes it
 * (grayscale replicated, CMYK with Adobe polarity, palette expanded, alpha dropped, 16-bit
 * samples reduced as Pillow reads them); EXIF orientation is ignored.
 *
 * A decoder (fl_decoder) holds one thread's codec state and output buffer, reused from image
 * to image: one per thread, never shared. Nothing here blocks; errors are FL_EDECODE (bad or
 * truncated data; the detail has the codec's message), FL_EINVAL (an image over the pixel
 * cap, a bad argument), FL_EUNAVAILABLE (the codec for that format is not loaded) or FL_ENOMEM.
 */
#ifndef FL_IMAGE_H
#define FL_IMAGE_H

#include <stddef.h>
#include <stdint.h>

typedef enum fl_image_format { FL_IMAGE_UNKNOWN = 0, FL_IMAGE_JPEG = 1, FL_IMAGE_PNG = 2 } fl_image_format;

typedef struct fl_image_info {
    size_t width, height;
    fl_image_format format;
} fl_image_info;

/* Selects a codec (once; later calls return 0 at once): the library at `path`, or with
 * path NULL the one linked into this binary. Returns 0; FL_EINVAL when the file does not load
 * or lacks a function; FL_EUNAVAILABLE for NULL when none is linked, or when this binary was
 * built without the codec's headers (detail says which). Thread-safe. */
int fl_image_load_jpeg(const char *path);
int fl_image_load_png(const char *path);

/* "libjpeg-turbo (libjpeg.so.62 ABI) <file>" / "libpng <version> <file>" (a linked one:
 * "libjpeg-turbo <version> (linked into fastloop)" / "libpng <version> (linked into
 * fastloop)"), or NULL when that codec is not loaded. Static storage. */
const char *fl_image_codec(fl_image_format format);

/* The largest width * height decoded (default FL_IMAGE_MAX_PIXELS); bigger images fail with
 * FL_EINVAL before any pixel is decoded. Thread-safe. */
#define FL_IMAGE_MAX_PIXELS ((uint64_t)1 << 27) /* 134M pixels: 16384 x 16384 is refused */
void fl_image_set_max_pixels(uint64_t max_pixels);
uint64_t fl_image_max_pixels(void);

/* The format of encoded bytes from their signature (FL_IMAGE_UNKNOWN if neither). */
fl_image_format fl_image_sniff(const void *data, size_t len);

typedef struct fl_decoder fl_decoder;

/* A decoder for one thread. Returns 0 or FL_ENOMEM. */
int fl_decoder_new(fl_decoder **out);
void fl_decoder_free(fl_decoder *d);

/* A work buffer of at least `bytes` owned by d, kept from image to image (a fresh allocation
 * of this size per image costs the kernel's page clearing each time), valid until the next
 * call. NULL when out of memory. */
uint8_t *fl_decoder_scratch(fl_decoder *d, size_t bytes);

/* Reads the header of `data`: the format and full size. Returns 0, FL_EDECODE (not a JPEG or
 * PNG, a bad header), FL_EINVAL (over the pixel cap) or FL_EUNAVAILABLE. */
int fl_image_probe(fl_decoder *d, const void *data, size_t len, fl_image_info *info);

/* The size of an image of w x h decoded at 1/denom (libjpeg's rounding up). */
static inline size_t fl_image_scaled(size_t size, unsigned denom) {
    return (size + denom - 1) / denom;
}

/* A rectangle [x0, x1) x [y0, y1) of an image, in pixels. */
typedef struct fl_image_rect {
    size_t x0, y0, x1, y1;
} fl_image_rect;

/* What fl_image_decode() decoded: the pixels of `held` (a rectangle of the scaled image,
 * containing the one asked for), RGB, row r at pixels + r * stride. Owned by the decoder,
 * valid until its next decode. */
typedef struct fl_decoded {
    const uint8_t *pixels;
    size_t stride;
    fl_image_rect held;
    size_t width, height; /* the whole scaled image */
} fl_decoded;

/* Decodes `data` scaled by 1/denom (1, 2, 4 or 8; JPEG only, PNG takes 1) and at least the
 * rectangle `want` of the scaled image (NULL: all of it); JPEG skips the rows above it and
 * decodes only the columns around it. Returns 0 with *out, or FL_EDECODE (bad or truncated
 * data), FL_EINVAL (too large an image; a rectangle outside it), FL_EUNAVAILABLE or
 * FL_ENOMEM. */
int fl_image_decode(fl_decoder *d, const void *data, size_t len, unsigned denom,
                    const fl_image_rect *want, fl_decoded *out);

#endif
