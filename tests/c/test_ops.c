/* test_ops.c - the kernels against plain reference loops on random shapes, serially and on
 * a pool (results must be identical), so the sanitizers see every index path. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "base/fl_error.h"
#include "ops/fl_ops.h"
#include "base/fl_rng.h"

static fl_rng rng = {42};
static fl_pool *pool; /* shared by every test, as fastloop.ops shares one */

static size_t between(size_t lo, size_t hi) { return lo + fl_rng_below(&rng, hi - lo + 1); }

static void fill_bytes(void *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)p)[i] = (unsigned char)fl_rng_next(&rng);
}

static size_t index_of(fl_layout layout, fl_images d, size_t n, size_t y, size_t x, size_t c) {
    return layout == FL_HWC ? ((n * d.h + y) * d.w + x) * d.c + c
                            : ((n * d.c + c) * d.h + y) * d.w + x;
}

static void test_normalize_matches_reference(void) {
    for (int trial = 0; trial < 40; trial++) {
        fl_images d = {between(1, 3), between(1, 19), between(1, 23), between(1, 5)};
        fl_layout src_layout = trial % 2 ? FL_CHW : FL_HWC,
                  dst_layout = trial % 4 < 2 ? FL_CHW : FL_HWC;
        size_t count = d.n * d.h * d.w * d.c;
        unsigned char *src = malloc(count);
        float *got = malloc(count * sizeof(float)), *want = malloc(count * sizeof(float));
        float mean[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f}, std[5] = {0.5f, 0.25f, 2.0f, 1.0f, 0.3f};
        fill_bytes(src, count);
        for (size_t n = 0; n < d.n; n++)
            for (size_t y = 0; y < d.h; y++)
                for (size_t x = 0; x < d.w; x++)
                    for (size_t c = 0; c < d.c; c++)
                        want[index_of(dst_layout, d, n, y, x, c)] =
                            (src[index_of(src_layout, d, n, y, x, c)] / 255.0f - mean[c]) / std[c];
        for (int threads = 1; threads <= 3; threads += 2) {
            fl_exec exec = {pool, threads};
            CHECK(fl_normalize(exec, src, FL_UINT8, src_layout, got, dst_layout, d, mean, std) ==
                  FL_OK);
            int close = 1;
            for (size_t i = 0; i < count; i++)
                close &= fabsf(got[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i]));
            CHECK(close);
        }
        free(src);
        free(got);
        free(want);
    }
    float zero_std[1] = {0}, mean[1] = {0};
    fl_images d = {1, 1, 1, 1};
    unsigned char px = 0;
    float out;
    CHECK(fl_normalize((fl_exec){NULL, 1}, &px, FL_UINT8, FL_HWC, &out, FL_CHW, d, mean,
                       zero_std) == FL_EINVAL);
    CHECK(fl_normalize((fl_exec){NULL, 1}, &px, FL_INT16, FL_HWC, &out, FL_CHW, d, mean, mean) ==
          FL_EINVAL);
}

static void test_cast_saturates_and_wraps(void) {
    float f[6] = {-1.5f, 300.7f, NAN, 12.9f, -INFINITY, INFINITY};
    uint8_t u8[6];
    CHECK(fl_cast((fl_exec){pool, 2}, f, FL_FLOAT32, u8, FL_UINT8, 6) == FL_OK);
    CHECK(u8[0] == 0 && u8[1] == 255 && u8[2] == 0 && u8[3] == 12 && u8[4] == 0 && u8[5] == 255);
    double big[3] = {1e300, -1e300, 9.3e18};
    int64_t i64[3];
    CHECK(fl_cast((fl_exec){NULL, 1}, big, FL_FLOAT64, i64, FL_INT64, 3) == FL_OK);
    CHECK(i64[0] == INT64_MAX && i64[1] == INT64_MIN && i64[2] == INT64_MAX);
    int32_t ints[3] = {-1, 256, 70000};
    uint8_t wrapped[3];
    CHECK(fl_cast((fl_exec){NULL, 1}, ints, FL_INT32, wrapped, FL_UINT8, 3) == FL_OK);
    CHECK(wrapped[0] == 255 && wrapped[1] == 0 && wrapped[2] == (uint8_t)70000);
    enum { N = 100000 };
    uint16_t *src = malloc(N * sizeof *src);
    double *dst = malloc(N * sizeof *dst);
    fill_bytes(src, N * sizeof *src);
    CHECK(fl_cast((fl_exec){pool, 3}, src, FL_UINT16, dst, FL_FLOAT64, N) == FL_OK);
    int same = 1;
    for (size_t i = 0; i < N; i++)
        same &= dst[i] == (double)src[i];
    CHECK(same);
    free(src);
    free(dst);
}

