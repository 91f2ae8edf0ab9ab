/* test_image.c - the image decoders and the fused geometry, on the fuzz corpus's real JPEG and
 * PNG files: sizes, rectangles and scales agree with the full decode, bad and truncated data
 * is refused with a message, threads decode at once with their own decoders. Needs the codecs
 * (FASTLOOP_LIBJPEG / FASTLOOP_LIBPNG, else the system's); skips, saying so, without them. */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "check.h"
#include "data/fl_image.h"
#include "data/fl_pipeline_image.h"
#include "ops/fl_ops.h"

enum { MAX_FILES = 64 };

typedef struct blob {
    unsigned char *data;
    size_t len;
} blob;

static blob files[MAX_FILES];
static int n_files;

static void load_corpus(const char *dir_path) {
    DIR *dir = opendir(dir_path);
    if (dir == NULL)
        return;
    for (struct dirent *e; (e = readdir(dir)) != NULL && n_files < MAX_FILES;) {
        char path[4096];
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name);
        FILE *f = fopen(path, "rb");
        if (f == NULL)
            continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        blob *b = &files[n_files];
        b->data = malloc((size_t)len + 1);
        b->len = fread(b->data, 1, (size_t)len, f);
        fclose(f);
        n_files++;
    }
    closedir(dir);
}

/* A copy of a full decode's pixels (the decoder's buffer is reused by the next call). */
static uint8_t *full_copy(const fl_decoded *o) {
    uint8_t *copy = malloc(o->width * o->height * 3);
    for (size_t y = 0; y < o->height; y++)
        memcpy(copy + y * o->width * 3, o->pixels + y * o->stride, o->width * 3);
    return copy;
}

static void test_every_file_decodes_to_its_header_size_or_is_refused(void) {
    fl_decoder *d;
    CHECK(fl_decoder_new(&d) == FL_OK);
    int decoded = 0;
    for (int i = 0; i < n_files; i++) {
        fl_image_info info;
        fl_decoded out;
        int rc = fl_image_probe(d, files[i].data, files[i].len, &info);
        if (rc == FL_OK)
            rc = fl_image_decode(d, files[i].data, files[i].len, 1, NULL, &out);
        if (rc != FL_OK) { /* the truncated seeds */
            CHECK(rc == FL_EDECODE && strstr(fl_error_detail(), "truncated") != NULL);
            continue;
        }
        CHECK(out.width == info.width && out.height == info.height);
        decoded++;
    }
    CHECK(decoded >= 10);
    fl_decoder_free(d);
}

static void test_rectangles_and_scales_match_the_full_decode(void) {
    fl_decoder *d;
    CHECK(fl_decoder_new(&d) == FL_OK);
    for (int i = 0; i < n_files; i++) {
        fl_decoded full, part;
        if (fl_image_decode(d, files[i].data, files[i].len, 1, NULL, &full) != FL_OK)
            continue;
        uint8_t *copy = full_copy(&full);
        size_t w = full.width, h = full.height;
        for (int t = 0; t < 20; t++) {
            size_t x0 = (size_t)rand() % w, y0 = (size_t)rand() % h;
            fl_image_rect r = {x0, y0, x0 + 1 + (size_t)rand() % (w - x0), y0 + 1 + (size_t)rand() % (h - y0)};
            CHECK(fl_image_decode(d, files[i].data, files[i].len, 1, &r, &part) == FL_OK);
            CHECK(part.held.x0 <= r.x0 && part.held.y0 <= r.y0 && part.held.x1 >= r.x1 && part.held.y1 >= r.y1);
            for (size_t y = r.y0; y < r.y1; y++)
                CHECK(memcmp(part.pixels + (y - part.held.y0) * part.stride + (r.x0 - part.held.x0) * 3,
                             copy + (y * w + r.x0) * 3, (r.x1 - r.x0) * 3) == 0);
        }
        if (fl_image_sniff(files[i].data, files[i].len) == FL_IMAGE_JPEG)
            for (unsigned denom = 2; denom <= 8; denom *= 2) {
                CHECK(fl_image_decode(d, files[i].data, files[i].len, denom, NULL, &part) == FL_OK);
                CHECK(part.width == fl_image_scaled(w, denom) && part.height == fl_image_scaled(h, denom));
            }
        else
            CHECK(fl_image_decode(d, files[i].data, files[i].len, 2, NULL, &part) == FL_EINVAL);
        free(copy);
    }
    fl_decoder_free(d);
}

