/* fl_batch_source.h - the operations a consumer needs from a source of batches: epochs,
 * batches in order in recycled slots, and what the source counts.
 *
 * The thread loader (fl_loader.c: C threads fill the slots) and the process pool
 * (fl_procpool.c: forked worker processes fill shared-memory slots) both implement this
 * table, so the layer above (the Python binding, csrc/py/py_batch_source.c) is written once,
 * as fl_nn_backend.h does for devices. A source is `{ops, impl}`: `impl` is the
 * implementation's own handle (fl_loader *, fl_procpool *), still reachable through its typed
 * API for what only it offers (a loader's skipped samples, a pool's worker pids).
 *
 * The contract of every op is that of the implementation's function it stands for
 * (fl_loader.h, fl_procpool.h), in short: one consumer thread calls them all, except
 * `release`, which any thread may call. Ops that wait say so; none needs Python. Plain C.
 * fl_batch_source.c holds what both implementations share (the slot layout).
 */
#ifndef FL_BATCH_SOURCE_H
#define FL_BATCH_SOURCE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fl_batch_source_ops {
    const char *name;   /* "threads", "processes" */
    int start_forks;    /* 1: start_epoch may fork, running the source's fork hooks on the
                         * calling thread (so the caller keeps what they need: the GIL) */
    int release_blocks; /* 1: release may wait a little (it hands the slot to a busy worker) */

    /* Begins `epoch` at batch first_batch (the batches before it are skipped; past the end:
     * an empty epoch), abandoning one in progress. Returns 0, FL_ENOMEM or FL_ESYS. */
    int (*start_epoch)(void *impl, uint64_t epoch, uint64_t first_batch);
    /* 1 when start_epoch would first have to end the workers of an epoch cut short, which
     * can take a second: the caller may call stop first, where waiting is cheaper. */
    int (*needs_stop)(void *impl);
    /* Waits up to timeout_s for the next batch in order: 0 with *slot and *count (the slot is
     * lent until release), FL_EEND after the last batch, FL_EAGAIN/FL_ETIMEDOUT, or the
     * source's error code (error() says what). */
    int (*next)(void *impl, double timeout_s, int *slot, size_t *count);
    /* Gives a lent slot back. Any thread. */
    void (*release)(void *impl, int slot);
    /* Abandons the epoch: ends the workers, forgets batches not delivered; lent slots stay
     * lent. Idempotent. Waits for the workers. */
    void (*stop)(void *impl);
    /* Or NULL: asks the workers to end without waiting for them (next() then returns FL_EEND;
     * the next stop, start_epoch or free joins them). Any thread. */
    void (*request_stop)(void *impl);
    /* Or NULL: free (as `free`) on a thread of its own, then then(arg) there; returns 0, or
     * nonzero when it could not (nothing done). */
    int (*free_later)(void *impl, void (*then)(void *arg), void *arg);

    /* A slot's memory (fields at the offsets the source was built with). */
    void *(*slot)(void *impl, int slot);
    /* Slots lent out now, batches made ahead (filling or ready, not yet handed out), slots
     * in all, batches per epoch. */
    int (*lent)(void *impl);
    int (*ahead)(void *impl);
    int (*slots)(const void *impl);
    uint64_t (*batches)(const void *impl);
    /* The message of the error next() returned ("" if none). */
    const char *(*error)(void *impl);

    /* Stops the workers and frees everything; no slot may still be lent. NULL is a no-op. */
    void (*free)(void *impl);
} fl_batch_source_ops;

typedef struct fl_batch_source {
    const fl_batch_source_ops *ops;
    void *impl;
} fl_batch_source;

/* The layout of a slot, the same in both sources: field f's batch (`batch` samples of
 * sample_bytes[f] each) at offsets[f], each aligned to FL_SLOT_ALIGN bytes; *slot_bytes in all
 * (at least FL_SLOT_ALIGN). Every size is checked: returns 0, or FL_EOVERFLOW naming
 * batch_size (*slot_bytes unchanged). Pure; cannot block. */
enum { FL_SLOT_ALIGN = 64 };
int fl_batch_layout(const size_t *sample_bytes, size_t n_fields, size_t batch, size_t *offsets,
                    size_t *slot_bytes);

#endif