static void test_crop_and_hflip_move_the_right_pixels(void) {
    for (int trial = 0; trial < 30; trial++) {
        fl_layout layout = trial % 2 ? FL_CHW : FL_HWC;
        fl_images d = {between(1, 4), between(1, 17), between(1, 17), between(1, 4)};
        size_t oh = between(1, d.h), ow = between(1, d.w), count = d.n * d.h * d.w * d.c;
        uint16_t *src = malloc(count * 2), *crop = malloc(d.n * oh * ow * d.c * 2);
        uint16_t *flip = malloc(count * 2);
        int64_t tops[4], lefts[4];
        uint8_t flags[4];
        fill_bytes(src, count * 2);
        fl_crop_offsets_random((uint64_t)trial, NULL, d.n, d.h, d.w, oh, ow, tops, lefts);
        fl_hflip_draw((uint64_t)trial, NULL, 0.5, d.n, flags);
        fl_exec exec = {pool, 1 + trial % 3};
        CHECK(fl_crop(exec, src, crop, 2, layout, d, oh, ow, tops, lefts) == FL_OK);
        fl_hflip(exec, src, flip, 2, layout, d, flags);
        fl_images od = {d.n, oh, ow, d.c};
        int ok = 1;
        for (size_t n = 0; n < d.n; n++)
            for (size_t y = 0; y < d.h; y++)
                for (size_t x = 0; x < d.w; x++)
                    for (size_t c = 0; c < d.c; c++) {
                        size_t fx = flags[n] ? d.w - 1 - x : x;
                        ok &= flip[index_of(layout, d, n, y, x, c)] ==
                              src[index_of(layout, d, n, y, fx, c)];
                        if (y < oh && x < ow)
                            ok &= crop[index_of(layout, od, n, y, x, c)] ==
                                  src[index_of(layout, d, n, y + (size_t)tops[n],
                                               x + (size_t)lefts[n], c)];
                    }
        CHECK(ok);
        fl_hflip(exec, flip, flip, 2, layout, d, flags); /* in place: flips back */
        CHECK(memcmp(flip, src, count * 2) == 0);
        free(src);
        free(crop);
        free(flip);
    }
    fl_images d = {1, 4, 4, 1};
    uint8_t img[16], out[4];
    int64_t top = 3, left = 0;
    CHECK(fl_crop((fl_exec){NULL, 1}, img, out, 1, FL_HWC, d, 2, 2, &top, &left) == FL_EINVAL);
}

