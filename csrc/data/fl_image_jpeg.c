/* fl_image_jpeg.c - JPEG decoding through libjpeg-turbo (the libjpeg.so.62 ABI), linked in or
 * dlopened.
 *
 * The library's functions are reached through pointers filled once by jpeg_codec_load(): from
 * the library linked into this binary (FL_JPEG_LINKED: the static libjpeg.a of the build
 * machine's libjpeg-turbo -dev package) or from a dlopened file. jpeglib.h comes from that
 * -dev package; without it this file only says so (see the end). Errors: libjpeg calls
 * error_exit, which must not return, so it keeps the library's message and longjmps back to
 * the call (the method libjpeg's example.c documents); the decompressor is then reset with
 * jpeg_abort_decompress and reused. A source that runs out of bytes is an error
 * ("truncated"), as Pillow treats it, rather than libjpeg's grey fill.
 */
#include <stdio.h> /* jpeglib.h needs FILE and size_t declared first */

#include "base/fl_error.h"
#include "data/fl_image_common.h" /* the buffer and pixel cap this codec calls */
#include "data/image_codec.h"

#if __has_include(<jpeglib.h>) && !defined(FL_WITHOUT_CODEC_HEADERS) /* that define: a check of the #else */
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "base/fl_dl.h"

#define JPEG_FUNCTIONS(X)                                                                          \
    X(jpeg_std_error)                                                                              \
    X(jpeg_CreateDecompress)                                                                       \
    X(jpeg_destroy_decompress)                                                                     \
    X(jpeg_read_header)                                                                            \
    X(jpeg_start_decompress)                                                                       \
    X(jpeg_read_scanlines)                                                                         \
    X(jpeg_abort_decompress)                                                                       \
    X(jpeg_crop_scanline)                                                                          \
    X(jpeg_skip_scanlines)                                                                         \
    X(jpeg_resync_to_restart)

static struct {
    fl_dl_once once; /* the pointers are read only after fl_dl_once_done() */
#define DECLARE(name) __typeof__(&name) name;
    JPEG_FUNCTIONS(DECLARE)
#undef DECLARE
    char description[512];
} lib = {.once = FL_DL_ONCE_INIT};

