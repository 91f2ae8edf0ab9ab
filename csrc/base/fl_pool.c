/* fl_pool.c - worker threads claiming chunks of submitted jobs.
 *
 * A job lives on its caller's stack. The caller links it into `jobs` asking for some
 * helpers, then claims chunks itself through the job's atomic cursor. Before returning it
 * unlinks the job and waits until no helper is still inside it.
 *
 * Locking: `mutex` protects the job list, every job's helpers_wanted/helpers_active, the
 * worker array and `stopping`. The chunk cursor `next` is an atomic: claiming a chunk
 * needs no ordering beyond atomicity (relaxed), since completion is published through the
 * mutex when a helper leaves the job.
 */
#include "base/fl_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/fl_error.h"
#include "base/fl_thread.h"
#include "base/fl_time.h"

typedef struct pool_job {
    fl_range_fn fn;
    void *ctx;
    size_t n;
    size_t chunk;
    atomic_size_t next;
    int helpers_wanted; /* workers that may still join */
    int helpers_active; /* workers inside run_chunks() now */
    struct pool_job *next_job;
} pool_job;

struct fl_pool {
    pthread_mutex_t mutex;
    pthread_cond_t work_available;
    pthread_cond_t helper_left;
    pool_job *jobs; /* jobs still wanting helpers, oldest first */
    pthread_t threads[FL_POOL_MAX_WORKERS];
    int workers;
    int stopping;
};

static void run_chunks(pool_job *job) {
    for (;;) {
        size_t begin = atomic_fetch_add_explicit(&job->next, job->chunk, memory_order_relaxed);
        if (begin >= job->n)
            return;
        size_t end = job->n - begin < job->chunk ? job->n : begin + job->chunk;
        job->fn(job->ctx, begin, end);
    }
}

static void unlink_job_locked(fl_pool *pool, pool_job *job) {
    for (pool_job **link = &pool->jobs; *link != NULL; link = &(*link)->next_job) {
        if (*link == job) {
            *link = job->next_job;
            return;
        }
    }
}

/* Worker thread: sleeps until a job wants a helper, works on it, repeats until stopping. */
static void *worker_main(void *arg) {
    fl_pool *pool = arg;
    pthread_mutex_lock(&pool->mutex);
    while (!pool->stopping) {
        pool_job *job = pool->jobs;
        if (job == NULL) {
            pthread_cond_wait(&pool->work_available, &pool->mutex);
            continue;
        }
        if (--job->helpers_wanted == 0)
            unlink_job_locked(pool, job);
        job->helpers_active++;
        pthread_mutex_unlock(&pool->mutex);
        run_chunks(job);
        pthread_mutex_lock(&pool->mutex);
        if (--job->helpers_active == 0)
            pthread_cond_broadcast(&pool->helper_left);
    }
    pthread_mutex_unlock(&pool->mutex);
    return NULL;
}

int fl_pool_new(fl_pool **out) {
    *out = NULL;
    fl_pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL)
        return FL_ENOMEM;
    if (pthread_mutex_init(&pool->mutex, NULL) != 0)
        goto fail_alloc;
    if (fl_cond_init(&pool->work_available) != 0)
        goto fail_mutex;
    if (fl_cond_init(&pool->helper_left) != 0)
        goto fail_work;
    *out = pool;
    return FL_OK;

fail_work:
    pthread_cond_destroy(&pool->work_available);
fail_mutex:
    pthread_mutex_destroy(&pool->mutex);
fail_alloc:
    free(pool);
    return FL_ESYS;
}

void fl_pool_free(fl_pool *pool) {
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->mutex);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->work_available);
    int workers = pool->workers;
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 0; i < workers; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->helper_left);
    pthread_cond_destroy(&pool->work_available);
    pthread_mutex_destroy(&pool->mutex);
    free(pool);
}

/* Starts workers until there are `wanted` (capped); called with the mutex held. */
static void grow_locked(fl_pool *pool, int wanted) {
    if (wanted > FL_POOL_MAX_WORKERS)
        wanted = FL_POOL_MAX_WORKERS;
    while (pool->workers < wanted &&
           fl_thread_start(&pool->threads[pool->workers], worker_main, pool) == FL_OK)
        pool->workers++;
}

void fl_pool_run(fl_pool *pool, int threads, size_t n, size_t grain, fl_range_fn fn, void *ctx) {
    if (grain == 0)
        grain = 1;
    if (pool == NULL || threads <= 1 || n <= grain) {
        fn(ctx, 0, n);
        return;
    }
    /* Four chunks per thread balance uneven progress without much claiming traffic. */
    size_t chunk = n / ((size_t)threads * 4);
    if (chunk < grain)
        chunk = grain;
    pool_job job = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk};
    atomic_init(&job.next, 0);

    pthread_mutex_lock(&pool->mutex);
    grow_locked(pool, threads - 1);
    job.helpers_wanted = threads - 1 < pool->workers ? threads - 1 : pool->workers;
    if (job.helpers_wanted > 0) {
        pool_job **tail = &pool->jobs;
        while (*tail != NULL)
            tail = &(*tail)->next_job;
        *tail = &job;
        pthread_cond_broadcast(&pool->work_available);
    }
    pthread_mutex_unlock(&pool->mutex);

    run_chunks(&job);

    pthread_mutex_lock(&pool->mutex);
    if (job.helpers_wanted > 0) /* still linked: nobody else may join now */
        unlink_job_locked(pool, &job);
    job.helpers_wanted = 0;
    while (job.helpers_active > 0)
        pthread_cond_wait(&pool->helper_left, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}

int fl_pool_workers(fl_pool *pool) {
    pthread_mutex_lock(&pool->mutex);
    int workers = pool->workers;
    pthread_mutex_unlock(&pool->mutex);
    return workers;
}