static void test_stack_and_divide_by_max(void) {
    enum { ITEMS = 5, BYTES = 300001 };
    unsigned char *items[ITEMS], *batch = malloc(ITEMS * BYTES);
    for (int i = 0; i < ITEMS; i++) {
        items[i] = malloc(BYTES);
        fill_bytes(items[i], BYTES);
    }
    fl_stack((fl_exec){pool, 3}, (const void *const *)items, ITEMS, BYTES, batch);
    for (int i = 0; i < ITEMS; i++) {
        CHECK(memcmp(batch + (size_t)i * BYTES, items[i], BYTES) == 0);
        free(items[i]);
    }
    free(batch);

    enum { N = 200000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    for (size_t i = 0; i < N; i++)
        x[i] = (float)(fl_rng_uniform(&rng) * 100 - 50);
    x[N / 3] = 77.0f;
    CHECK(fl_divide_by_max((fl_exec){pool, 3}, x, FL_FLOAT32, y, N) == FL_OK);
    int ok = 1;
    for (size_t i = 0; i < N; i++)
        ok &= y[i] == x[i] / 77.0f;
    CHECK(ok);
    x[N - 1] = NAN;
    CHECK(fl_divide_by_max((fl_exec){pool, 2}, x, FL_FLOAT32, x, N) == FL_OK); /* in place */
    CHECK(isnan(x[0]) && isnan(x[N / 3]));
    CHECK(fl_divide_by_max((fl_exec){NULL, 1}, x, FL_FLOAT32, y, 0) == FL_EINVAL);
    free(x);
    free(y);
}

/* Inputs big enough to be split into several chunks: the pooled result must equal the
 * serial one bit for bit (and the sanitizers see the kernels run concurrently). */
static void test_large_inputs_split_across_threads_match_serial(void) {
    fl_exec serial = {NULL, 1}, pooled = {pool, 3};
    fl_images d = {16, 256, 256, 3}; /* crops of 1.9 MB: two 1 MiB grains */
    size_t count = d.n * d.h * d.w * d.c;
    uint8_t *img = malloc(count), *a8 = malloc(count), *b8 = malloc(count);
    float *af = malloc(count * sizeof(float)), *bf = malloc(count * sizeof(float));
    fill_bytes(img, count);
    float mean[3] = {0.5f, 0.4f, 0.3f}, std[3] = {0.2f, 0.3f, 0.4f};
    CHECK(fl_normalize(serial, img, FL_UINT8, FL_HWC, af, FL_CHW, d, mean, std) == FL_OK);
    CHECK(fl_normalize(pooled, img, FL_UINT8, FL_HWC, bf, FL_CHW, d, mean, std) == FL_OK);
    CHECK(memcmp(af, bf, count * sizeof(float)) == 0);
    CHECK(fl_cast(serial, img, FL_UINT8, af, FL_FLOAT32, count) == FL_OK);
    CHECK(fl_cast(pooled, img, FL_UINT8, bf, FL_FLOAT32, count) == FL_OK);
    CHECK(memcmp(af, bf, count * sizeof(float)) == 0);
    int64_t tops[16], lefts[16];
    uint8_t flags[16];
    fl_crop_offsets_random(5, NULL, d.n, d.h, d.w, 200, 200, tops, lefts);
    CHECK(fl_crop(serial, img, a8, 1, FL_HWC, d, 200, 200, tops, lefts) == FL_OK);
    CHECK(fl_crop(pooled, img, b8, 1, FL_HWC, d, 200, 200, tops, lefts) == FL_OK);
    CHECK(memcmp(a8, b8, d.n * 200 * 200 * 3) == 0);
    fl_hflip_draw(5, NULL, 0.5, d.n, flags);
    fl_hflip(serial, img, a8, 1, FL_HWC, d, flags);
    fl_hflip(pooled, img, b8, 1, FL_HWC, d, flags);
    CHECK(memcmp(a8, b8, count) == 0);
    double *x = malloc(count * sizeof(double)), *ya = malloc(count * sizeof(double)),
           *yb = malloc(count * sizeof(double));
    for (size_t i = 0; i < count; i++)
        x[i] = fl_rng_uniform(&rng);
    CHECK(fl_divide_by_max(serial, x, FL_FLOAT64, ya, count) == FL_OK);
    CHECK(fl_divide_by_max(pooled, x, FL_FLOAT64, yb, count) == FL_OK);
    CHECK(memcmp(ya, yb, count * sizeof(double)) == 0);
    free(img), free(a8), free(b8), free(af), free(bf), free(x), free(ya), free(yb);
}

int main(void) {
    if (fl_pool_new(&pool) != FL_OK)
        return 1;
    RUN(test_normalize_matches_reference);
    RUN(test_cast_saturates_and_wraps);
    RUN(test_crop_and_hflip_move_the_right_pixels);
    RUN(test_stack_and_divide_by_max);
    RUN(test_large_inputs_split_across_threads_match_serial);
    fl_pool_free(pool);
    return check_failures != 0;
}
