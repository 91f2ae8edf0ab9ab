/* fl_checkpoint.h - background, atomic checkpoints: the owner copies a state into a staging
 * buffer (fast, memcpy) and a writer thread turns it into `<dir>/ckpt-<step>.npz` -- a temp
 * file in the same directory, fsync, rename, fsync of the directory -- then deletes all but
 * the newest `keep` checkpoints. A file only ever appears under its final name complete,
 * so a crash at any moment leaves the previous checkpoints readable.
 *
 * One snapshot at a time: fl_checkpointer_begin() waits while another is being filled,
 * waits to be written, or is being written. The staging buffer (huge-page backed, populated
 * when it grows, so even the first copy takes no page faults) is kept between saves (so
 * snapshots copy into warm memory). The writer thread runs no Python and holds a reference;
 * `lock` (inside) guards the state machine, the staging buffer's size and the error.
 */
#ifndef FL_CHECKPOINT_H
#define FL_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/fl_npz.h"

typedef struct fl_checkpointer fl_checkpointer;

/* Creates `dir` if needed, removes temp files left by dead writers, and starts the writer
 * thread. Returns 0 and sets *out, or FL_ESYS (detail: path)/FL_ENOMEM/FL_EINVAL. */
int fl_checkpointer_new(const char *dir, int keep, fl_checkpointer **out);

/* Waits up to timeout_s until no snapshot is pending or being written, then reserves the
 * staging area for n entries and `bytes` of data: *entries and *data point into it until
 * fl_checkpointer_commit() or _abort(). Returns 0, FL_EAGAIN/FL_ETIMEDOUT (busy),
 * FL_ECLOSED or FL_ENOMEM. */
int fl_checkpointer_begin(fl_checkpointer *c, size_t n, size_t bytes, double timeout_s,
                          fl_npz_entry **entries, unsigned char **data);

/* Hands the reserved snapshot to the writer as checkpoint `step` (>= 0). */
void fl_checkpointer_commit(fl_checkpointer *c, int64_t step);

/* Gives the reservation back unwritten (the owner failed while filling it). */
void fl_checkpointer_abort(fl_checkpointer *c);

/* Waits up to timeout_s until nothing is pending or being written. Returns 0, FL_EAGAIN or
 * FL_ETIMEDOUT. */
int fl_checkpointer_wait(fl_checkpointer *c, double timeout_s);

/* Copies the first write error not yet taken into message and returns 1, else returns 0. */
int fl_checkpointer_take_error(fl_checkpointer *c, char *message, size_t len);

typedef struct fl_checkpoint_stats {
    uint64_t written;         /* checkpoints published */
    uint64_t bytes;           /* bytes of array data in them */
    double last_write_s;      /* seconds the last write took, fsyncs included */
    int64_t last_step;        /* step of the last published checkpoint; -1 before any */
} fl_checkpoint_stats;

void fl_checkpointer_stats(fl_checkpointer *c, fl_checkpoint_stats *out);

/* Refuses new snapshots; a pending one is still written. With wait set, joins the writer. */
void fl_checkpointer_close(fl_checkpointer *c, int wait);

/* Drops the owner's reference (after close). NULL is a no-op. */
void fl_checkpointer_release(fl_checkpointer *c);

/* "<dir>/ckpt-<12-digit step>.npz" into buf. */
void fl_checkpoint_path(const char *dir, int64_t step, char *buf, size_t len);

#endif
