/* test_procpool.c - the process pool with a C fill function: every sample once and in
 * order through shared memory, persistent workers, a failing sample reported with its index,
 * a SIGKILLed worker reported within a second with no zombie left, restarts, epochs
 * resumed at a batch, extra bytes that did not fit a slot, and batches of uneven sizes. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "base/fl_error.h"
#include "data/fl_procpool.h"
#include "base/fl_time.h"

enum { SAMPLES = 5000, BATCH = 64 };

/* Writes each sample's index (and the worker) into the slot; fails at index `fail_at`. */
static int64_t fail_at = -1;

static int fill(void *ctx, int worker, uint64_t seed, const int64_t *ids, size_t count,
                unsigned char *slot, fl_proc_extra *extra, int64_t *index, char *error,
                size_t error_len) {
    (void)ctx, (void)seed, (void)extra;
    int64_t *out = (int64_t *)slot;
    for (size_t i = 0; i < count; i++) {
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
    CHECK(strstr(e->text, "killed by signal 9") != NULL);
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
    return check_failures != 0;
}
