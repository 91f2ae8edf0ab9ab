/* test_procpool.c - the process pool with a C fill function: every sample once and in
 * order through shared memory, persistent workers, a failing sample reported with its index,
 * a SIGKILLed worker reported within a second with no zombie left, restarts, epochs
 * resumed at a batch, extra bytes that did not fit a slot, batches of uneven sizes; and
 * threads: a release never waits on another thread's I/O or reaping, stops from many threads
 * while two iterate, workers that outlive the thread that forked them but not their process. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "base/fl_error.h"
#include "data/fl_procpool.h"
#include "base/fl_time.h"

enum { SAMPLES = 5000, BATCH = 64 };

/* Writes each sample's index (and the worker) into the slot; fails at index `fail_at`; at
 * `stall_at` the worker stops itself (SIGSTOP: it neither answers nor exits until SIGKILL),
 * first shutting its socket down when `hang_up_first` is set. */
static int64_t fail_at = -1, stall_at = -1;
static int hang_up_first;

/* In a worker: shuts down every socket it holds (its end of the pool's), then stops itself. */
static void stall(void) {
    for (int fd = 3; hang_up_first && fd < 1024; fd++) {
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode))
            shutdown(fd, SHUT_RDWR);
    }
    raise(SIGSTOP);
}

static int fill(void *ctx, int worker, uint64_t seed, const int64_t *ids, size_t count,
                unsigned char *slot, fl_proc_extra *extra, int64_t *index, char *error,
                size_t error_len) {
    (void)ctx, (void)seed, (void)extra;
    int64_t *out = (int64_t *)slot;
    for (size_t i = 0; i < count; i++) {
        if (ids[i] == stall_at)
            stall();
        if (ids[i] == fail_at) {
            *index = ids[i];
            snprintf(error, error_len, "ValueError\nsample %lld is broken\n(traceback)", (long long)ids[i]);
            return 1;
        }
        out[2 * i] = ids[i];
        out[2 * i + 1] = worker;
    }
    return 0;
}

static fl_procpool *make_pool(int workers, int shuffle) {
    fl_procpool_config config = {
        .sampler = {.n = SAMPLES, .shuffle = shuffle, .seed = 1, .world_size = 1, .batch_size = BATCH},
        .workers = workers, .prefetch = 2, .slot_bytes = BATCH * 2 * sizeof(int64_t), .fill = fill,
    };
    fl_procpool *pool = NULL;
    CHECK(fl_procpool_new(&config, &pool) == FL_OK);
    return pool;
}

/* Consumes an epoch; returns how many samples were seen exactly once (all must be). */
static int run_epoch(fl_procpool *pool, uint64_t epoch, int *workers_seen) {
    static unsigned char seen[SAMPLES];
    memset(seen, 0, sizeof seen);
    CHECK(fl_procpool_start_epoch(pool, epoch) == FL_OK);
    int slot, rc;
    size_t count;
    while ((rc = fl_procpool_next(pool, 10, &slot, &count)) == FL_OK) {
        const int64_t *data = fl_procpool_slot(pool, slot);
        for (size_t i = 0; i < count; i++) {
            seen[data[2 * i]]++;
            *workers_seen |= 1 << data[2 * i + 1];
        }
        fl_procpool_release(pool, slot);
    }
    CHECK(rc == FL_EEND);
    int once = 0;
    for (int i = 0; i < SAMPLES; i++)
        once += seen[i] == 1;
    return once;
}

static void test_every_sample_once_through_shared_memory(void) {
    for (int workers = 1; workers <= 3; workers++) {
        fl_procpool *pool = make_pool(workers, 1);
        int seen = 0;
        CHECK(run_epoch(pool, 0, &seen) == SAMPLES);
        pid_t first = fl_procpool_pid(pool, 0);
        CHECK(first > 0);
        CHECK(run_epoch(pool, 1, &seen) == SAMPLES);
        CHECK(fl_procpool_pid(pool, 0) == first); /* persistent across finished epochs */
        CHECK(seen == (1 << workers) - 1);       /* every worker took part */
        fl_procpool_free(pool);
        CHECK(kill(first, 0) != 0 && errno == ESRCH); /* gone and reaped */
    }
}

