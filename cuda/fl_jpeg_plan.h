/* fl_jpeg_plan.h - the host-side decisions of the nvJPEG decoder (cuda/fl_gpu_decode.cu), as
 * plain C that needs no CUDA or nvJPEG, so tests/c/test_jpeg_plan.c runs it anywhere:
 *
 *   - routing: which image goes to the hardware engine (with its region, or whole), which to
 *     nvJPEG's fallback backend, which are the CPU's pixels; asked per image, so one image the
 *     engine refuses never moves the rest of its batch;
 *   - the engine's health: when an engine *error* demotes regions or the engine, and when a
 *     demoted feature is tried again (never off for the loader's lifetime);
 *   - the decoder states: two per backend, used in turn, each guarded by an event; when one
 *     must be waited for, (re)initialized and pre-allocated;
 *   - decode="auto" without the engine: nvJPEG's fallback backend or the CPU workers.
 *
 * Plain data owned by the caller; no call blocks or fails. Not thread-safe: one decoder, one
 * consumer thread (fl_gpu_decode.h).
 */
#ifndef FL_JPEG_PLAN_H
#define FL_JPEG_PLAN_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- routing ---- */

/* Where one staged image is decoded. */
typedef enum fl_jpeg_dest {
    FL_JPEG_ENGINE_REGION = 0, /* hardware engine, only the crop's rectangle */
    FL_JPEG_ENGINE_WHOLE = 1,  /* hardware engine, the whole image */
    FL_JPEG_FALLBACK = 2,      /* nvJPEG's fallback (hybrid/GPU) backend, the whole image */
    FL_JPEG_PIXELS = 3,        /* the CPU worker's finished pixels: only copied */
    FL_JPEG_LEFT_OUT = 4,      /* flagged failed already: the caller decodes it on the CPU */
} fl_jpeg_dest;

/* The staged routes (fl_gpu_stage.h's fl_gpu_route, repeated: this file includes no core). */
enum { FL_JPEG_STAGED_ENGINE = 0, FL_JPEG_STAGED_FALLBACK = 1, FL_JPEG_STAGED_PIXELS = 2 };

/* Asks nvJPEG whether the engine decodes this image (nvjpegDecodeBatchedSupportedEx), with the
 * crop's region when `region` is 1. Returns 1 (supported), 0 (refused). */
typedef int (*fl_jpeg_ask)(void *context, int region);

/* Where an image goes, given its staged route, whether it was flagged failed, and what the
 * engine accepts now (engine: in use for this batch; regions: regions in use). `ask` is
 * called only for an image staged for the engine: with the region first (when regions are in
 * use), then whole; a refused image goes to the fallback backend. Never fails. */
fl_jpeg_dest fl_jpeg_route(int staged_route, int failed, int engine, int regions, fl_jpeg_ask ask,
                           void *context);

/* ---- the engine's health ---- */

enum {
    FL_JPEG_ERRORS_TO_DEMOTE = 3,  /* engine errors in a row before a feature is demoted */
    FL_JPEG_FIRST_BACKOFF = 100,   /* batches a demoted feature waits before it is tried again */
    FL_JPEG_MAX_BACKOFF = 6400,    /* the wait doubles per demotion up to this */
};

/* Per-image refusals (fl_jpeg_route) never count here: only an engine batch call that failed
 * on images the engine said it supports. FL_JPEG_ERRORS_TO_DEMOTE such errors in a row demote
 * regions (the engine then decodes whole images), then, with regions already off, the engine
 * (its images go to the fallback backend). A demoted feature is tried again after a backoff
 * of batches that doubles per demotion (100, 200, ... 6400); on that try one more error
 * demotes it again. A success resets the count. */
typedef struct fl_jpeg_engine {
    int present;                  /* the card has the engine and nvJPEG's hardware backend made */
    int engine_on, regions_on;
    int errors;                   /* engine errors in a row */
    long long batch;              /* batches begun */
    long long engine_back_at;     /* batch at which a demoted engine is tried again */
    long long regions_back_at;
    long long backoff;            /* the next demotion's wait */
    unsigned long long demotions; /* features demoted so far */
    unsigned long long errors_total;
} fl_jpeg_engine;

