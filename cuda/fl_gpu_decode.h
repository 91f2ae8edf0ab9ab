/* fl_gpu_decode.h - a batch of staged images (csrc/data/fl_gpu_stage.h) decoded on a GPU
 * into a normalized batch: nvJPEG decodes each JPEG's rectangle (the hardware engine where
 * the card has one and the image suits it, nvJPEG's fallback backend otherwise; which one is
 * cuda/fl_jpeg_plan.h's host logic), then one kernel
 * pair resamples it with the staged tables (fl_resample's arithmetic: Pillow's antialiased
 * bilinear, 22-bit weights, rows rounded to uint8), mirrors it, normalizes it
 * ((x * a + b) per channel, fastloop.ops.normalize's), lays it out and casts it; the pixels
 * the CPU made for the other images are copied and normalized by the same kernel.
 *
 * Everything is queued on the caller's stream; fl_gpu_decode returns without waiting for the
 * GPU (nvJPEG's host-side parsing runs in the call). The entries, a host buffer, must stay
 * untouched until the stream passes the call. One decoder per loader; its calls are not
 * thread-safe (one consumer thread). nvJPEG must be loaded (fl_nvjpeg_load) first. Each call
 * binds the decoder's device and gives the caller back its current device.
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
 * none), and its default backend as the fallback; two decoder states each, used in turn.
 * Both handles get NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION where nvJPEG >= 12.1 has it
 * (the stats say which flags each got). Returns 0 with *out, or an error code (an nvJPEG that
 * cannot start on this device: FL_GPU_NVJPEG_ERROR + status). */
int fl_gpu_decoder_new(int device, fl_gpu_decoder **out);

/* Frees the decoder after waiting for its device's queued work. NULL is a no-op. */
void fl_gpu_decoder_free(fl_gpu_decoder *d);

/* 1 when the hardware engine is in use, else 0. Never fails. */
int fl_gpu_decoder_has_hardware(const fl_gpu_decoder *d);

/* 1 while the engine decodes rectangles (regions of interest); 0 while regions are demoted
 * after engine errors (cuda/fl_jpeg_plan.h: they are tried again later). Never fails. */
int fl_gpu_decoder_decodes_regions(const fl_gpu_decoder *d);

/* What the decoder did so far and how it is set up. */
typedef struct fl_gpu_decoder_stats {
    unsigned long long hardware;      /* images decoded by the hardware engine */
    unsigned long long fallback;      /* by nvJPEG's fallback backend (hybrid/CUDA) */
    unsigned long long pixels;        /* CPU pixels from the workers, only copied */
    unsigned long long regions;       /* engine images decoded as their crop's region only */
    unsigned long long refused;       /* engine images nvjpegDecodeBatchedSupportedEx refused */
    unsigned long long engine_errors; /* engine batch calls that failed (their images retried) */
    unsigned long long demotions;     /* regions or the engine set aside after engine errors */
    int engine_on, regions_on;        /* now */
    unsigned hardware_flags, fallback_flags; /* nvjpegCreateEx's flags per handle */
    int version_major, version_minor; /* nvJPEG's (-1: unknown) */
} fl_gpu_decoder_stats;

/* Copies the decoder's counts and setup into *out. Never fails. */
void fl_gpu_decoder_get_stats(const fl_gpu_decoder *d, fl_gpu_decoder_stats *out);

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
    size_t decoded[3];        /* out: images by the engine, by the fallback, from CPU pixels */
    size_t regions;           /* out: engine images decoded as regions */
    size_t refused;           /* out: images the engine refused (sent to the fallback) */
} fl_gpu_decode_job;

/* Queues the batch's decode, resampling and normalization on job->stream. Each image the
 * engine refuses (asked per image) goes alone to the fallback backend; an image the fallback
 * refuses is flagged failed. May block on the host for the decode two batches back (its
 * decoder state is reused). Returns 0 (some images may be flagged failed), or an error code
 * (nothing usable was written). */
int fl_gpu_decode(fl_gpu_decoder *d, fl_gpu_decode_job *job);

#ifdef __cplusplus
}
#endif

#endif