static void test_an_epoch_started_at_a_batch_skips_the_earlier_ones(void) {
    fl_procpool *pool = make_pool(2, 1);
    static int64_t want[SAMPLES];
    size_t n = 0, count;
    int slot;
    CHECK(fl_procpool_start_epoch(pool, 4) == FL_OK); /* the whole epoch, for reference */
    while (fl_procpool_next(pool, 10, &slot, &count) == FL_OK) {
        const int64_t *data = fl_procpool_slot(pool, slot);
        for (size_t i = 0; i < count; i++)
            want[n++] = data[2 * i];
        fl_procpool_release(pool, slot);
    }
    CHECK(fl_procpool_start_epoch_at(pool, 4, 70) == FL_OK); /* resumed at batch 70 of 79 */
    size_t got = 70 * BATCH;
    while (fl_procpool_next(pool, 10, &slot, &count) == FL_OK) {
        const int64_t *data = fl_procpool_slot(pool, slot);
        for (size_t i = 0; i < count; i++)
            CHECK(data[2 * i] == want[got++]);
        fl_procpool_release(pool, slot);
    }
    CHECK(got == n && n == SAMPLES);
    CHECK(fl_procpool_start_epoch_at(pool, 5, 1000) == FL_OK); /* past the end: an empty epoch */
    CHECK(fl_procpool_next(pool, 10, &slot, &count) == FL_EEND);
    fl_procpool_free(pool);
}

static void test_a_failing_sample_is_reported_with_its_index_after_earlier_batches(void) {
    fl_procpool *pool = make_pool(2, 0);
    fail_at = 10 * BATCH + 5;
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);
    int slot, rc, batches = 0;
    size_t count;
    while ((rc = fl_procpool_next(pool, 10, &slot, &count)) == FL_OK) {
        fl_procpool_release(pool, slot);
        batches++;
    }
    CHECK(rc == FL_EWORKER && batches == 10);
    const fl_proc_error *e = fl_procpool_error(pool);
    CHECK(e->kind == FL_PROC_FAILED && e->index == fail_at && strstr(e->text, "is broken"));
    fail_at = -1;
    int seen = 0;
    CHECK(run_epoch(pool, 1, &seen) == SAMPLES); /* the next epoch starts afresh */
    fl_procpool_free(pool);
}

static void test_a_killed_worker_is_reported_within_a_second_and_reaped(void) {
    fl_procpool *pool = make_pool(2, 0);
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);
    int slot;
    size_t count;
    CHECK(fl_procpool_next(pool, 10, &slot, &count) == FL_OK);
    fl_procpool_release(pool, slot);
    pid_t victim = fl_procpool_pid(pool, 1), other = fl_procpool_pid(pool, 0);
    kill(victim, SIGKILL);
    double start = fl_monotonic();
    int rc;
    while ((rc = fl_procpool_next(pool, 5, &slot, &count)) == FL_OK)
        fl_procpool_release(pool, slot);
    CHECK(rc == FL_EWORKER && fl_monotonic() - start < 5.0); /* ~50 ms idle; margin for load, TSan */
    const fl_proc_error *e = fl_procpool_error(pool);
    CHECK(e->kind == FL_PROC_DIED && e->pid == victim && e->signal == SIGKILL);
    CHECK(strstr(e->text, "died of signal 9") != NULL && strstr(e->text, "outside fastloop") != NULL);
    CHECK(kill(victim, 0) != 0 && kill(other, 0) != 0); /* both gone, none a zombie */
    CHECK(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD);
    int seen = 0;
    CHECK(run_epoch(pool, 1, &seen) == SAMPLES); /* fresh workers */
    fl_procpool_free(pool);
}

static void test_stopping_mid_epoch_ends_the_workers(void) {
    fl_procpool *pool = make_pool(3, 1);
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);
    int slot;
    size_t count;
    CHECK(fl_procpool_next(pool, 10, &slot, &count) == FL_OK); /* held: stays lent */
    pid_t pids[3] = {fl_procpool_pid(pool, 0), fl_procpool_pid(pool, 1), fl_procpool_pid(pool, 2)};
    double start = fl_monotonic();
    fl_procpool_stop(pool);
    CHECK(fl_monotonic() - start < 5.0); /* well under 1 s idle; margin for load, TSan */
    for (int w = 0; w < 3; w++)
        CHECK(kill(pids[w], 0) != 0);
    CHECK(fl_procpool_lent(pool) == 1);
    fl_procpool_release(pool, slot);
    int seen = 0;
    CHECK(run_epoch(pool, 1, &seen) == SAMPLES);
    fl_procpool_free(pool);
}

/* A before_fork hook that gives back a batch still lent from the last epoch, as Python code
 * run by PyOS_BeforeFork may when it frees one: the release must not wait on the fork. */
typedef struct {
    fl_procpool *pool;
    int slot;
} release_at_fork;

static void release_before_fork(void *ctx) {
    release_at_fork *r = ctx;
    if (r->slot >= 0)
        fl_procpool_release(r->pool, r->slot);
    r->slot = -1;
}

