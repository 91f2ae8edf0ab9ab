/* fl_image_png.c - PNG decoding through libpng16, linked in or dlopened.
 *
 * The functions used are reached through pointers filled once by png_codec_load(): from the
 * library linked into this binary (FL_PNG_LINKED: the static libpng16.a and libz.a of the build
 * machine's -dev packages) or from a dlopened file. png.h comes from libpng's -dev package;
 * without it this file only says so (see the end). Reading uses libpng's transformations to
 * reach 8-bit RGB the way Pillow's convert("RGB") does: palette expanded, bit depths below 8
 * scaled up, 16-bit samples reduced to their high byte, except 16-bit grayscale, which
 * Pillow reads as a 32-bit integer image and clips at 255 on conversion; alpha and tRNS
 * dropped, never composited. libpng reports errors through a function that must not return:
 * it keeps the message and longjmps back to the call.
 */
#include <stdio.h>
#include <string.h>

#include "base/fl_error.h"
#include "data/fl_image_common.h" /* the buffer and pixel cap this codec calls */
#include "data/image_codec.h"

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

int png_probe(const void *data, size_t len, fl_image_info *info) {
    const unsigned char *b = data;
    if (len < 33 || memcmp(b + 12, "IHDR", 4) != 0) /* signature, IHDR length, type, 13 bytes, CRC */
        return fl_error_set(FL_EDECODE, "libpng: truncated or bad PNG header (%zu bytes)", len);
    *info = (fl_image_info){be32(b + 16), be32(b + 20), FL_IMAGE_PNG};
    return FL_OK;
}

#if __has_include(<png.h>) && !defined(FL_WITHOUT_CODEC_HEADERS) /* that define: a check of the #else */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdlib.h>

#include <png.h>

#include "base/fl_dl.h"

#define PNG_FUNCTIONS(X)                                                                           \
    X(png_get_libpng_ver)                                                                          \
    X(png_create_read_struct)                                                                      \
    X(png_create_info_struct)                                                                      \
    X(png_destroy_read_struct)                                                                     \
    X(png_set_read_fn)                                                                             \
    X(png_get_io_ptr)                                                                              \
    X(png_get_error_ptr)                                                                           \
    X(png_read_info)                                                                               \
    X(png_get_IHDR)                                                                                \
    X(png_set_palette_to_rgb)                                                                      \
    X(png_set_expand_gray_1_2_4_to_8)                                                              \
    X(png_set_strip_16)                                                                            \
    X(png_set_strip_alpha)                                                                         \
    X(png_set_gray_to_rgb)                                                                         \
    X(png_set_interlace_handling)                                                                  \
    X(png_read_update_info)                                                                        \
    X(png_read_row)

static struct {
    fl_dl_once once; /* the pointers are read only after fl_dl_once_done() */
#define DECLARE(name) __typeof__(&name) name;
    PNG_FUNCTIONS(DECLARE)
#undef DECLARE
    char description[512];
} lib = {.once = FL_DL_ONCE_INIT};

/* Fills lib from the library linked into this binary; FL_EUNAVAILABLE when there is none. */
static int resolve_linked(void) {
#ifdef FL_PNG_LINKED
#define LINK(name) lib.name = name;
    PNG_FUNCTIONS(LINK)
#undef LINK
    snprintf(lib.description, sizeof lib.description, "libpng %s (linked into fastloop)", PNG_LIBPNG_VER_STRING);
    return FL_OK;
#else
    return fl_error_set(FL_EUNAVAILABLE, "no libpng is linked into this build of fastloop (it links the "
                        "static libpng16.a when the build machine has libpng's -dev package)");
#endif
}

/* Fills lib from the file at path; FL_EINVAL when it does not load, lacks a function or is
 * not libpng 1.6. */
static int resolve_file(const char *path) {
#define SYMBOL(name) {(void **)&lib.name, #name},
    const fl_dl_symbol symbols[] = {PNG_FUNCTIONS(SYMBOL)};
#undef SYMBOL
    void *handle =
        fl_dl_open_resolved(path, NULL, symbols, sizeof symbols / sizeof symbols[0], "not libpng 1.6");
    if (handle == NULL)
        return FL_EINVAL;
    const char *version = lib.png_get_libpng_ver(NULL);
    if (version == NULL || strncmp(version, "1.6.", 4) != 0) {
        dlclose(handle);
        return fl_error_set(FL_EINVAL, "%s is libpng %s, not 1.6", path, version ? version : "?");
    }
    snprintf(lib.description, sizeof lib.description, "libpng %s %s", version, fl_dl_base_name(path));
    return FL_OK; /* the handle stays open */
}

static int resolve(const char *path) { return path == NULL ? resolve_linked() : resolve_file(path); }

int png_codec_load(const char *path) { return fl_dl_once_load(&lib.once, resolve, path); }

const char *png_codec_describe(void) {
    return fl_dl_once_done(&lib.once) ? lib.description : NULL;
}

/* ---- decoding ---- */

typedef struct png_call {
    const unsigned char *data;
    size_t len, pos;
    jmp_buf jump;
    char message[256];
} png_call;

static void on_error(png_structp png, png_const_charp message) {
    png_call *call = lib.png_get_error_ptr(png);
    snprintf(call->message, sizeof call->message, "%s", message);
    longjmp(call->jump, 1);
}

static void on_warning(png_structp png, png_const_charp message) { (void)png, (void)message; }

static void on_read(png_structp png, png_bytep dst, size_t n) {
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
        rc = fl_error_set(FL_EDECODE, "libpng: %s", call.message);
    } else {
        lib.png_set_read_fn(png, &call, on_read);
        rc = read_rows(d, png, info, want, out);
    }
    lib.png_destroy_read_struct(&png, &info, NULL);
    return rc;
}

#else /* no png.h at build time: no PNG codec, and every call says why */

int png_codec_load(const char *path) {
    (void)path;
    return fl_error_set(FL_EUNAVAILABLE, "this build of fastloop has no PNG decoder: libpng's headers "
                        "(png.h) were not found when it was built; install its -dev package (libpng-dev, "
                        "libpng-devel, brew install libpng) and reinstall");
}

const char *png_codec_describe(void) { return NULL; }

int png_decode(fl_decoder *d, const void *data, size_t len, const fl_image_rect *want,
               fl_decoded *out) {
    (void)d, (void)data, (void)len, (void)want, (void)out;
    return png_codec_load(NULL);
}

#endif
