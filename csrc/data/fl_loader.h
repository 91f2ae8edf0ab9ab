/* fl_loader.h - batches assembled by C threads into recycled batch slots.
 *
 * A loader reads `n_fields` fields per sample (an array in memory or memory-mapped, or one
 * file per sample read by the worker) and writes each batch into a slot: one buffer holding
 * every field's batch, back to back. Field 0 may go through a pipeline on the way. Workers
 * claim batches in order, up to the number of slots ahead of the consumer; the consumer
 * receives them in order (fl_loader_next) and lends each slot out until fl_loader_release.
 *
 * Threads: `workers` C threads (signals blocked, no Python) plus the consumer; one mutex
 * guards the slot states, the epoch cursor and the error; a condition variable signals
 * every change. Batches are filled in chunks of samples, so several threads can share one;
 * the consumer, while it waits in next() for a batch, fills chunks of that batch itself (with
 * 0 workers, every batch).
 * A worker's error (an unreadable file) travels as data: the error of the earliest failing
 * batch is kept with the sample index and path; next() delivers the batches before it, then
 * returns it.
 *
 * With a filler (fl_loader_filler) the workers run the caller's code instead of reading the
 * fields: the Python binding runs a dataset's __getitem__ on them. Each worker then fills
 * whole batches (the filler keeps per-batch state), and the consumer never fills.
 *
 * Stopping from several threads: fl_loader_stop() may be called by any thread, at once by
 * many: exactly one caller joins the workers (it owns the stop under the lock), the others
 * wait until that stop is done; an epoch started meanwhile waits for it too, then starts for
 * real. A stop or free called on one of the loader's own workers (a filler's code dropping the
 * last reference to its loader) cannot join that worker: see fl_loader_stop/fl_loader_free.
 */
#ifndef FL_LOADER_H
#define FL_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "base/fl_metrics.h"
#include "data/fl_batch_source.h"
#include "data/fl_gpu_stage.h"
#include "data/fl_npy.h"
#include "data/fl_pipeline.h"
#include "data/fl_pipeline_image.h"
#include "data/fl_sampler.h"

/* Where one field of every sample comes from. */
typedef struct fl_field {
    const void *base;          /* arrays: sample i at base + i * sample_bytes */
    const char *const *paths;  /* files: paths[i] for sample i (NULL for arrays); borrowed */
    int raw;                   /* files hold sample_bytes raw bytes (else .npy as `expect`) */
    fl_npy_header expect;      /* .npy files: what every file must hold */
    size_t sample_bytes;       /* bytes of one sample as read */
    /* Encoded images (JPEG/PNG) when geometry is set: sample i is the bytes [offsets[i],
     * offsets[i] + lengths[i]) (length -1: to the end of the file) of paths[file_index[i]],
     * read with one pread, decoded and cropped/resized by `geometry` into an out_h x out_w x 3
     * uint8 image (sample_bytes). All borrowed. */
    const fl_image_geometry *geometry;
    const int32_t *file_index;
    const int64_t *offsets, *lengths;
    /* Encoded images for a GPU decoder (field 0 only): with gpu_entry_bytes > 0 (from
     * fl_gpu_entry_bytes) each sample is staged by fl_gpu_stage instead of decoded, into an
     * entry of that many bytes; the pipeline (flips only) is drawn for the images the GPU
     * decodes and run on those the CPU decodes. */
    size_t gpu_entry_bytes;
} fl_field;

/* Code that fills whole batches on the workers in place of the fields' readers (the fields
 * then give only each sample's bytes, and `pipeline` must be NULL: the filler runs its own). */
typedef struct fl_loader_filler {
    /* On each worker as it starts (before its first fill), or NULL. A nonzero return (an
     * fl_err code, the detail set) ends that worker and becomes next()'s error. */
    int (*thread_start)(void *ctx, int worker);
    /* On each worker as it ends, or NULL. Not called on a worker whose loader was freed
     * under it (fl_loader_orphaned). */
    void (*thread_end)(void *ctx, int worker);
    /* Fills batch `batch`: `count` samples, the epoch order's `ids`, into slot `slot` (its
     * memory `data`, field f at fl_loader_field_offset(f)); `seed` is the epoch's augmentation
     * seed. Returns FL_OK, or an fl_err code with the detail set; should return early once
     * fl_loader_cancelled(). Runs without the loader's lock, on one worker at a time per
     * batch. */
    int (*fill)(void *ctx, int worker, uint64_t batch, uint64_t seed, const int64_t *ids, size_t count,
                int slot, unsigned char *data);
    void *ctx;
} fl_loader_filler;

typedef struct fl_loader_config {
    fl_sampler sampler;
    int workers;               /* C threads; 0: the consumer fills batches in next() */
    int slots;                 /* batch buffers, >= 2 */
    int ahead;                 /* at most this many batches filling or ready, not yet handed
                                * out (0: as many as free slots allow). With slots = ahead + 2
                                * the consumer may hold two batches (the one in use, the one
                                * being taken) and `ahead` stay in flight, as DataLoader's
                                * prefetch_factor * num_workers */
    const fl_field *fields;    /* n_fields entries, copied */
    size_t n_fields;
    const fl_pipeline *pipeline; /* for field 0, or NULL; borrowed, must outlive the loader */
    fl_images image;           /* field 0's image geometry (n ignored) when a pipeline is set */
    fl_dtype image_dtype;
    fl_metrics *metrics;       /* optional; counts "loader/samples", "loader/batches", "loader/skipped" */
    int skip_errors;           /* a sample that fails to read or decode is dropped from its batch
                                * (the batch comes shorter; one of nothing is not delivered) */
    const fl_loader_filler *filler; /* or NULL; copied */
} fl_loader_config;

