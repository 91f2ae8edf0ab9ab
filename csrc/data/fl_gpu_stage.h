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

/* The pinned host buffers a GPU decoder uploads each batch's descriptors and tables from
 * (cuda/fl_gpu_decode.cu): two, written in turn, so that one batch's copy may still be in
 * flight while the next batch is planned into the other. This is their bookkeeping only (the
 * CUDA calls are the decoder's): before writing a buffer the decoder waits for the event of
 * the last copy from it, and frees and reallocates it only when a batch needs more room than
 * it has, to a power of two, so batches of the sizes seen before allocate nothing. */
enum { FL_GPU_UPLOAD_BUFFERS = 2 };

typedef struct fl_gpu_upload_ring {
    size_t capacity[FL_GPU_UPLOAD_BUFFERS]; /* bytes allocated (0: none) */
    int queued[FL_GPU_UPLOAD_BUFFERS];      /* a copy from it was queued, its event recorded */
    int next;                               /* the buffer the next batch writes */
} fl_gpu_upload_ring;

/* What the decoder does for one batch's upload, in order. */
typedef struct fl_gpu_upload_turn {
    int buffer;     /* the buffer to write */
    int wait;       /* 1: wait for its event first (the last copy from it) */
    size_t grow_to; /* 0: it is big enough; else free it and allocate this many bytes */
} fl_gpu_upload_turn;

enum { FL_GPU_UPLOAD_MIN_BYTES = 64 << 10 };

/* Inline (header-only): the CUDA extension uses them without linking the core. */

/* The turn for a batch of `bytes` upload bytes (bytes <= SIZE_MAX / 2); the ring moves on
 * to the other buffer. Never fails. */
static inline fl_gpu_upload_turn fl_gpu_upload_take(fl_gpu_upload_ring *r, size_t bytes) {
    fl_gpu_upload_turn t = {r->next, r->queued[r->next], 0};
    if (bytes > r->capacity[t.buffer]) {
        size_t grown = FL_GPU_UPLOAD_MIN_BYTES;
        while (grown < bytes)
            grown *= 2;
        t.grow_to = grown;
    }
    r->next = (r->next + 1) % FL_GPU_UPLOAD_BUFFERS;
    return t;
}

/* After the turn's wait, free and allocation: allocated says whether grow_to bytes were
 * allocated (else the buffer is gone: capacity 0). Never fails. */
static inline void fl_gpu_upload_allocated(fl_gpu_upload_ring *r, const fl_gpu_upload_turn *t, int allocated) {
    r->queued[t->buffer] = 0; /* waited for (a new buffer has had no copy) */
    if (t->grow_to != 0)
        r->capacity[t->buffer] = allocated ? t->grow_to : 0;
}

/* After the copy from the turn's buffer was queued and its event recorded. Never fails. */
static inline void fl_gpu_upload_queued(fl_gpu_upload_ring *r, const fl_gpu_upload_turn *t) {
    r->queued[t->buffer] = 1;
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
