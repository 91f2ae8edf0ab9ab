/* fl_gpu_decode.h - a batch of staged images (csrc/data/fl_gpu_stage.h) decoded on a GPU
 * into a normalized batch: nvJPEG decodes each JPEG's rectangle (the hardware engine where
 * the card has one and the image suits it, nvJPEG's CUDA decoder otherwise), then one kernel
 * pair resamples it with the staged tables (fl_resample's arithmetic: Pillow's antialiased
 * bilinear, 22-bit weights, rows rounded to uint8), mirrors it, normalizes it
 * ((x * a + b) per channel, fastloop.ops.normalize's), lays it out and casts it; the pixels
 * the CPU made for the other images are copied and normalized by the same kernel.
 *
 * Everything is queued on the caller's stream; fl_gpu_decode returns without waiting for the
 * GPU (nvJPEG's host-side parsing runs in the call). The entries, a host buffer, must stay
 * untouched until the stream passes the call. One decoder per loader; its calls are not
 * thread-safe (one consumer thread). nvJPEG must be loaded (fl_nvjpeg_load) first.
 *
 * Codes: 0, a positive cudaError_t, or FL_GPU_NVJPEG_ERROR + an nvJPEG status.
 */
#ifndef FL_GPU_DECODE_H
#define FL_GPU_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "fl_cuda_preprocess.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FL_GPU_NVJPEG_ERROR 100000

typedef struct fl_gpu_decoder fl_gpu_decoder;

/* A decoder on `device`: nvJPEG's hardware backend when the card has the engine (else
 * none), and its default backend. Returns 0 with *out, or an error code (an nvJPEG that
 * cannot start on this device: FL_GPU_NVJPEG_ERROR + status). */
int fl_gpu_decoder_new(int device, fl_gpu_decoder **out);

/* Frees the decoder after waiting for its device's queued work. NULL is a no-op. */
void fl_gpu_decoder_free(fl_gpu_decoder *d);

/* 1 when the hardware engine is in use, else 0. Never fails. */
int fl_gpu_decoder_has_hardware(const fl_gpu_decoder *d);

/* 1 while decodes of a rectangle (region of interest) are accepted by the engine; 0 once it
 * refused one (whole images are decoded from then on). Never fails. */
int fl_gpu_decoder_decodes_regions(const fl_gpu_decoder *d);

typedef struct fl_gpu_decode_job {
    const uint8_t *entries;   /* host: n staged entries of entry_bytes each */
    size_t entry_bytes, n;
    size_t out_h, out_w;      /* every image's output (the staging geometry's) */
    int dst_chw;              /* 1: n x 3 x out_h x out_w; 0: n x out_h x out_w x 3 */
    fl_cuda_out_dtype dtype;
    float a[3], b[3];         /* fl_cuda_preprocess_coefficients() of the mean and std */
    void *dst;                /* device: the output batch */
    uintptr_t stream;         /* as in fl_cuda_mem.h */
    uint8_t *failed;          /* host, n flags: set for an image nvJPEG could not decode (its
                               * output rows are left for the caller to fill) */
    size_t decoded[3];        /* out: images by the engine, by CUDA, from CPU pixels */
} fl_gpu_decode_job;

/* Queues the batch's decode, resampling and normalization on job->stream. Returns 0 (some
 * images may be flagged failed), or an error code (nothing usable was written). */
int fl_gpu_decode(fl_gpu_decoder *d, fl_gpu_decode_job *job);

#ifdef __cplusplus
}
#endif

#endif