typedef struct fl_loader fl_loader;

/* Plans the slot layout (running the pipeline's plan) and allocates the slots; starts no
 * thread yet. Returns 0 and sets *out, or FL_EINVAL/FL_ENOMEM (detail says why). */
int fl_loader_new(const fl_loader_config *config, fl_loader **out);

/* Begins `epoch`: computes its order and (re)starts the workers. An epoch in progress (cut
 * short, or failed) is stopped first; a stop in progress on another thread is waited for.
 * Returns 0, FL_ENOMEM, FL_ESYS (no thread) or FL_EINVAL (called on one of its workers). */
int fl_loader_start_epoch(fl_loader *l, uint64_t epoch);

/* fl_loader_start_epoch, resuming at batch first_batch of the epoch (the batches before it
 * are skipped, never made; past the end: an empty epoch). Same returns. */
int fl_loader_start_epoch_at(fl_loader *l, uint64_t epoch, uint64_t first_batch);

/* Waits up to timeout_s for the next batch in order. Returns 0 with *slot and *count (the
 * batch's samples), FL_EEND after the last batch, FL_EAGAIN/FL_ETIMEDOUT, or the first
 * worker error (FL_EINVAL/FL_ESYS; fl_loader_error() has the message). The slot is lent to
 * the caller until fl_loader_release(). */
int fl_loader_next(fl_loader *l, double timeout_s, int *slot, size_t *count);

/* Returns a lent slot for reuse. Any thread. */
void fl_loader_release(fl_loader *l, int slot);

/* Abandons the epoch: stops and joins the workers and forgets batches not yet delivered.
 * Lent slots stay lent. Idempotent, and safe from any number of threads at once: one joins,
 * the others return once it has. On one of the loader's own workers it only asks the workers
 * to end (a thread cannot join itself): next() then returns FL_EEND, and the next stop or
 * start_epoch on another thread joins them. */
void fl_loader_stop(fl_loader *l);

/* Asks the workers to end after the batch in hand and ends the epoch for next() (FL_EEND),
 * without waiting for them: the next stop, start_epoch or free joins them. Any thread; never
 * blocks but for the lock. For finalizers, which must not wait on workers that may wait on a
 * lock the finalizing thread holds. */
void fl_loader_request_stop(fl_loader *l);

/* 1 once a stop has asked the workers to end: a filler returns early. Any thread; no lock. */
int fl_loader_cancelled(const fl_loader *l);

/* 1 on a worker thread whose loader was freed by code that worker ran (see fl_loader_free):
 * the filler must then return at once without touching the loader or its own state. */
int fl_loader_orphaned(void);

/* Batches of uneven sizes, as a batch sampler gives them (see fl_sampler_check_ends): `ends`
 * (n, copied) replace the split into batch_size samples (NULL and 0: back to it) and the
 * number of batches, for the epochs started next. Returns 0, FL_EINVAL (an epoch is in
 * progress, or a bad end: the detail says which batch) or FL_ENOMEM. */
int fl_loader_set_batches(fl_loader *l, const uint64_t *ends, uint64_t n);

/* The first worker error's message ("" if none). */
const char *fl_loader_error(fl_loader *l);

/* With skip_errors: samples dropped so far, and the first one's message into buf (size n). */
uint64_t fl_loader_skipped(fl_loader *l, char *buf, size_t n);

/* Slot memory, and where field f's batch sits in it. */
void *fl_loader_slot(fl_loader *l, int slot);
size_t fl_loader_field_offset(const fl_loader *l, size_t field);

/* Field f's output: bytes per sample; for field 0 with a pipeline also its geometry. */
size_t fl_loader_field_sample_bytes(const fl_loader *l, size_t field);
void fl_loader_output_image(const fl_loader *l, fl_images *dims, fl_dtype *dtype,
                            fl_layout *layout);

/* Slots lent out now, slots in all, and batches filling or ready but not yet handed out. */
int fl_loader_lent(fl_loader *l);
int fl_loader_slots(const fl_loader *l);
int fl_loader_ahead(fl_loader *l);

/* Batches per epoch. */
uint64_t fl_loader_batches(const fl_loader *l);

/* fl_loader_free on a thread of its own (detached): asks the workers to end now, and returns
 * at once; that thread joins them, frees the loader and then calls then(arg). Returns 0, or
 * FL_ESYS when no thread could be started (nothing done: free it yourself). For a finalizer,
 * which must not join workers running code that may wait on a lock it holds. */
int fl_loader_free_later(fl_loader *l, void (*then)(void *arg), void *arg);

/* Stops the workers and frees everything. No slot may still be in use. NULL is a no-op.
 * Called on one of the loader's own workers (a filler's code dropped the last reference),
 * it joins the other workers, detaches the calling one and frees everything; that worker
 * then sees fl_loader_orphaned() and must return without touching the loader. */
void fl_loader_free(fl_loader *l);

/* The loader as a batch source (fl_batch_source.h); it stays the loader's handle: the
 * table's free is fl_loader_free. Cannot fail. */
fl_batch_source fl_loader_source(fl_loader *l);

#endif
