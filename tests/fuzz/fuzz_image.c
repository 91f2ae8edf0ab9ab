/* fuzz_image.c - libFuzzer target for the image decoders (fl_image_probe, fl_image_decode,
 * fl_image_transform): any input either decodes into an image whose size agrees with its
 * header, at every scale and rectangle asked, or is refused with FL_EDECODE (bad data) and a
 * printable detail; FL_EINVAL only where the header claims more pixels than the cap. The codecs are loaded from FASTLOOP_LIBJPEG / FASTLOOP_LIBPNG (else the system's
 * libjpeg.so.62 / libpng16.so.16). replay_image.c includes this file to run the corpus
 * without clang. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "data/fl_image.h"
#include "data/fl_pipeline_image.h"
#include "fuzz_checks.h"

static fl_decoder *decoder(void) {
    static fl_decoder *d;
    if (d == NULL) {
        const char *jpeg = getenv("FASTLOOP_LIBJPEG"), *png = getenv("FASTLOOP_LIBPNG");
        INVARIANT(fl_image_load_jpeg(jpeg && *jpeg ? jpeg : "libjpeg.so.62") == FL_OK);
        INVARIANT(fl_image_load_png(png && *png ? png : "libpng16.so.16") == FL_OK);
        fl_image_set_max_pixels(1 << 22); /* a 4-megapixel cap keeps a claimed giant cheap */
        INVARIANT(fl_decoder_new(&d) == FL_OK);
    }
    return d;
}

/* over_cap: the header may still be read as over the pixel cap (FL_EINVAL). */
static void refused(int rc, int over_cap) {
    INVARIANT(rc == FL_EDECODE || (over_cap && rc == FL_EINVAL));
    INVARIANT(fl_error_detail()[0] != '\0' && printable(fl_error_detail()));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fl_decoder *d = decoder();
    fl_image_info info;
    int rc = fl_image_probe(d, data, size, &info);
    if (rc != FL_OK) {
        refused(rc, 1);
        return 0;
    }
    INVARIANT(info.width > 0 && info.height > 0 && (uint64_t)info.width * info.height <= fl_image_max_pixels());
    fl_decoded out;
    unsigned denom = info.format == FL_IMAGE_JPEG ? 2 : 1;
    fl_image_rect r = {info.width / 4 / denom, info.height / 3 / denom, fl_image_scaled(info.width, denom),
                       fl_image_scaled(info.height, denom)};
    for (int pass = 0; pass < 2; pass++) {
        rc = fl_image_decode(d, data, size, pass ? denom : 1, pass ? &r : NULL, &out);
        if (rc != FL_OK) {
            refused(rc, 0);
            return 0;
        }
        INVARIANT(out.width == fl_image_scaled(info.width, pass ? denom : 1));
        INVARIANT(out.height == fl_image_scaled(info.height, pass ? denom : 1));
        INVARIANT(out.held.x1 <= out.width && out.held.y1 <= out.height && out.stride >= 3 * (out.held.x1 - out.held.x0));
        volatile uint8_t sink = 0;
        for (size_t y = 0; y < out.held.y1 - out.held.y0; y++) /* every byte held is readable */
            sink ^= out.pixels[y * out.stride + 3 * (out.held.x1 - out.held.x0) - 1];
        (void)sink;
    }
    fl_image_geometry g = {.kind = FL_GEOMETRY_RESIZED_CROP, .out_h = 16, .out_w = 12, .scale = {0.08, 1},
                           .ratio = {0.75, 4.0 / 3}, .dct_scaling = 1};
    uint8_t pixels[16 * 12 * 3];
    rc = fl_image_transform(d, &g, data, size, size, (int64_t)size, pixels);
    if (rc != FL_OK)
        refused(rc, 0);
    return 0;
}
