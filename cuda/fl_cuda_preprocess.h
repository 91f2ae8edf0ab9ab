/* fl_cuda_preprocess.h - a uint8 image batch from host memory to normalized float32,
 * float16 or bfloat16 on the device, in one copy and one kernel: crop, horizontal flip,
 * (x/255 - mean) / std per channel, HWC -> CHW if asked (or CHW -> HWC: torch's
 * channels_last memory), and the cast, all queued on a stream without waiting.
 *
 * The arithmetic is fastloop.ops.normalize's (csrc/ops/ops_normalize.c): a = (1/255) / std
 * and b = -mean / std in float, then one fused multiply-add x * a + b per value, rounded to
 * nearest even into the output type. The kernel's per-pixel code is fl_preprocess_math.cuh's,
 * which the tests build and run on the host against fastloop.ops (tests/test_gpu_kernels_host.py):
 * equal bit for bit where the CPU's normalize fuses the multiply-add (x86-64 with AVX2 and FMA;
 * always for uint8 RGB HWC -> CHW there), within 1 float32 ulp (one step of float16/bfloat16
 * at a tie) where it rounds the product and the sum apart.
 */
#ifndef FL_CUDA_PREPROCESS_H
#define FL_CUDA_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The output element type. */
typedef enum fl_cuda_out_dtype {
    FL_CUDA_OUT_FLOAT32 = 0,
    FL_CUDA_OUT_FLOAT16 = 1,
    FL_CUDA_OUT_BFLOAT16 = 2,
} fl_cuda_out_dtype;

/* Bytes per output element of `dtype` (4 or 2). Never fails. */
size_t fl_cuda_out_dtype_size(fl_cuda_out_dtype dtype);

typedef struct fl_cuda_preprocess_job {
    int device;
    uintptr_t stream;        /* as in fl_cuda_mem.h: 1 is the legacy default stream */
    const uint8_t *host_src; /* n images, h x w x c (src_chw 0) or c x h x w (src_chw 1) */
    size_t n, h, w, c;
    int src_chw, dst_chw;
    size_t out_h, out_w;    /* the crop (h, w when not cropping) */
    const int32_t *offsets; /* host: n (top, left) pairs, or NULL: (top, left) for every image */
    size_t top, left;
    const uint8_t *flips;   /* host: n flags (non-zero: mirror left-right), or NULL */
    const float *a, *b;     /* host: c coefficients each (fl_cuda_preprocess_coefficients) */
    fl_cuda_out_dtype dst_dtype;
    void *dst;              /* device: n x c x out_h x out_w (dst_chw) or n x out_h x out_w x c */
} fl_cuda_preprocess_job;

/* a[ch] = (1/255) / std[ch], b[ch] = -mean[ch] / std[ch], as fastloop.ops.normalize. The
 * caller has checked that no std is 0. Never fails. */
void fl_cuda_preprocess_coefficients(const float *mean, const float *std, size_t c, float *a,
                                     float *b);

/* Queues on job->stream: the copy of the batch (and of the offsets, flips and coefficients)
 * into a stream-ordered staging buffer, the kernel, the staging buffer's release, and a
 * record of *event (created when *event is NULL; destroy with fl_cuda_event_destroy();
 * event NULL: no record, the caller orders what follows on the stream). Returns
 * without waiting: a pinned host_src must stay untouched until the event completes (a
 * pageable one is staged before this returns). Offsets must keep every crop inside its
 * image (the caller checks). Returns 0 or a cudaError_t code. */
int fl_cuda_preprocess(const fl_cuda_preprocess_job *job, void **event);

#ifdef __cplusplus
}
#endif

#endif
