/* fl_procpool.h - batches assembled by forked worker processes into shared-memory slots.
 *
 * The slots live in one anonymous MAP_SHARED mapping made before any fork, so every worker
 * writes batches straight into memory the parent reads: no pickling, no file in /dev/shm,
 * nothing to leak when a process dies (the mapping goes with its last user). Each worker has
 * a Unix socket pair with the parent: commands ("fill batch b into slot s with these sample
 * indices") one way, results ("done", with the bytes of the batch that did not fit its slot,
 * or "failed at an index" with a message) the other. The
 * parent notices a dead worker at once as a hang-up on its socket, and reaps it; a dead
 * worker never holds a lock the parent needs, because they share none.
 *
 * Forking: fl_procpool_start_epoch() forks the workers if none run, calling the hooks
 * around fork() (the Python binding uses them for PyOS_BeforeFork/AfterFork_*), without the
 * pool's lock: a hook may call fl_procpool_release() (Python code freeing a batch) or
 * fl_procpool_stop(). A worker ignores SIGINT (the parent owns Ctrl-C) and runs `fill` for
 * each command until its socket closes, then _exit(0)s. Fork before starting threads or
 * touching CUDA: a child gets only the forking thread.
 *
 * A worker never outlives its parent process, and outlives the thread that forked it. Linux's
 * PR_SET_PDEATHSIG fires when the forking *thread* ends, not the process, so it is set only
 * when the main thread forks (its end is the process's), where it ends a worker at once
 * however busy. Any worker also notices its parent's death itself: as EOF on its socket (the
 * parent's end closes with it), and, since a process the parent forked later (another pool's
 * worker, a plain fork) may hold a copy of that end, by checking its parent pid every 200 ms
 * while it waits for a command and between samples (fl_procpool_exit_if_orphaned(), which
 * the fill calls), as torch's DataLoader workers check theirs between batches. So a worker
 * forked by another thread and busy in one sample ends when that sample returns.
 *
 * Threads: every call may come from any thread, concurrently (fl_procpool_free excepted). A
 * batch goes to one next() call only; a next() waiting when its epoch is stopped or replaced
 * returns FL_EEND. The pool's lock guards its state only: no call holds it across a blocking
 * system call or a sleep, so fl_procpool_release() and the getters return at once whatever
 * another thread is doing (reading a result, writing a task, reaping workers). Stopping is
 * done by one thread at a time; a stop or a start_epoch that comes meanwhile waits for it.
 */
#ifndef FL_PROCPOOL_H
#define FL_PROCPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/fl_metrics.h"
#include "data/fl_batch_source.h"
#include "data/fl_sampler.h"

/* Bytes of a batch that did not fit its slot, which a fill hands over to travel after its
 * result on the worker's socket (the parent keeps them with the slot: fl_procpool_extra). */
typedef struct fl_proc_extra {
    const void *data; /* the worker's memory, read before its next fill */
    size_t len;       /* 0: none (the default) */
} fl_proc_extra;

/* Runs in a worker: fill `slot` with the samples `ids` (count of them); `seed` is the
 * epoch's augmentation seed (fl_sampler_epoch_seed); `extra` starts empty. Returns 0, or
 * non-zero after writing into `error` (error_len bytes) what went wrong and setting *index to
 * the failing sample (-1: none in particular). */
typedef int (*fl_proc_fill_fn)(void *ctx, int worker, uint64_t seed, const int64_t *ids,
                               size_t count, unsigned char *slot, fl_proc_extra *extra,
                               int64_t *index, char *error, size_t error_len);

typedef struct fl_proc_hooks {
    void (*before_fork)(void *ctx);
    void (*after_fork_parent)(void *ctx);
    void (*after_fork_child)(void *ctx, int worker); /* then the worker loop starts */
    void *ctx;
} fl_proc_hooks;

typedef struct fl_procpool_config {
    fl_sampler sampler;
    int workers;      /* >= 1 */
    int prefetch;     /* batches in flight per worker, >= 1: at most workers * prefetch batches
                       * assigned or ready, not yet handed out; slots = that + 2, so the consumer
                       * may hold two (the one in use, the one being taken) and the rest stay in
                       * flight, as DataLoader's prefetch_factor */
    size_t slot_bytes;
    fl_proc_fill_fn fill;
    void *fill_ctx;
    fl_proc_hooks hooks;
    fl_metrics *metrics; /* optional: "loader/samples", "loader/batches" */
} fl_procpool_config;

typedef enum fl_proc_failure { FL_PROC_DIED = 1, FL_PROC_FAILED = 2 } fl_proc_failure;

typedef struct fl_proc_error {
    fl_proc_failure kind;
    int worker;
    pid_t pid;
    int signal;      /* DIED: the signal that killed it, or 0 */
    int exit_status; /* DIED without a signal: its exit status */
    int64_t index;   /* FAILED: the sample */
    char text[8192]; /* DIED: a sentence; FAILED: what fill wrote */
} fl_proc_error;

