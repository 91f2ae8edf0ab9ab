/* fl_checkpoint.h - background, atomic checkpoints: the owner copies a state into a staging
 * area (fast, memcpy) and a writer thread turns it into `<dir>/ckpt-<step>.safetensors` -- a
 * temp file in the same directory, fsync, rename, fsync of the directory -- then deletes all
 * but the newest `keep` checkpoints (.npz ones of older versions included). A file only ever
 * appears under its final name complete, so a crash at any moment leaves the previous
 * checkpoints readable.
 *
 * Every committed snapshot is written, in the order committed. Up to `max_pending` snapshots
 * may be staged and not yet written, each in a staging area of its own (huge-page backed,
 * populated when it grows, kept between saves so snapshots copy into warm memory); when that
 * many are, fl_checkpointer_begin() waits for the writer (back-pressure: nothing is skipped
 * or coalesced). One snapshot is filled at a time. The writer thread runs no Python and holds
 * a reference; `lock` (inside) guards the ring of staging areas, their states and the error.
 */
#ifndef FL_CHECKPOINT_H
#define FL_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "base/fl_pool.h"
#include "checkpoint/fl_safetensors.h"

typedef struct fl_checkpointer fl_checkpointer;

enum { FL_CHECKPOINT_MAX_PENDING = 64 };

/* The metadata key holding the data buffer's CRC-32 (zlib's), as 8 lowercase hex digits. */
#define FL_CHECKPOINT_CRC_KEY "fastloop.crc32"

/* Creates `dir` if needed, removes the temp files no writer holds (left by writers that died;
 * never one being written, by this process or another: fl_checkpoint.c says how), and starts
 * the writer thread. Returns 0 and sets *out, or FL_ESYS (detail: path)/FL_ENOMEM/FL_EINVAL
 * (keep < 1, max_pending outside 1..FL_CHECKPOINT_MAX_PENDING). */
int fl_checkpointer_new(const char *dir, int keep, int max_pending, fl_checkpointer **out);

/* Waits up to timeout_s (< 0: forever) until no other snapshot is being filled and fewer than
 * max_pending wait to be written, then reserves a staging area for n entries and `bytes` of
 * data: *entries and *data point into it until fl_checkpointer_commit() or _abort(). Returns
 * 0, FL_EAGAIN/FL_ETIMEDOUT (busy), FL_ECLOSED or FL_ENOMEM. */
int fl_checkpointer_begin(fl_checkpointer *c, size_t n, size_t bytes, double timeout_s,
                          fl_st_entry **entries, unsigned char **data);

/* Copies each entry's nbytes from sources[i] to data + entries[i].offset (entries back to back
 * from 0, as fl_st_check() wants them), in 4 MiB chunks over exec's threads: one core's
 * memcpy does not reach a large machine's memory bandwidth. Blocks until done; never fails. */
void fl_checkpoint_copy(fl_exec exec, const fl_st_entry *entries, size_t n,
                        const void *const *sources, unsigned char *data);

/* Hands the reserved snapshot to the writer as checkpoint `step` (>= 0), with n_meta
 * metadata pairs (copied). Returns 0; or FL_EINVAL (an entry fl_st_check() refuses, or data
 * past the reservation: the detail names it) or FL_ENOMEM, and then gives the reservation
 * back unwritten. Never blocks. */
int fl_checkpointer_commit(fl_checkpointer *c, int64_t step, const fl_st_meta *meta, size_t n_meta);

/* Gives the reservation back unwritten (the owner failed while filling it). */
void fl_checkpointer_abort(fl_checkpointer *c);

/* Waits up to timeout_s until every committed snapshot is written. Returns 0, FL_EAGAIN or
 * FL_ETIMEDOUT. */
int fl_checkpointer_wait(fl_checkpointer *c, double timeout_s);

/* Copies the first write error not yet taken into message and returns 1, else returns 0. */
int fl_checkpointer_take_error(fl_checkpointer *c, char *message, size_t len);

typedef struct fl_checkpoint_stats {
    uint64_t written;         /* checkpoints published */
    uint64_t bytes;           /* bytes of tensor data in them */
    double last_write_s;      /* seconds the last write took, fsyncs included */
    int64_t last_step;        /* step of the last published checkpoint; -1 before any */
    int pending;              /* snapshots committed and not yet written */
    int64_t pending_step;     /* step of the newest of them; -1 when none */
} fl_checkpoint_stats;

void fl_checkpointer_stats(fl_checkpointer *c, fl_checkpoint_stats *out);

/* Refuses new snapshots (fl_checkpointer_begin() then answers FL_ECLOSED); pending ones, and
 * one being filled, are still written. With wait set, returns once the writer has finished
 * (every committed snapshot written, its files closed); else returns at once. Idempotent, and
 * safe from any number of threads at once: the first call joins (wait) or detaches the writer,
 * later ones that wait wait for it to finish. */
void fl_checkpointer_close(fl_checkpointer *c, int wait);

/* Waits up to timeout_s (< 0: forever) until the writer has finished after close. Returns 0
 * or FL_ETIMEDOUT. Any thread. */
int fl_checkpointer_wait_closed(fl_checkpointer *c, double timeout_s);

/* Drops the owner's reference (after close). NULL is a no-op. */
void fl_checkpointer_release(fl_checkpointer *c);

/* "<dir>/ckpt-<12-digit step>.safetensors" into buf. */
void fl_checkpoint_path(const char *dir, int64_t step, char *buf, size_t len);

#endif