static void test_a_batch_released_by_a_fork_hook_does_not_deadlock_the_epoch_start(void) {
    release_at_fork r = {NULL, -1};
    fl_procpool_config config = {
        .sampler = {.n = SAMPLES, .world_size = 1, .batch_size = BATCH},
        .workers = 2, .prefetch = 2, .slot_bytes = BATCH * 2 * sizeof(int64_t), .fill = fill,
        .hooks = {.before_fork = release_before_fork, .ctx = &r},
    };
    CHECK(fl_procpool_new(&config, &r.pool) == FL_OK);
    size_t count;
    CHECK(fl_procpool_start_epoch(r.pool, 0) == FL_OK);
    CHECK(fl_procpool_next(r.pool, 10, &r.slot, &count) == FL_OK); /* kept: the epoch is left */
    fl_procpool_stop(r.pool);
    CHECK(fl_procpool_lent(r.pool) == 1);
    CHECK(fl_procpool_start_epoch(r.pool, 1) == FL_OK); /* forks: the hook releases the slot */
    CHECK(fl_procpool_lent(r.pool) == 0);
    int slot, rc, batches = 0;
    while ((rc = fl_procpool_next(r.pool, 10, &slot, &count)) == FL_OK) {
        batches++;
        fl_procpool_release(r.pool, slot);
    }
    CHECK(rc == FL_EEND);
    CHECK(batches == (SAMPLES + BATCH - 1) / BATCH);
    fl_procpool_free(r.pool);
}

/* The same pool driven through its batch-source table, as the Python binding drives it. */
static void test_the_batch_source_table_runs_the_pool(void) {
    fl_procpool *pool = make_pool(2, 1);
    fl_batch_source src = fl_procpool_source(pool);
    CHECK(src.impl == pool && src.ops->start_forks && src.ops->release_blocks);
    CHECK(src.ops->batches(src.impl) == (SAMPLES + BATCH - 1) / BATCH);
    CHECK(src.ops->slots(src.impl) == 2 * 2 + 2);
    CHECK(src.ops->start_epoch(src.impl, 0, 0) == FL_OK);
    static unsigned char seen[SAMPLES];
    memset(seen, 0, sizeof seen);
    int slot, rc, once = 0;
    size_t count;
    while ((rc = src.ops->next(src.impl, 10, &slot, &count)) == FL_OK) {
        CHECK(src.ops->lent(src.impl) == 1);
        const int64_t *data = src.ops->slot(src.impl, slot);
        for (size_t i = 0; i < count; i++)
            seen[data[2 * i]]++;
        src.ops->release(src.impl, slot);
    }
    CHECK(rc == FL_EEND && src.ops->lent(src.impl) == 0);
    for (int i = 0; i < SAMPLES; i++)
        once += seen[i] == 1;
    CHECK(once == SAMPLES);
    CHECK(!src.ops->needs_stop(src.impl)); /* finished: the workers stay for the next epoch */
    CHECK(src.ops->start_epoch(src.impl, 1, 0) == FL_OK);
    CHECK(src.ops->next(src.impl, 10, &slot, &count) == FL_OK);
    src.ops->release(src.impl, slot);
    CHECK(src.ops->needs_stop(src.impl)); /* cut short */
    src.ops->stop(src.impl);
    CHECK(!src.ops->needs_stop(src.impl) && src.ops->next(src.impl, 0, &slot, &count) == FL_EEND);
    fail_at = 3;
    CHECK(src.ops->start_epoch(src.impl, 2, 0) == FL_OK);
    while ((rc = src.ops->next(src.impl, 10, &slot, &count)) == FL_OK)
        src.ops->release(src.impl, slot);
    fail_at = -1;
    CHECK(rc == FL_EWORKER && strstr(src.ops->error(src.impl), "sample 3 is broken"));
    src.ops->free(src.impl);
}

/* Sends every batch's ids again as extra bytes, a batch in 7 with 3 MB of them: more than a
 * socket buffer holds, so the parent must read while the worker writes. */
static int fill_with_extra(void *ctx, int worker, uint64_t seed, const int64_t *ids, size_t count,
                           unsigned char *slot, fl_proc_extra *extra, int64_t *index, char *error,
                           size_t error_len) {
    static int64_t big[3 << 17];
    int rc = fill(ctx, worker, seed, ids, count, slot, extra, index, error, error_len);
    int64_t *out = ids[0] / BATCH % 7 == 3 ? big : (int64_t *)slot + 2 * BATCH;
    size_t n = out == big ? sizeof big / sizeof *big : count;
    for (size_t i = 0; i < n; i++)
        out[i] = ids[i % count] + (int64_t)(i / count) * SAMPLES;
    extra->data = out;
    extra->len = n * sizeof *out;
    return rc;
}

