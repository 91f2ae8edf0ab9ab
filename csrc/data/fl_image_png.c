/* fl_image_png.c - PNG decoding through a dlopened libpng16.
 *
 * libpng's structs are opaque, so the dozen functions used are declared here with their
 * png.h types (no -dev package needed to build). Reading uses libpng's transformations to
 * reach 8-bit RGB the way Pillow's convert("RGB") does: palette expanded, bit depths below 8
 * scaled up, 16-bit samples reduced to their high byte, except 16-bit grayscale, which
 * Pillow reads as a 32-bit integer image and clips at 255 on conversion; alpha and tRNS
 * dropped, never composited. libpng reports errors through a function that must not return:
 * it keeps the message and longjmps back to the call.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_dl.h"
#include "base/fl_error.h"
#include "data/image_codec.h"

typedef void *png_structp;
typedef void *png_infop;
typedef void (*png_error_ptr)(png_structp, const char *);
typedef void (*png_rw_ptr)(png_structp, unsigned char *, size_t);

enum { PNG_COLOR_MASK_PALETTE = 1, PNG_COLOR_MASK_COLOR = 2, PNG_COLOR_MASK_ALPHA = 4 };

#define PNG_FUNCTIONS(X)                                                                           \
    X(png_get_libpng_ver, const char *, (png_structp))                                             \
    X(png_create_read_struct, png_structp, (const char *, void *, png_error_ptr, png_error_ptr))   \
    X(png_create_info_struct, png_infop, (png_structp))                                            \
    X(png_destroy_read_struct, void, (png_structp *, png_infop *, png_infop *))                    \
    X(png_set_read_fn, void, (png_structp, void *, png_rw_ptr))                                    \
    X(png_get_io_ptr, void *, (png_structp))                                                       \
    X(png_get_error_ptr, void *, (png_structp))                                                    \
    X(png_read_info, void, (png_infop, png_infop))                                                 \
    X(png_get_IHDR, uint32_t,                                                                      \
      (png_structp, png_infop, uint32_t *, uint32_t *, int *, int *, int *, int *, int *))         \
    X(png_set_palette_to_rgb, void, (png_structp))                                                 \
    X(png_set_expand_gray_1_2_4_to_8, void, (png_structp))                                         \
    X(png_set_strip_16, void, (png_structp))                                                       \
    X(png_set_strip_alpha, void, (png_structp))                                                    \
    X(png_set_gray_to_rgb, void, (png_structp))                                                    \
    X(png_set_interlace_handling, int, (png_structp))                                              \
    X(png_read_update_info, void, (png_structp, png_infop))                                        \
    X(png_read_row, void, (png_structp, unsigned char *, unsigned char *))

static struct {
    pthread_mutex_t lock; /* guards loading; the pointers are read only after `loaded` */
    atomic_int loaded;
#define DECLARE(name, ret, args) ret(*name) args;
    PNG_FUNCTIONS(DECLARE)
#undef DECLARE
    char description[512];
} lib = {.lock = PTHREAD_MUTEX_INITIALIZER};