typedef struct fl_procpool fl_procpool;

/* Maps the slots; forks nothing yet. Returns 0 and sets *out, or FL_EINVAL/FL_ENOMEM. */
int fl_procpool_new(const fl_procpool_config *config, fl_procpool **out);

/* Begins an epoch (abandoning one in progress) and forks the workers if none run. If another
 * thread is stopping the workers, waits for that first; if another thread is forking them,
 * does not wait: they serve this epoch. Returns 0, FL_ENOMEM or FL_ESYS (fork or pipe failed;
 * detail says which). A stop from another thread while it forks ends the new epoch at once. */
int fl_procpool_start_epoch(fl_procpool *pool, uint64_t epoch);

/* fl_procpool_start_epoch, resuming at batch first_batch of the epoch (the batches before
 * it are skipped, never made; past the end: an empty epoch). Same returns. */
int fl_procpool_start_epoch_at(fl_procpool *pool, uint64_t epoch, uint64_t first_batch);

/* 1 when starting an epoch would first stop the workers (the last epoch was cut short or
 * failed), so the caller can do that without holding what fork needs (the GIL). */
int fl_procpool_needs_stop(fl_procpool *pool);

/* Hands out work and waits up to timeout_s for the next batch in order. Returns 0 with
 * *slot and *count (the slot is lent until release), FL_EEND after the last batch or when the
 * epoch is stopped or replaced (by any thread) while it waits, FL_EAGAIN/FL_ETIMEDOUT, or
 * FL_EWORKER (fl_procpool_error() says what; on a death every worker has already been
 * stopped and reaped). */
int fl_procpool_next(fl_procpool *pool, double timeout_s, int *slot, size_t *count);

/* The failure behind the last FL_EWORKER: a copy for the calling thread, valid until its next
 * call. Cannot fail. */
const fl_proc_error *fl_procpool_error(fl_procpool *pool);

/* The extra bytes the worker sent with the batch in lent `slot` (see fl_proc_extra): a
 * pointer valid until the slot is released and *len, or NULL and 0 if it sent none. */
const void *fl_procpool_extra(fl_procpool *pool, int slot, size_t *len);

/* Batches of uneven sizes, as a batch sampler gives them: batch b is the epoch order's
 * positions ends[b - 1] (0 for b = 0) up to ends[b], 1 to batch_size samples each, and ends[n - 1]
 * is the shard's size (fl_sampler_shard_size). Replaces the split into batch_size samples
 * (ends NULL and n 0: back to it) and the number of batches, for the epochs started next.
 * Copies `ends`. Returns 0, FL_EINVAL (an epoch is in progress, or a bad end: the detail
 * says which batch) or FL_ENOMEM. */
int fl_procpool_set_batches(fl_procpool *pool, const uint64_t *ends, uint64_t n);

/* Gives a lent slot back and hands it to a worker at once if the epoch has work left (a
 * short socket write, unless another thread is writing tasks: it takes this one too). Any
 * thread; never waits for another thread's I/O or reaping. */
void fl_procpool_release(fl_procpool *pool, int slot);

/* Abandons the epoch (a next() waiting returns FL_EEND), ends the workers (their sockets
 * shut down; after a second, SIGKILL), reaps them, and forgets batches not delivered. Lent
 * slots stay lent. Idempotent, and safe from many threads at once: one of them reaps, the
 * others wait until it is done (or until a later start_epoch supersedes the stop). Called
 * from the fork hooks of a start_epoch in progress, it only asks that start to end its
 * workers once forked. Waits for the workers (up to the second of grace). */
void fl_procpool_stop(fl_procpool *pool);

/* Worker pids (0 when not running), slot memory, slots lent now and in all, and batches
 * assigned or ready but not yet handed out. */
pid_t fl_procpool_pid(fl_procpool *pool, int worker);
void *fl_procpool_slot(fl_procpool *pool, int slot);
int fl_procpool_lent(fl_procpool *pool);
int fl_procpool_slots(const fl_procpool *pool);
int fl_procpool_ahead(fl_procpool *pool);
uint64_t fl_procpool_batches(const fl_procpool *pool);

/* Stops the workers and unmaps the slots. No slot may still be in use, and no other thread
 * may be calling into the pool. NULL is a no-op. */
void fl_procpool_free(fl_procpool *pool);

/* For a fill, in a worker process, between samples: _exit(0)s at once if the process that
 * forked this worker has died (one getppid()), as the worker does between batches. A no-op
 * in any other process. */
void fl_procpool_exit_if_orphaned(void);

/* The pool as a batch source (fl_batch_source.h); it stays the pool's handle: the table's
 * free is fl_procpool_free, its error the text of fl_procpool_error(). Cannot fail. */
fl_batch_source fl_procpool_source(fl_procpool *pool);

#endif