/* One thread's decompressor, its error handler and source. */
struct jpeg_state {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr err;
    struct jpeg_source_mgr src;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

#define STRINGIFY(x) #x
#define VERSION_STRING(x) STRINGIFY(x)

/* Fills lib from the library linked into this binary; FL_EUNAVAILABLE when there is none. */
static int resolve_linked(void) {
#ifdef FL_JPEG_LINKED
#define LINK(name) lib.name = name;
    JPEG_FUNCTIONS(LINK)
#undef LINK
    snprintf(lib.description, sizeof lib.description, "libjpeg-turbo %s (linked into fastloop)",
             VERSION_STRING(LIBJPEG_TURBO_VERSION));
    return FL_OK;
#else
    return fl_error_set(FL_EUNAVAILABLE, "no libjpeg-turbo is linked into this build of fastloop "
                        "(it links the static libjpeg.a when the build machine has libjpeg-turbo's -dev package)");
#endif
}

/* Fills lib from the file at path; FL_EINVAL when it does not load or lacks a function. */
static int resolve_file(const char *path) {
#define SYMBOL(name) {(void **)&lib.name, #name},
    const fl_dl_symbol symbols[] = {JPEG_FUNCTIONS(SYMBOL)};
#undef SYMBOL
    if (fl_dl_open_resolved(path, NULL, symbols, sizeof symbols / sizeof symbols[0],
                            "not libjpeg-turbo with the libjpeg.so.62 ABI") == NULL)
        return FL_EINVAL;
    snprintf(lib.description, sizeof lib.description, "libjpeg-turbo (libjpeg.so.62 ABI) %s",
             fl_dl_base_name(path));
    return FL_OK; /* the handle stays open */
}

static int resolve(const char *path) { return path == NULL ? resolve_linked() : resolve_file(path); }

int jpeg_codec_load(const char *path) { return fl_dl_once_load(&lib.once, resolve, path); }

const char *jpeg_codec_describe(void) {
    return fl_dl_once_done(&lib.once) ? lib.description : NULL;
}

/* ---- error handling and the in-memory source ---- */

static void error_exit(j_common_ptr cinfo) {
    jpeg_state *s = (jpeg_state *)cinfo->client_data;
    (*cinfo->err->format_message)(cinfo, s->message);
    longjmp(s->jump, 1);
}

static void output_message(j_common_ptr cinfo) { (void)cinfo; } /* warnings: never printed */

static void source_init(j_decompress_ptr cinfo) { (void)cinfo; }

static boolean source_fill(j_decompress_ptr cinfo) {
    jpeg_state *s = (jpeg_state *)cinfo->client_data;
    snprintf(s->message, sizeof s->message, "truncated JPEG data (the file ends before the image does)");
    longjmp(s->jump, 1);
}

static void source_skip(j_decompress_ptr cinfo, long count) {
    struct jpeg_source_mgr *src = cinfo->src;
    if (count <= 0)
        return;
    if ((size_t)count > src->bytes_in_buffer)
        source_fill(cinfo);
    src->next_input_byte += count;
    src->bytes_in_buffer -= (size_t)count;
}

static void source_term(j_decompress_ptr cinfo) { (void)cinfo; }

static int state_get(fl_decoder *d, jpeg_state **out) {
    if (d->jpeg == NULL) {
        jpeg_state *volatile s = calloc(1, sizeof *s);
        if (s == NULL)
            return FL_ENOMEM;
        s->cinfo.err = lib.jpeg_std_error(&s->err);
        s->err.error_exit = error_exit;
        s->err.output_message = output_message;
        s->cinfo.client_data = s;
        if (setjmp(s->jump)) {
            fl_error_set(FL_EINVAL, "libjpeg: %s", s->message);
            free(s);
            return FL_EINVAL;
        }
        lib.jpeg_CreateDecompress(&s->cinfo, JPEG_LIB_VERSION, sizeof s->cinfo);
        s->src = (struct jpeg_source_mgr){.init_source = source_init,
                                          .fill_input_buffer = source_fill,
                                          .skip_input_data = source_skip,
                                          .resync_to_restart = lib.jpeg_resync_to_restart,
                                          .term_source = source_term};
        s->cinfo.src = &s->src;
        d->jpeg = s;
    }
    *out = d->jpeg;
    return FL_OK;
}

void jpeg_state_free(jpeg_state *s) {
    if (s == NULL)
        return;
    if (!setjmp(s->jump))
        lib.jpeg_destroy_decompress(&s->cinfo);
    free(s);
}

static void source_set(jpeg_state *s, const void *data, size_t len) {
    s->src.next_input_byte = data;
    s->src.bytes_in_buffer = len;
}

/* ---- decoding ---- */

/* A step run with libjpeg's errors caught (see run_caught). */
typedef int (*jpeg_step)(fl_decoder *d, jpeg_state *s, void *arg);

/* Runs step on data with libjpeg's errors caught. Every libjpeg call may longjmp to the
 * setjmp armed here, so it must be in a frame that outlives them all: the step runs inside
 * it. A libjpeg error is the data's (FL_EDECODE, libjpeg's message). */
static int run_caught(fl_decoder *d, const void *data, size_t len, jpeg_step step, void *arg) {
    jpeg_state *s;
    int rc = state_get(d, &s);
    if (rc != FL_OK)
        return rc;
    if (setjmp(s->jump)) {
        lib.jpeg_abort_decompress(&s->cinfo);
        return fl_error_set(FL_EDECODE, "libjpeg: %s", s->message);
    }
    source_set(s, data, len);
    rc = step(d, s, arg);
    lib.jpeg_abort_decompress(&s->cinfo); /* also when rows below the rectangle were not read */
    return rc;
}

static int read_info(fl_decoder *d, jpeg_state *s, void *info) {
    (void)d;
    lib.jpeg_read_header(&s->cinfo, TRUE);
    *(fl_image_info *)info = (fl_image_info){s->cinfo.image_width, s->cinfo.image_height, FL_IMAGE_JPEG};
    return FL_OK;
}

int jpeg_probe(fl_decoder *d, const void *data, size_t len, fl_image_info *info) {
    return run_caught(d, data, len, read_info, info);
}

/* Pillow's CMYK -> RGB (Convert.c cmyk2rgb) on the inverted samples Pillow reads from an
 * Adobe CMYK JPEG ("CMYK;I"): 4 bytes in, 3 out, in place along the row. */
static void cmyk_row_to_rgb(uint8_t *row, size_t width) {
    for (size_t x = 0; x < width; x++) {
        const uint8_t *in = row + 4 * x;
        int nk = in[3]; /* 255 - (255 - raw k) */
        uint8_t rgb[3];
        for (int c = 0; c < 3; c++) {
            int tmp = (255 - in[c]) * nk + 128;
            int v = nk - (((tmp >> 8) + tmp) >> 8);
            rgb[c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
        memcpy(row + 3 * x, rgb, 3);
    }
}

/* The decode proper; every libjpeg call may longjmp to run_caught's setjmp. */
static int decode_rows(fl_decoder *d, jpeg_state *s, unsigned denom, const fl_image_rect *want,
                       fl_decoded *out) {
    struct jpeg_decompress_struct *c = &s->cinfo;
    lib.jpeg_read_header(c, TRUE);
    int rc = image_check_size(c->image_width, c->image_height);
    if (rc != FL_OK)
        return rc;
    int cmyk = c->jpeg_color_space == JCS_CMYK || c->jpeg_color_space == JCS_YCCK;
    c->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    c->scale_num = 1;
    c->scale_denom = denom;
    lib.jpeg_start_decompress(c);
    size_t width = c->output_width, height = c->output_height;
    fl_image_rect r = want ? *want : (fl_image_rect){0, 0, width, height};
    if (r.x1 > width || r.y1 > height)
        return fl_error_set(FL_EINVAL, "rectangle [%zu, %zu) x [%zu, %zu) outside a %zux%zu image",
                            r.x0, r.x1, r.y0, r.y1, width, height);
    /* A cropped scanline's edge column is upsampled from replicated chroma, not its
     * neighbour's: a 2-pixel margin keeps it out of the rectangle. Progressive images smooth
     * blocks from their neighbours' coefficients, which a crop cuts off: a margin of one
     * iMCU (16 pixels at most) there. */
    size_t margin = c->progressive_mode ? 16 : 2, left = r.x0 > margin ? r.x0 - margin : 0;
    size_t right = r.x1 + margin < width ? r.x1 + margin : width;
    JDIMENSION x0 = (JDIMENSION)left, cols = (JDIMENSION)(right - left);
    if (cols < width) /* widens to whole iMCUs: x0 moves left, cols grows */
        lib.jpeg_crop_scanline(c, &x0, &cols);
    size_t comps = (size_t)c->output_components, stride = (size_t)cols * comps;
    if ((rc = image_buffer(d, stride * (r.y1 - r.y0))) != FL_OK)
        return rc;
    if (r.y0 > 0)
        lib.jpeg_skip_scanlines(c, (JDIMENSION)r.y0);
    for (size_t y = r.y0; y < r.y1; y++) {
        JSAMPROW row = d->buffer + (y - r.y0) * stride;
        lib.jpeg_read_scanlines(c, &row, 1);
        if (cmyk)
            cmyk_row_to_rgb(row, cols);
    }
    *out = (fl_decoded){d->buffer, stride, {x0, r.y0, x0 + cols, r.y1}, width, height};
    return FL_OK;
}

typedef struct decode_request {
    unsigned denom;
    const fl_image_rect *want;
    fl_decoded *out;
} decode_request;

static int decode_step(fl_decoder *d, jpeg_state *s, void *arg) {
    const decode_request *r = arg;
    return decode_rows(d, s, r->denom, r->want, r->out);
}

int jpeg_decode(fl_decoder *d, const void *data, size_t len, unsigned denom,
                const fl_image_rect *want, fl_decoded *out) {
    decode_request request = {denom, want, out};
    return run_caught(d, data, len, decode_step, &request);
}

#else /* no jpeglib.h at build time: no JPEG codec, and every call says why */

int jpeg_codec_load(const char *path) {
    (void)path;
    return fl_error_set(FL_EUNAVAILABLE, "this build of fastloop has no JPEG decoder: libjpeg-turbo's "
                        "headers (jpeglib.h) were not found when it was built; install its -dev package "
                        "(libjpeg62-turbo-dev, libjpeg-turbo-devel, brew install jpeg-turbo) and reinstall");
}

const char *jpeg_codec_describe(void) { return NULL; }

void jpeg_state_free(jpeg_state *s) { (void)s; }

int jpeg_probe(fl_decoder *d, const void *data, size_t len, fl_image_info *info) {
    (void)d, (void)data, (void)len, (void)info;
    return jpeg_codec_load(NULL);
}

int jpeg_decode(fl_decoder *d, const void *data, size_t len, unsigned denom,
                const fl_image_rect *want, fl_decoded *out) {
    (void)d, (void)data, (void)len, (void)denom, (void)want, (void)out;
    return jpeg_codec_load(NULL);
}

#endif