static void test_extra_bytes_travel_with_their_batch_and_go_with_its_slot(void) {
    fl_procpool_config config = {
        .sampler = {.n = SAMPLES, .world_size = 1, .batch_size = BATCH},
        .workers = 2, .prefetch = 2, .slot_bytes = BATCH * 4 * sizeof(int64_t),
        .fill = fill_with_extra,
    };
    fl_procpool *pool = NULL;
    CHECK(fl_procpool_new(&config, &pool) == FL_OK);
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);
    int slot, rc, big = 0;
    size_t count, len;
    uint64_t batch = 0;
    while ((rc = fl_procpool_next(pool, 10, &slot, &count)) == FL_OK) {
        const int64_t *data = fl_procpool_slot(pool, slot);
        const int64_t *extra = fl_procpool_extra(pool, slot, &len);
        CHECK(extra != NULL && len % (count * sizeof *extra) == 0);
        for (size_t i = 0; extra != NULL && i < len / sizeof *extra; i++)
            CHECK(extra[i] == data[2 * (i % count)] + (int64_t)(i / count) * SAMPLES);
        big += len > (size_t)1 << 20;
        fl_procpool_release(pool, slot);
        CHECK(fl_procpool_extra(pool, slot, &len) == NULL && len == 0); /* went with the slot */
        batch++;
    }
    CHECK(rc == FL_EEND && batch == (SAMPLES + BATCH - 1) / BATCH && big == 11);
    fl_procpool_free(pool);
}

static void test_uneven_batches_follow_their_ends_and_bad_ends_are_refused(void) {
    fl_procpool *pool = make_pool(2, 0);
    uint64_t short_of_it[] = {1, BATCH + 1, BATCH + 4};
    CHECK(fl_procpool_set_batches(pool, short_of_it, 3) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "68 samples in all, the order 5000") != NULL);
    uint64_t too_big[] = {BATCH + 1, SAMPLES};
    CHECK(fl_procpool_set_batches(pool, too_big, 2) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "batch 0 has 65 samples") != NULL);
    uint64_t empty[] = {3, 3, SAMPLES};
    CHECK(fl_procpool_set_batches(pool, empty, 3) == FL_EINVAL);
    CHECK(strstr(fl_error_detail(), "batch 1 has 0 samples") != NULL);
    static uint64_t ends[SAMPLES];
    size_t n = 0;
    for (uint64_t end = 1; end < SAMPLES; end += 1 + (end * 7919) % BATCH) /* sizes 1 to BATCH */
        ends[n++] = end;
    ends[n++] = SAMPLES;
    CHECK(fl_procpool_set_batches(pool, ends, n) == FL_OK);
    CHECK(fl_procpool_batches(pool) == n);
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);
    int slot;
    size_t count, b = 0;
    uint64_t start = 0;
    while (fl_procpool_next(pool, 10, &slot, &count) == FL_OK) {
        const int64_t *data = fl_procpool_slot(pool, slot);
        CHECK(count == ends[b] - start);
        for (size_t i = 0; i < count; i++)
            CHECK(data[2 * i] == (int64_t)(start + i)); /* no shuffle: the order is 0, 1, ... */
        start = ends[b++];
        fl_procpool_release(pool, slot);
    }
    CHECK(b == n && start == SAMPLES);
    CHECK(fl_procpool_start_epoch_at(pool, 1, 2) == FL_OK); /* resumed: batch 2, ends[1]..ends[2] */
    CHECK(fl_procpool_next(pool, 10, &slot, &count) == FL_OK && count == ends[2] - ends[1]);
    CHECK(((const int64_t *)fl_procpool_slot(pool, slot))[0] == (int64_t)ends[1]);
    CHECK(fl_procpool_set_batches(pool, NULL, 0) == FL_EINVAL); /* mid-epoch */
    fl_procpool_release(pool, slot);
    fl_procpool_stop(pool);
    CHECK(fl_procpool_set_batches(pool, NULL, 0) == FL_OK);     /* back to BATCH each */
    CHECK(fl_procpool_batches(pool) == (SAMPLES + BATCH - 1) / BATCH);
    int seen = 0;
    CHECK(run_epoch(pool, 2, &seen) == SAMPLES);
    fl_procpool_free(pool);
}