static void test_bad_and_cut_data_is_refused_with_a_message(void) {
    fl_decoder *d;
    CHECK(fl_decoder_new(&d) == FL_OK);
    fl_decoded out;
    CHECK(fl_image_decode(d, "", 0, 1, NULL, &out) == FL_EDECODE && strstr(fl_error_detail(), "0 bytes"));
    CHECK(fl_image_decode(d, "GIF89a....", 10, 1, NULL, &out) == FL_EDECODE &&
          strstr(fl_error_detail(), "not a JPEG or PNG"));
    for (int i = 0; i < n_files; i++)
        for (size_t cut = 1; cut < files[i].len; cut += files[i].len / 7 + 1) {
            unsigned char *prefix = malloc(cut); /* exact size: ASan sees any over-read */
            memcpy(prefix, files[i].data, cut);
            int rc = fl_image_decode(d, prefix, cut, 1, NULL, &out);
            CHECK(rc == FL_OK || (rc == FL_EDECODE && fl_error_detail()[0] != '\0'));
            free(prefix);
        }
    fl_decoder_free(d);
}

static void test_transform_of_encoded_equals_transform_of_decoded_pixels(void) {
    fl_decoder *d;
    CHECK(fl_decoder_new(&d) == FL_OK);
    fl_image_geometry geometries[] = {
        {.kind = FL_GEOMETRY_RESIZED_CROP, .out_h = 17, .out_w = 13, .scale = {0.08, 1}, .ratio = {0.75, 4.0 / 3}},
        {.kind = FL_GEOMETRY_RESIZE, .out_h = 8, .out_w = 8, .resize_h = 10},
    };
    for (int i = 0; i < n_files; i++) {
        fl_decoded full;
        if (fl_image_decode(d, files[i].data, files[i].len, 1, NULL, &full) != FL_OK)
            continue;
        uint8_t *copy = full_copy(&full);
        for (size_t g = 0; g < 2; g++) {
            uint8_t a[17 * 13 * 3], b[17 * 13 * 3];
            CHECK(fl_image_transform(d, &geometries[g], files[i].data, files[i].len, 5, i, a) == FL_OK);
            CHECK(fl_image_transform_pixels(&geometries[g], copy, full.height, full.width, 3, 5, i, b) == FL_OK);
            CHECK(memcmp(a, b, geometries[g].out_h * geometries[g].out_w * 3) == 0);
        }
        free(copy);
    }
    fl_decoder_free(d);
}

static void test_resize_keeps_a_constant_image_and_the_identity(void) {
    uint8_t src[6 * 9 * 3], dst[20 * 4 * 3];
    memset(src, 77, sizeof src);
    CHECK(fl_resize(src, 6, 9, 3, dst, 20, 4) == FL_OK);
    for (size_t i = 0; i < 20 * 4 * 3; i++)
        CHECK(dst[i] == 77);
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(i * 7);
    uint8_t same[sizeof src];
    CHECK(fl_resize(src, 6, 9, 3, same, 6, 9) == FL_OK);
    CHECK(memcmp(src, same, sizeof src) == 0);
    CHECK(fl_resize(src, 0, 9, 3, same, 6, 9) == FL_EINVAL);
}

/* Pillow's two passes written plainly (horizontal into uint8, then vertical), from the axes'
 * own weights: what fl_resample's transposed, vectorized passes must equal bit for bit. */
static uint8_t reference_clip(int64_t sum) {
    sum >>= 22; /* PRECISION_BITS */
    return (uint8_t)(sum < 0 ? 0 : sum > 255 ? 255 : sum);
}

static void reference_resample(const fl_resample_axis *ax, const fl_resample_axis *ay, const uint8_t *src,
                               size_t w, size_t c, uint8_t *tmp, uint8_t *dst) {
    size_t first = fl_resample_axis_lo(ay), last = fl_resample_axis_hi(ay);
    for (size_t y = first; y < last; y++)
        for (size_t i = 0; i < ax->n; i++)
            for (size_t ch = 0; ch < c; ch++) {
                int64_t sum = 1 << 21;
                for (int32_t t = 0; t < ax->count[i]; t++)
                    sum += (int64_t)src[(y * w + (size_t)ax->lo[i] + (size_t)t) * c + ch] * ax->k[i * ax->ksize + (size_t)t];
                tmp[(y * ax->n + i) * c + ch] = reference_clip(sum);
            }
    for (size_t o = 0; o < ay->n; o++)
        for (size_t j = 0; j < ax->n * c; j++) {
            int64_t sum = 1 << 21;
            for (int32_t t = 0; t < ay->count[o]; t++)
                sum += (int64_t)tmp[((size_t)ay->lo[o] + (size_t)t) * ax->n * c + j] * ay->k[o * ay->ksize + (size_t)t];
            dst[o * ax->n * c + j] = reference_clip(sum);
        }
}

