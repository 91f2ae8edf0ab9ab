/* fl_pool.h - a pool of C worker threads for data-parallel loops (intra-op parallelism).
 *
 * fl_pool_run() splits an index range [0, n) into chunks that the calling thread and up to
 * `threads - 1` pool workers claim dynamically, and returns once every chunk is done.
 * Several threads may call fl_pool_run() on one pool at the same time; each call makes
 * progress on its own even when every worker is busy elsewhere, because the caller always
 * works on its own chunks. Workers start on demand, run no Python, block every signal (so
 * Ctrl-C reaches the main thread) and live until fl_pool_free().
 */
#ifndef FL_POOL_H
#define FL_POOL_H

#include <stddef.h>

typedef struct fl_pool fl_pool;

/* Processes indices [begin, end). Called concurrently from several threads on disjoint
 * ranges; must not call fl_pool_run() on the same pool. */
typedef void (*fl_range_fn)(void *ctx, size_t begin, size_t end);

enum { FL_POOL_MAX_WORKERS = 256 };

/* Creates a pool with no workers yet. Returns 0 and sets *out, or FL_ENOMEM/FL_ESYS. The
 * caller frees it with fl_pool_free(). */
int fl_pool_new(fl_pool **out);

/* Stops and joins every worker, then frees the pool. No fl_pool_run() may be in flight.
 * NULL is a no-op. */
void fl_pool_free(fl_pool *pool);

/* Runs fn over [0, n) on up to `threads` threads (the caller counts as one), in chunks of at
 * least `grain` indices, and blocks until all of it is done. With pool NULL, threads <= 1
 * or n <= grain it simply calls fn(ctx, 0, n). Starts missing workers (at most
 * FL_POOL_MAX_WORKERS); if the system refuses a thread it carries on with fewer. Never
 * fails. */
void fl_pool_run(fl_pool *pool, int threads, size_t n, size_t grain, fl_range_fn fn, void *ctx);

/* Where a kernel runs: on `threads` threads of `pool` (pool NULL or threads <= 1: serially
 * on the caller's thread). Kernels take it by value. */
typedef struct fl_exec {
    fl_pool *pool;
    int threads;
} fl_exec;

/* fl_pool_run() on an fl_exec. */
static inline void fl_exec_run(fl_exec exec, size_t n, size_t grain, fl_range_fn fn, void *ctx) {
    fl_pool_run(exec.pool, exec.threads, n, grain, fn, ctx);
}

/* Number of worker threads started so far. */
int fl_pool_workers(fl_pool *pool);

#endif