static void test_slot_counts_and_sizes_that_wrap_are_refused(void) {
    /* workers * prefetch + 2 was an int product, slot_stride * n_slots unchecked */
    fl_procpool_config config = {
        .sampler = {.n = SAMPLES, .world_size = 1, .batch_size = BATCH},
        .workers = 256, .prefetch = INT32_MAX / 128, .slot_bytes = 64, .fill = fill,
    };
    fl_procpool *pool = NULL;
    CHECK(fl_procpool_new(&config, &pool) == FL_EOVERFLOW && pool == NULL);
    CHECK(strstr(fl_error_detail(), "workers x prefetch") != NULL);
    config.prefetch = 2;
    config.slot_bytes = SIZE_MAX - 10;
    CHECK(fl_procpool_new(&config, &pool) == FL_EOVERFLOW && pool == NULL);
    config.slot_bytes = (size_t)1 << 50; /* no overflow, but 514 slots of a PiB */
    CHECK(fl_procpool_new(&config, &pool) == FL_EINVAL && strstr(fl_error_detail(), "memory") != NULL);
}

/* ---- threads ---- */

/* The state letter of process pid in /proc ('T': stopped, 'Z': a zombie), or 0 if none. */
static char process_state(pid_t pid) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    char *end = got != NULL ? strrchr(line, ')') : NULL; /* the name may hold spaces and ')' */
    return end != NULL && end[1] == ' ' ? end[2] : 0;
}

/* Polls until one of the pool's workers is stopped (SIGSTOP), for up to 10 s; its pid or 0. */
static pid_t wait_for_a_stopped_worker(fl_procpool *pool, int workers) {
    for (double deadline = fl_monotonic() + 10; fl_monotonic() < deadline;) {
        for (int w = 0; w < workers; w++)
            if (fl_procpool_pid(pool, w) > 0 && process_state(fl_procpool_pid(pool, w)) == 'T')
                return fl_procpool_pid(pool, w);
        nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL); /* paces the polling */
    }
    return 0;
}

/* Another thread giving a lent slot back, then calling release (of no slot: the lock and the
 * check) and lent() over and over until told to stop: the longest any call took. */
typedef struct {
    fl_procpool *pool;
    int slot;
    atomic_int done;
    double worst;
    pthread_t thread;
} releaser;

static void *release_over_and_over(void *arg) {
    releaser *r = arg;
    for (int slot = r->slot; !atomic_load_explicit(&r->done, memory_order_relaxed); slot = -1) {
        double start = fl_monotonic();
        fl_procpool_release(r->pool, slot);
        fl_procpool_lent(r->pool);
        double took = fl_monotonic() - start;
        r->worst = took > r->worst ? took : r->worst;
    }
    return NULL;
}

static void start_releaser(releaser *r, fl_procpool *pool, int slot) {
    *r = (releaser){.pool = pool, .slot = slot};
    CHECK(pthread_create(&r->thread, NULL, release_over_and_over, r) == 0);
}

static double stop_releaser(releaser *r) {
    atomic_store_explicit(&r->done, 1, memory_order_relaxed);
    pthread_join(r->thread, NULL);
    return r->worst;
}

/* A worker that ignores the end of its socket (stopped) keeps a stop in its grace period for a
 * second; meanwhile the pool's lock is free: releases from another thread return at once. */
static void test_a_release_does_not_wait_while_a_stop_reaps_a_stuck_worker(void) {
    fl_procpool *pool = make_pool(1, 0);
    stall_at = 2 * BATCH; /* batch 2: assigned once batch 0 is handed out */
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);
    int slot;
    size_t count;
    CHECK(fl_procpool_next(pool, 10, &slot, &count) == FL_OK); /* lent to the other thread */
    pid_t stuck = wait_for_a_stopped_worker(pool, 1);
    CHECK(stuck > 0);
    releaser r;
    start_releaser(&r, pool, slot);
    double start = fl_monotonic();
    fl_procpool_stop(pool); /* the grace, then SIGKILL */
    double stop_took = fl_monotonic() - start, worst = stop_releaser(&r);
    CHECK(stop_took > 0.5);
    CHECK(worst < 0.3);
    if (worst >= 0.3)
        fprintf(stderr, "  a release took %.3f s while the stop took %.3f s\n", worst, stop_took);
    CHECK(fl_procpool_lent(pool) == 0 && kill(stuck, 0) != 0);
    stall_at = -1;
    int seen = 0;
    CHECK(run_epoch(pool, 1, &seen) == SAMPLES);
    fl_procpool_free(pool);
}

/* A worker that closes its socket but does not exit is ended (SIGKILL after the grace) and
 * reported as that, not waited on forever; a release from another thread meanwhile returns
 * at once. */