/* A healthy engine (or none when present is 0). Never fails. */
void fl_jpeg_engine_init(fl_jpeg_engine *e, int present);

/* Starts a batch: re-enables a demoted feature whose backoff has passed. Never fails. */
void fl_jpeg_engine_begin_batch(fl_jpeg_engine *e);

/* 1 when this batch may use the engine (regions: its regions), else 0. Never fails. */
int fl_jpeg_engine_usable(const fl_jpeg_engine *e);
int fl_jpeg_engine_regions(const fl_jpeg_engine *e);

/* The engine's batch call returned: ok 1 (success) or 0 (an error: the caller decodes those
 * images with the fallback backend). Returns 1 when this demoted a feature. Never fails. */
int fl_jpeg_engine_result(fl_jpeg_engine *e, int ok);

/* ---- double-buffered decoder states ---- */

/* One nvJPEG state: the batch size it was initialized for (0: not yet), the image size its
 * buffers were pre-allocated for, and whether an event was recorded after its last decode. */
typedef struct fl_jpeg_state_slot {
    int batch;
    int width, height;
    int pending;
} fl_jpeg_state_slot;

typedef struct fl_jpeg_states {
    fl_jpeg_state_slot slot[2];
    int next; /* the slot the next batch uses */
} fl_jpeg_states;

/* What the caller does before decoding a batch with a state, in this order: wait the slot's
 * event (the decode that last used it may still run), nvjpegDecodeBatchedInitialize(batch)
 * (nvJPEG fixes the batch size there: a state is initialized once per batch size, its
 * "shape class"), nvjpegDecodeBatchedPreAllocate(batch, width, height) where the backend has
 * it; then decode, record the slot's event and call fl_jpeg_states_queued(). */
typedef struct fl_jpeg_state_step {
    int slot;
    int wait, initialize, preallocate;
    int batch, width, height;
} fl_jpeg_state_step;

enum { FL_JPEG_PREALLOCATE_ROUND = 256 }; /* pre-allocated sizes grow in these steps */

/* Two fresh states. Never fails. */
void fl_jpeg_states_init(fl_jpeg_states *s);

/* The step for a batch of `batch` images, the largest max_w x max_h (pixels; 0 when unknown);
 * can_preallocate: the backend has nvjpegDecodeBatchedPreAllocate. Takes the slot in turn.
 * The pre-allocation only grows: to the largest size seen, rounded up. Never fails. */
void fl_jpeg_states_next(fl_jpeg_states *s, int batch, int max_w, int max_h, int can_preallocate,
                         fl_jpeg_state_step *step);

/* The slot's decode was queued and its event recorded after it. Never fails. */
void fl_jpeg_states_queued(fl_jpeg_states *s, int slot);

/* Initialize, pre-allocation or decode failed on the slot: it is initialized again next time
 * (its event still guards it when it was recorded). Never fails. */
void fl_jpeg_states_forget(fl_jpeg_states *s, int slot);

/* ---- handle flags ---- */

/* The flags nvjpegCreateEx gets from an nvJPEG of version major.minor: 32
 * (NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, libjpeg-turbo's "fancy upsampling") from 12.1 on,
 * where the flag exists; 0 before, or when the version is unknown (major < 0). Never fails. */
unsigned fl_jpeg_handle_flags(int major, int minor);

/* ---- decode="auto" ---- */

/* 1 to decode on the GPU, 0 to decode in the CPU workers. With the engine: the GPU. Without
 * it nvJPEG's fallback backend runs its Huffman decoding on one host thread (the consumer's),
 * so the GPU is chosen only where that thread outruns the workers: fallback_rate (images/s)
 * > workers * cpu_rate (images/s per worker). A rate <= 0 is unknown: the CPU. Never fails. */
int fl_jpeg_auto_gpu(int has_engine, int workers, double cpu_rate, double fallback_rate);

#ifdef __cplusplus
}
#endif

#endif
