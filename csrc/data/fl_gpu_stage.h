/* fl_gpu_stage.h - an encoded image made ready for a GPU decoder by a loader worker: its
 * JPEG bytes and the resampling tables, or its pixels when only the CPU can decode it.
 *
 * With Loader(decode="gpu") a worker thread does everything but the decode itself: it reads
 * the file, parses the JPEG header, draws the crop (RandomResizedCrop) and the flips exactly
 * as the CPU path draws them, and computes fl_resample's tables for the rectangle to decode.
 * Each sample's slot entry is a record (fl_gpu_record) followed by a payload of fixed
 * capacity: the JPEG bytes then the tables, for the GPU; or, for an image the GPU decoder
 * cannot take (progressive, CMYK, 12-bit, PNG, a header that does not parse, bytes or tables
 * over the capacity), the finished out_h x out_w x 3 uint8 pixels made by the CPU path (the
 * same decode, crop, resize and flips as without a GPU; its errors are the CPU path's).
 *
 * The consumer hands the entries to the CUDA decoder (cuda/fl_gpu_decode.h), which decodes
 * the JPEG rectangles with nvJPEG and resamples them with the tables: the arithmetic of
 * fl_resample, so a GPU-decoded image differs from the CPU path's only by the decoders' IDCT.
 * Plain data: any number of threads stage at once, each with its own decoder and scratch.
 */
#ifndef FL_GPU_STAGE_H
#define FL_GPU_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "data/fl_image.h"
#include "data/fl_pipeline.h"
#include "data/fl_pipeline_image.h"

/* How a staged image reaches the GPU. */
typedef enum fl_gpu_route {
    FL_GPU_JPEG_HARDWARE = 0, /* JPEG bytes for nvJPEG's hardware engine (A100/H100/H200) */
    FL_GPU_JPEG_CUDA = 1,     /* JPEG bytes for nvJPEG's CUDA decoder (the engine cannot) */
    FL_GPU_PIXELS = 2,        /* decoded on the CPU: out_h x out_w x 3 uint8, flips applied */
} fl_gpu_route;

/* Why an image did not go to the hardware engine (counted by the decoder). */
typedef enum fl_gpu_reason {
    FL_GPU_REASON_NONE = 0,
    FL_GPU_REASON_NOT_JPEG = 1,      /* PNG or unknown bytes */
    FL_GPU_REASON_HEADER = 2,        /* the JPEG header did not parse: the CPU decoder says why */
    FL_GPU_REASON_UNSUPPORTED = 3,   /* progressive, CMYK, 12-bit, ...: only the CPU decodes it */
    FL_GPU_REASON_SUBSAMPLING = 4,   /* a subsampling only nvJPEG's CUDA decoder takes */
    FL_GPU_REASON_TOO_LARGE = 5,     /* bytes + tables over the payload capacity */
    FL_GPU_REASON_COUNT = 6,
} fl_gpu_reason;

/* The fixed head of a staged entry; the payload follows at FL_GPU_RECORD_BYTES. */
typedef struct fl_gpu_record {
    int32_t route;             /* fl_gpu_route */
    int32_t reason;            /* fl_gpu_reason */
    int32_t flip;              /* JPEG routes: mirror the output left-right */
    uint32_t image_h, image_w; /* the whole image (JPEG routes) */
    uint32_t x0, y0, rect_w, rect_h; /* the source rectangle to decode */
    uint32_t taps_x, taps_y;   /* weights per output pixel in each table */
    uint32_t length;           /* payload bytes: the JPEG, or the pixels */
    uint32_t tables_at;        /* payload offset of the tables (4-byte aligned) */
    uint32_t reserved;
    int64_t id;                /* the sample's dataset index */
} fl_gpu_record;

enum { FL_GPU_RECORD_BYTES = 64 };

/* The tables at payload + tables_at, int32 each, for out_w columns then out_h rows:
 *   lo_x[out_w] count_x[out_w] k_x[out_w * taps_x] lo_y[out_h] count_y[out_h] k_y[out_h * taps_y]
 * lo relative to the rectangle's origin; k in fl_resample's 22-bit fixed point. */
static inline size_t fl_gpu_tables_bytes(size_t out_h, size_t out_w, size_t taps_x, size_t taps_y) {
    return sizeof(int32_t) * (out_w * (2 + taps_x) + out_h * (2 + taps_y));
}

/* Bytes per staged entry for `capacity` payload bytes (raised to hold the CPU path's pixels,
 * out_h * out_w * 3, and rounded up to 64), or 0 when that overflows. */
size_t fl_gpu_entry_bytes(size_t out_h, size_t out_w, size_t capacity);

/* What one worker brings to fl_gpu_stage. */
typedef struct fl_gpu_stage_job {
    const fl_image_geometry *geometry;
    const fl_pipeline *flips;  /* the steps after the geometry: flips only, or NULL */
    fl_decoder *decoder;       /* the worker's, for the CPU route */
    uint8_t *pixels;           /* scratch of out_h * out_w * 3 bytes for the CPU route */
    void *pipeline_scratch;    /* the flips' scratch (fl_pipeline_plan's per-image bytes) */
    size_t entry_bytes;        /* fl_gpu_entry_bytes() */
    uint64_t seed;             /* the epoch's seed */
    int64_t id;                /* the sample's dataset index */
} fl_gpu_stage_job;

/* Stages the encoded image `data` (len bytes) into `entry` (job->entry_bytes bytes): a record
 * and its payload. Returns 0, or the CPU path's error for an image it had to decode and
 * could not (FL_EINVAL naming the cause, FL_EUNAVAILABLE, FL_ENOMEM). */
int fl_gpu_stage(const fl_gpu_stage_job *job, const void *data, size_t len, uint8_t *entry);

#endif