static void test_a_worker_that_hangs_up_without_exiting_is_killed_and_reported(void) {
    fl_procpool *pool = make_pool(1, 0); /* one worker: its results come before its hang-up */
    stall_at = 2 * BATCH;
    hang_up_first = 1;
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);
    int slot, held, rc;
    size_t count;
    CHECK(fl_procpool_next(pool, 10, &held, &count) == FL_OK);
    releaser r;
    start_releaser(&r, pool, held);
    double start = fl_monotonic();
    while ((rc = fl_procpool_next(pool, 10, &slot, &count)) == FL_OK)
        fl_procpool_release(pool, slot);
    double worst = stop_releaser(&r);
    CHECK(rc == FL_EWORKER && fl_monotonic() - start < 8.0);
    CHECK(worst < 0.3);
    const fl_proc_error *e = fl_procpool_error(pool);
    CHECK(e->kind == FL_PROC_DIED && e->signal == SIGKILL);
    CHECK(strstr(e->text, "did not exit") != NULL && strstr(e->text, "fastloop ended it") != NULL);
    CHECK(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD); /* all reaped */
    stall_at = -1;
    hang_up_first = 0;
    int seen = 0;
    CHECK(run_epoch(pool, 1, &seen) == SAMPLES);
    fl_procpool_free(pool);
}

/* FASTLOOP_STRESS_ROUNDS, or `fallback`. */
static int stress_rounds(int fallback) {
    const char *rounds = getenv("FASTLOOP_STRESS_ROUNDS");
    return rounds != NULL && atoi(rounds) > 0 ? atoi(rounds) : fallback;
}

enum { STOPPERS = 8, ITERATORS = 2, STRESS_BATCHES = 12, STRESS_EPOCHS = 3 };

typedef struct {
    fl_procpool *pool;
    pthread_barrier_t *round_start, *round_end;
    atomic_int *iterating; /* iterators still at their round's epochs */
    int rounds;
    int iterator; /* -1: a stopper */
    unsigned seed;
    int batches, stops, wrong, unexpected;
} stress_thread;

/* Whether a batch is one the unshuffled order makes: BATCH consecutive samples from a
 * multiple of BATCH, each written by a worker that exists. */
static int batch_is_whole(const int64_t *data, size_t count, int workers) {
    if (count != BATCH || data[0] % BATCH != 0 || data[0] >= STRESS_BATCHES * BATCH)
        return 0;
    for (size_t i = 0; i < count; i++)
        if (data[2 * i] != data[0] + (int64_t)i || data[2 * i + 1] < 0 || data[2 * i + 1] >= workers)
            return 0;
    return 1;
}

/* An iterator's round: STRESS_EPOCHS epochs, each until it ends (at its end, or early). */
static void iterate_round(stress_thread *t, int round) {
    for (int e = 0; e < STRESS_EPOCHS; e++) {
        if (fl_procpool_needs_stop(t->pool)) /* as the binding does */
            fl_procpool_stop(t->pool);
        int rc = fl_procpool_start_epoch(t->pool, (uint64_t)(round * STRESS_EPOCHS + e)), slot;
        size_t count;
        t->unexpected += rc != FL_OK;
        while (rc == FL_OK && (rc = fl_procpool_next(t->pool, 10, &slot, &count)) == FL_OK) {
            t->wrong += !batch_is_whole(fl_procpool_slot(t->pool, slot), count, 2);
            t->batches++;
            fl_procpool_release(t->pool, slot);
        }
        t->unexpected += rc != FL_EEND; /* never a timeout (a hang) or a worker error */
    }
    atomic_fetch_sub(t->iterating, 1);
}

/* A stopper's round: stops, a random 0-8 ms apart, until the iterators are done. */
static void stop_round(stress_thread *t) {
    while (atomic_load(t->iterating) > 0) {
        fl_procpool_stop(t->pool);
        fl_procpool_release(t->pool, -1);
        t->stops++;
        long pause_ns = (long)(rand_r(&t->seed) % 8000) * 1000;
        nanosleep(&(struct timespec){0, pause_ns}, NULL); /* paces the stops */
    }
}

static void *stress_main(void *arg) {
    stress_thread *t = arg;
    for (int round = 0; round < t->rounds; round++) {
        pthread_barrier_wait(t->round_start);
        if (t->iterator >= 0)
            iterate_round(t, round);
        else
            stop_round(t);
        if (pthread_barrier_wait(t->round_end) == PTHREAD_BARRIER_SERIAL_THREAD)
            atomic_store(t->iterating, ITERATORS); /* for the next round: all wait at its start */
    }
    return NULL;
}

/* 8 threads stop the pool while 2 threads start epochs and iterate them, round after round:
 * no hang, no crash, no torn batch; afterwards every worker is reaped and the pool works. */
