/* fl_preprocess_math.cuh - one output pixel of fl_cuda_preprocess's kernel: the crop (a region
 * per image or one for all), the mirror, the normalize, the layout and the cast, over all
 * channels. The kernel runs it once per pixel; the tests' host build runs it over every pixel
 * and compares with fastloop.ops (fl_gpu_math.cuh says how it compiles on both). */
#ifndef FL_PREPROCESS_MATH_CUH
#define FL_PREPROCESS_MATH_CUH

#include "fl_gpu_math.cuh"

typedef struct fl_gpu_preprocess_params {
    const uint8_t *src;     /* n images, h x w x c (src_chw 0) or c x h x w (src_chw 1) */
    void *dst;              /* n x c x out_h x out_w (dst_chw) or n x out_h x out_w x c */
    const float *a, *b;     /* c coefficients each */
    const int32_t *offsets; /* n (top, left) pairs, or NULL: (top, left) for every image */
    const uint8_t *flips;   /* n flags, or NULL */
    long long n, h, w, c, out_h, out_w, top, left;
    int src_chw, dst_chw, dtype;
} fl_gpu_preprocess_params;

/* Output pixel i of the batch (image-major, then row, then column), all its channels. */
FL_GPU_FN void fl_gpu_preprocess_pixel(const fl_gpu_preprocess_params *p, long long i) {
    const long long x = i % p->out_w, t = i / p->out_w, y = t % p->out_h, img = t / p->out_h;
    const long long top = p->offsets ? p->offsets[2 * img] : p->top;
    const long long left = p->offsets ? p->offsets[2 * img + 1] : p->left;
    const long long sy = top + y, sx = left + fl_gpu_flip_x(p->flips && p->flips[img], x, p->out_w);
    const long long plane = p->h * p->w, out_plane = p->out_h * p->out_w;
    const uint8_t *s = p->src + img * plane * p->c;
    const long long out_image = img * p->c * out_plane;
    for (long long ch = 0; ch < p->c; ch++) {
        const uint8_t v = s[fl_gpu_index(p->src_chw, ch, sy * p->w + sx, plane, p->c)];
        fl_gpu_store(p->dst, p->dtype, out_image + fl_gpu_index(p->dst_chw, ch, y * p->out_w + x, out_plane, p->c),
                     fl_gpu_normalize(v, p->a[ch], p->b[ch]));
    }
}

#endif