static void test_resample_windows_equal_the_plain_two_pass_reference(void) {
    /* {h, w, out_h, out_w, window y, x, n_y, n_x}: down, up, odd and one-pixel shapes */
    static const size_t cases[][8] = {{75, 100, 51, 68, 5, 7, 44, 45},  {9, 7, 30, 41, 3, 0, 20, 41},
                                      {1, 1, 5, 4, 0, 0, 5, 4},         {37, 53, 37, 53, 0, 0, 37, 53},
                                      {120, 33, 17, 31, 16, 1, 1, 30}, {64, 64, 8, 8, 2, 2, 4, 4}};
    for (size_t c = 1; c <= 4; c++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            const size_t *t = cases[k];
            size_t h = t[0], w = t[1];
            uint8_t *src = malloc(h * w * c), *want = malloc(t[6] * t[7] * c), *got = malloc(t[6] * t[7] * c);
            uint8_t *ref_tmp = malloc(h * t[7] * c);
            for (size_t i = 0; i < h * w * c; i++)
                src[i] = (uint8_t)((i * 2654435761u) >> 13);
            fl_resample_axis ax, ay;
            CHECK(fl_resample_axis_init(&ax, w, 0, (double)w, t[3], t[5], t[7]) == FL_OK);
            CHECK(fl_resample_axis_init(&ay, h, 0, (double)h, t[2], t[4], t[6]) == FL_OK);
            size_t tmp_bytes = 0;
            CHECK(fl_resample_tmp_bytes(&ax, &ay, c, &tmp_bytes) == FL_OK);
            uint8_t *tmp = malloc(tmp_bytes);
            reference_resample(&ax, &ay, src, w, c, ref_tmp, want);
            size_t x0 = fl_resample_axis_lo(&ax), y0 = fl_resample_axis_lo(&ay);
            fl_resample(&ax, &ay, src + (y0 * w + x0) * c, w * c, x0, y0, c, tmp, got);
            CHECK(memcmp(want, got, t[6] * t[7] * c) == 0);
            fl_resample_axis_free(&ax);
            fl_resample_axis_free(&ay);
            free(src), free(want), free(got), free(ref_tmp), free(tmp);
        }
}

static void *decode_loop(void *arg) {
    (void)arg;
    fl_decoder *d;
    if (fl_decoder_new(&d) != FL_OK)
        return (void *)1;
    fl_image_geometry g = {.kind = FL_GEOMETRY_RESIZED_CROP, .out_h = 8, .out_w = 8, .scale = {0.08, 1},
                           .ratio = {0.75, 4.0 / 3}, .dct_scaling = 1};
    uint8_t out[8 * 8 * 3];
    for (int round = 0; round < 5; round++)
        for (int i = 0; i < n_files; i++)
            (void)fl_image_transform(d, &g, files[i].data, files[i].len, 1, i, out);
    fl_decoder_free(d);
    return NULL;
}

static void test_threads_decode_at_once_with_their_own_decoders(void) {
    pthread_t threads[4];
    for (int t = 0; t < 4; t++)
        CHECK(pthread_create(&threads[t], NULL, decode_loop, NULL) == 0);
    for (int t = 0; t < 4; t++) {
        void *result;
        pthread_join(threads[t], &result);
        CHECK(result == NULL);
    }
}

int main(void) {
    const char *jpeg = getenv("FASTLOOP_LIBJPEG"), *png = getenv("FASTLOOP_LIBPNG");
    if (fl_image_load_jpeg(jpeg && *jpeg ? jpeg : "libjpeg.so.62") != FL_OK ||
        fl_image_load_png(png && *png ? png : "libpng16.so.16") != FL_OK) {
        fprintf(stderr, "test_image: FAILED, no codec: %s (install the system's libjpeg62-turbo and "
                        "libpng16-16, or set FASTLOOP_LIBJPEG/FASTLOOP_LIBPNG)\n", fl_error_detail());
        return 1; /* not a silent skip: make ctest passes the codecs fastloop.images finds */
    }
    load_corpus("tests/fuzz/corpus/image");
    CHECK(n_files >= 10);
    RUN(test_every_file_decodes_to_its_header_size_or_is_refused);
    RUN(test_rectangles_and_scales_match_the_full_decode);
    RUN(test_bad_and_cut_data_is_refused_with_a_message);
    RUN(test_transform_of_encoded_equals_transform_of_decoded_pixels);
    RUN(test_resize_keeps_a_constant_image_and_the_identity);
    RUN(test_resample_windows_equal_the_plain_two_pass_reference);
    RUN(test_threads_decode_at_once_with_their_own_decoders);
    for (int i = 0; i < n_files; i++)
        free(files[i].data);
    return check_failures != 0; /* not the count: 256 failures would exit 0 */
}