static void test_stops_from_many_threads_while_two_threads_iterate(void) {
    fl_procpool_config config = {
        .sampler = {.n = STRESS_BATCHES * BATCH, .world_size = 1, .batch_size = BATCH},
        .workers = 2, .prefetch = 2, .slot_bytes = BATCH * 2 * sizeof(int64_t), .fill = fill,
    };
    fl_procpool *pool = NULL;
    CHECK(fl_procpool_new(&config, &pool) == FL_OK);
    pthread_barrier_t round_start, round_end;
    pthread_barrier_init(&round_start, NULL, STOPPERS + ITERATORS);
    pthread_barrier_init(&round_end, NULL, STOPPERS + ITERATORS);
    atomic_int iterating = ITERATORS;
    stress_thread threads[STOPPERS + ITERATORS];
    pthread_t ids[STOPPERS + ITERATORS];
    int rounds = stress_rounds(30);
    for (int i = 0; i < STOPPERS + ITERATORS; i++) {
        threads[i] = (stress_thread){.pool = pool, .round_start = &round_start,
                                     .round_end = &round_end, .iterating = &iterating,
                                     .rounds = rounds, .iterator = i < ITERATORS ? i : -1,
                                     .seed = (unsigned)i};
        CHECK(pthread_create(&ids[i], NULL, stress_main, &threads[i]) == 0);
    }
    int batches = 0, stops = 0, wrong = 0, unexpected = 0;
    for (int i = 0; i < STOPPERS + ITERATORS; i++) {
        pthread_join(ids[i], NULL);
        batches += threads[i].batches, stops += threads[i].stops;
        wrong += threads[i].wrong, unexpected += threads[i].unexpected;
    }
    CHECK(wrong == 0 && unexpected == 0 && batches > 0);
    if (getenv("FASTLOOP_STRESS_ROUNDS") != NULL || wrong != 0 || unexpected != 0)
        fprintf(stderr, "  %d rounds: %d batches, %d stops, %d torn, %d unexpected returns\n",
                rounds, batches, stops, wrong, unexpected);
    CHECK(fl_procpool_lent(pool) == 0);
    fl_procpool_stop(pool);
    CHECK(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD); /* every worker reaped */
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);           /* and a whole epoch after */
    int slot, n = 0;
    size_t count;
    while (fl_procpool_next(pool, 10, &slot, &count) == FL_OK) {
        n += batch_is_whole(fl_procpool_slot(pool, slot), count, 2);
        fl_procpool_release(pool, slot);
    }
    CHECK(n == STRESS_BATCHES);
    fl_procpool_free(pool);
    pthread_barrier_destroy(&round_start);
    pthread_barrier_destroy(&round_end);
}

typedef struct {
    fl_procpool *pool;
    pid_t tid;
    int seen;
} first_epoch;

static void *run_first_epoch(void *arg) {
    first_epoch *e = arg;
    e->tid = (pid_t)syscall(SYS_gettid);
    int workers = 0;
    e->seen = run_epoch(e->pool, 0, &workers);
    return NULL;
}

/* Persistent workers forked by a thread that then ends serve the next epoch from another
 * thread (PR_SET_PDEATHSIG would have killed them with the thread). */
static void test_workers_outlive_the_thread_that_forked_them(void) {
    first_epoch e = {make_pool(2, 1), 0, 0};
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, run_first_epoch, &e) == 0);
    pthread_join(thread, NULL);
    CHECK(e.seen == SAMPLES);
    pid_t pids[2] = {fl_procpool_pid(e.pool, 0), fl_procpool_pid(e.pool, 1)};
    char task[64];
    snprintf(task, sizeof task, "/proc/self/task/%d", (int)e.tid);
    struct stat st;
    double deadline = fl_monotonic() + 10; /* join returns before the kernel is done with the thread */
    while (stat(task, &st) == 0 && fl_monotonic() < deadline)
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL); /* paces the polling */
    CHECK(stat(task, &st) != 0);
    int workers = 0;
    CHECK(run_epoch(e.pool, 1, &workers) == SAMPLES);
    CHECK(fl_procpool_pid(e.pool, 0) == pids[0] && fl_procpool_pid(e.pool, 1) == pids[1]);
    fl_procpool_free(e.pool);
}

/* A fill slow enough (0.1 s a sample, 6.4 s a batch) that only a check between samples ends
 * an orphaned worker soon. */
