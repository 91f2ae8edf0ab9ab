/* fl_gpu_math.cuh - the per-element arithmetic every preprocessing kernel shares, written once
 * for the GPU and the host: the normalize (one fused multiply-add, as fastloop.ops.normalize
 * on a CPU with FMA), the float32 -> float16 / bfloat16 rounding (to nearest, ties to even,
 * as NumPy's astype and torch's .to), the NCHW / NHWC index and the mirror.
 *
 * Plain C that also compiles as CUDA C++: nvcc builds the kernels from it, and the tests'
 * host build (FASTLOOP_TESTING=1, csrc/py/py_gpu_math_testing.c) compiles the very same text
 * with the C compiler, so pytest checks the GPU's arithmetic against the CPU path without a
 * GPU. Integer bit operations only (no intrinsics): the rounding is the same code on both.
 */
#ifndef FL_GPU_MATH_CUH
#define FL_GPU_MATH_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fl_cuda_preprocess.h" /* fl_cuda_out_dtype */

#ifdef __CUDACC__
#define FL_GPU_FN static inline __host__ __device__
#else
#define FL_GPU_FN static inline
#endif

/* x * a + b rounded once (fmaf is exact-rounded on the GPU and in C99's libm alike). */
FL_GPU_FN float fl_gpu_normalize(uint8_t x, float a, float b) { return fmaf((float)x, a, b); }

FL_GPU_FN uint32_t fl_gpu_float_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* The bfloat16 nearest to v, ties to even; a NaN stays a (quiet) NaN of the same sign. */
FL_GPU_FN uint16_t fl_gpu_bf16_bits(float v) {
    uint32_t u = fl_gpu_float_bits(v);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The float16 nearest to v, ties to even: past 65520 (halfway to 65536) an infinity,
 * below 2^-14 a subnormal (or zero); a NaN stays a quiet NaN of the same sign. */
FL_GPU_FN uint16_t fl_gpu_f16_bits(float v) {
    const uint32_t u = fl_gpu_float_bits(v), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x47800000u) /* 65536 and up, infinity included */
        return (uint16_t)(sign | 0x7c00u);
    const uint32_t e = a >> 23; /* float's biased exponent */
    uint32_t h, rest, half;
    if (e >= 113) { /* a normal float16: rebias 127 -> 15, keep 10 of 23 mantissa bits */
        h = ((e - 112) << 10) | ((a >> 13) & 0x3ffu);
        rest = a & 0x1fffu, half = 0x1000u;
    } else if (e >= 102) { /* a subnormal one: the value in units of 2^-24 */
        const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14..24 */
        h = m >> shift;
        rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    } else { /* under 2^-25: zero (2^-25 itself is a tie, to the even zero) */
        return (uint16_t)sign;
    }
    h += rest > half || (rest == half && (h & 1u)); /* a carry moves into the exponent, as it should */
    return (uint16_t)(sign | h);
}

/* Stores v at element i of dst in the output type. */
FL_GPU_FN void fl_gpu_store(void *dst, int dtype, long long i, float v) {
    if (dtype == FL_CUDA_OUT_FLOAT16)
        ((uint16_t *)dst)[i] = fl_gpu_f16_bits(v);
    else if (dtype == FL_CUDA_OUT_BFLOAT16)
        ((uint16_t *)dst)[i] = fl_gpu_bf16_bits(v);
    else
        ((float *)dst)[i] = v;
}

/* Element ch of pixel `pixel` (y * w + x) of an image of `plane` (h * w) pixels and c
 * channels: planar (chw: c x h x w) or interleaved (h x w x c). */
FL_GPU_FN long long fl_gpu_index(int chw, long long ch, long long pixel, long long plane, long long c) {
    return chw ? ch * plane + pixel : pixel * c + ch;
}

/* The source column of output column x of a row w wide, mirrored when flip. */
FL_GPU_FN long long fl_gpu_flip_x(int flip, long long x, long long w) { return flip ? w - 1 - x : x; }

#endif