int png_codec_load(const char *path) {
    pthread_mutex_lock(&lib.lock);
    int rc = FL_OK;
    if (atomic_load_explicit(&lib.loaded, memory_order_relaxed))
        goto done;
    void *handle = fl_dl_open(path, NULL);
    if (handle == NULL) {
        rc = FL_EINVAL;
        goto done;
    }
#define RESOLVE(name, ret, args)                                                                   \
    if ((*(void **)&lib.name = dlsym(handle, #name)) == NULL) {                                    \
        rc = fl_error_set(FL_EINVAL, "%s has no %s: not libpng 1.6", path, #name);                 \
        dlclose(handle);                                                                           \
        goto done;                                                                                 \
    }
    PNG_FUNCTIONS(RESOLVE)
#undef RESOLVE
    const char *version = lib.png_get_libpng_ver(NULL);
    if (version == NULL || strncmp(version, "1.6.", 4) != 0) {
        rc = fl_error_set(FL_EINVAL, "%s is libpng %s, not 1.6", path, version ? version : "?");
        dlclose(handle);
        goto done;
    }
    snprintf(lib.description, sizeof lib.description, "libpng %s %s", version, fl_dl_base_name(path));
    atomic_store_explicit(&lib.loaded, 1, memory_order_release); /* the handle stays open */
done:
    pthread_mutex_unlock(&lib.lock);
    return rc;
}

const char *png_codec_describe(void) {
    return atomic_load_explicit(&lib.loaded, memory_order_acquire) ? lib.description : NULL;
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

int png_probe(const void *data, size_t len, fl_image_info *info) {
    const unsigned char *b = data;
    if (len < 33 || memcmp(b + 12, "IHDR", 4) != 0) /* signature, IHDR length, type, 13 bytes, CRC */
        return fl_error_set(FL_EINVAL, "libpng: truncated or bad PNG header (%zu bytes)", len);
    *info = (fl_image_info){be32(b + 16), be32(b + 20), FL_IMAGE_PNG};
    return FL_OK;
}

/* ---- decoding ---- */

typedef struct png_call {
    const unsigned char *data;
    size_t len, pos;
    jmp_buf jump;
    char message[256];
} png_call;

static void on_error(png_structp png, const char *message) {
    png_call *call = lib.png_get_error_ptr(png);
    snprintf(call->message, sizeof call->message, "%s", message);
    longjmp(call->jump, 1);
}

static void on_warning(png_structp png, const char *message) { (void)png, (void)message; }

static void on_read(png_structp png, unsigned char *dst, size_t n) {
    png_call *call = lib.png_get_io_ptr(png);
    if (n > call->len - call->pos) {
        snprintf(call->message, sizeof call->message, "truncated PNG data (the file ends before the image does)");
        longjmp(call->jump, 1);
    }
    memcpy(dst, call->data + call->pos, n);
    call->pos += n;
}

/* 16-bit grayscale row (big-endian) -> RGB, clipped at 255 as Pillow converts "I;16". */
static void gray16_row_to_rgb(uint8_t *row, size_t width) {
    for (size_t x = width; x-- > 0;) { /* backwards: 2 bytes in, 3 out, in place */
        unsigned v = (unsigned)row[2 * x] << 8 | row[2 * x + 1];
        uint8_t g = (uint8_t)(v > 255 ? 255 : v);
        row[3 * x] = row[3 * x + 1] = row[3 * x + 2] = g;
    }
}

/* Sets the transformations to 8-bit RGB; returns 1 for 16-bit grayscale (converted by hand). */
static int set_transforms(png_structp png, png_infop info, uint32_t *w, uint32_t *h, int *passes) {
    int depth, color, interlace;
    lib.png_get_IHDR(png, info, w, h, &depth, &color, &interlace, NULL, NULL);
    int gray16 = depth == 16 && color == 0;
    if (color & PNG_COLOR_MASK_PALETTE)
        lib.png_set_palette_to_rgb(png);
    if (!(color & PNG_COLOR_MASK_COLOR) && depth < 8)
        lib.png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16 && !gray16)
        lib.png_set_strip_16(png);
    if (!gray16) {
        lib.png_set_strip_alpha(png);
        if (!(color & PNG_COLOR_MASK_COLOR))
            lib.png_set_gray_to_rgb(png);
    }
    *passes = lib.png_set_interlace_handling(png);
    lib.png_read_update_info(png, info);
    return gray16;
}

/* Reads rows [0, rows) (every pass of an interlaced image) into d->buffer; may longjmp. */
static int read_rows(fl_decoder *d, png_structp png, png_infop info, const fl_image_rect *want,
                     fl_decoded *out) {
    uint32_t w, h;
    int passes;
    lib.png_read_info(png, info);
    int gray16 = set_transforms(png, info, &w, &h, &passes);
    int rc = image_check_size(w, h);
    if (rc != FL_OK)
        return rc;
    fl_image_rect r = want ? *want : (fl_image_rect){0, 0, w, h};
    if (r.x1 > w || r.y1 > h)
        return fl_error_set(FL_EINVAL, "rectangle [%zu, %zu) x [%zu, %zu) outside a %ux%u image",
                            r.x0, r.x1, r.y0, r.y1, w, h);
    size_t stride = (size_t)w * 3, rows = passes > 1 ? h : r.y1; /* interlaced: every row */
    if ((rc = image_buffer(d, stride * rows)) != FL_OK)
        return rc;
    for (int pass = 0; pass < passes; pass++)
        for (size_t y = 0; y < rows; y++)
            lib.png_read_row(png, d->buffer + y * stride, NULL);
    if (gray16)
        for (size_t y = 0; y < rows; y++)
            gray16_row_to_rgb(d->buffer + y * stride, w);
    *out = (fl_decoded){d->buffer, stride, {0, 0, w, r.y1}, w, h};
    return FL_OK;
}

int png_decode(fl_decoder *d, const void *data, size_t len, const fl_image_rect *want,
               fl_decoded *out) {
    png_call call = {.data = data, .len = len};
    png_structp png = lib.png_create_read_struct(lib.png_get_libpng_ver(NULL), &call, on_error, on_warning);
    png_infop info = png ? lib.png_create_info_struct(png) : NULL;
    if (info == NULL) {
        lib.png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        return FL_ENOMEM;
    }
    int rc;
    if (setjmp(call.jump)) {
        rc = fl_error_set(FL_EINVAL, "libpng: %s", call.message);
    } else {
        lib.png_set_read_fn(png, &call, on_read);
        rc = read_rows(d, png, info, want, out);
    }
    lib.png_destroy_read_struct(&png, &info, NULL);
    return rc;
}