static int slow_fill(void *ctx, int worker, uint64_t seed, const int64_t *ids, size_t count,
                     unsigned char *slot, fl_proc_extra *extra, int64_t *index, char *error,
                     size_t error_len) {
    for (size_t i = 0; i < count; i++) {
        fl_procpool_exit_if_orphaned();
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL); /* the workload */
    }
    return fill(ctx, worker, seed, ids, count, slot, extra, index, error, error_len);
}

static void *start_and_dispatch(void *arg) {
    fl_procpool *pool = arg;
    int slot;
    size_t count;
    CHECK(fl_procpool_start_epoch(pool, 0) == FL_OK);
    CHECK(fl_procpool_next(pool, 0, &slot, &count) == FL_EAGAIN); /* batches handed out */
    return NULL;
}

/* The owner, in a child: a pool whose workers a thread forks and sets to work (so no
 * PR_SET_PDEATHSIG can end them), then a fork that keeps copies of the owner's socket ends (so
 * the workers see no hang-up when the owner dies); writes the three pids to `out` and waits. */
static void own_busy_workers(int out) {
    fl_procpool_config config = {
        .sampler = {.n = SAMPLES, .world_size = 1, .batch_size = BATCH},
        .workers = 2, .prefetch = 1, .slot_bytes = BATCH * 2 * sizeof(int64_t), .fill = slow_fill,
    };
    fl_procpool *pool = NULL;
    pthread_t thread;
    if (fl_procpool_new(&config, &pool) != FL_OK ||
        pthread_create(&thread, NULL, start_and_dispatch, pool) != 0)
        _exit(1);
    pthread_join(thread, NULL);
    pid_t pids[3] = {fl_procpool_pid(pool, 0), fl_procpool_pid(pool, 1), fork()};
    if (pids[2] == 0) { /* the keeper of the sockets */
        pause();
        _exit(0);
    }
    if (write(out, pids, sizeof pids) != sizeof pids)
        _exit(1);
    pause();
    _exit(0);
}

/* Workers never outlive their process: when the owner of the pool is SIGKILLed, its workers
 * (busy with a batch, forked by a thread, their sockets kept open by another process) exit
 * within a few seconds. This process is made the subreaper, so the orphans come to it. */
static void test_the_workers_of_a_killed_owner_exit(void) {
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    int pipe_fds[2];
    CHECK(pipe(pipe_fds) == 0);
    pid_t owner = fork();
    if (owner == 0) {
        close(pipe_fds[0]);
        own_busy_workers(pipe_fds[1]);
    }
    close(pipe_fds[1]);
    pid_t pids[3] = {0, 0, 0};
    CHECK(read(pipe_fds[0], pids, sizeof pids) == sizeof pids && pids[0] > 0 && pids[1] > 0 && pids[2] > 0);
    close(pipe_fds[0]);
    kill(owner, SIGKILL);
    waitpid(owner, NULL, 0);
    int gone = 0;
    for (double deadline = fl_monotonic() + 3; gone < 2 && fl_monotonic() < deadline;) {
        for (int w = 0; w < 2; w++)
            if (pids[w] > 0 && waitpid(pids[w], NULL, WNOHANG) == pids[w])
                pids[w] = 0, gone++;
        nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL); /* paces the polling */
    }
    CHECK(gone == 2);
    for (int p = 0; p < 3; p++) /* the keeper, and any worker still there */
        if (pids[p] > 0 && kill(pids[p], SIGKILL) == 0)
            waitpid(pids[p], NULL, 0);
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 0) == 0);
}

int main(void) {
    RUN(test_slot_counts_and_sizes_that_wrap_are_refused);
    RUN(test_every_sample_once_through_shared_memory);
    RUN(test_an_epoch_started_at_a_batch_skips_the_earlier_ones);
    RUN(test_a_failing_sample_is_reported_with_its_index_after_earlier_batches);
    RUN(test_a_killed_worker_is_reported_within_a_second_and_reaped);
    RUN(test_stopping_mid_epoch_ends_the_workers);
    RUN(test_a_batch_released_by_a_fork_hook_does_not_deadlock_the_epoch_start);
    RUN(test_the_batch_source_table_runs_the_pool);
    RUN(test_extra_bytes_travel_with_their_batch_and_go_with_its_slot);
    RUN(test_uneven_batches_follow_their_ends_and_bad_ends_are_refused);
    RUN(test_workers_outlive_the_thread_that_forked_them);
    RUN(test_a_release_does_not_wait_while_a_stop_reaps_a_stuck_worker);
    RUN(test_a_worker_that_hangs_up_without_exiting_is_killed_and_reported);
    RUN(test_stops_from_many_threads_while_two_threads_iterate);
    RUN(test_the_workers_of_a_killed_owner_exit);
    return check_failures != 0;
}
