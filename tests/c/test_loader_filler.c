/* test_loader_filler.c - the thread loader with a filler (the caller's code fills whole batches
 * on the workers, as the Python binding's threads mode does) and stopping from many threads:
 * every sample once and in order, per-worker start/end hooks, a failing start or fill, uneven
 * batches, stops from many threads joining once, an epoch started during a stop, and a loader
 * freed by its own worker. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "base/fl_error.h"
#include "data/fl_loader.h"

enum { SAMPLES = 100, BATCH = 8, WORKERS = 3 };

/* A filler writing each sample's index (int64) into field 0, counting calls per worker. */
typedef struct filler_state {
    fl_loader *loader;
    atomic_int started, ended, fills;
    atomic_int fail_start;    /* worker id whose start fails, or -1 */
    atomic_llong fail_sample; /* the sample whose fill fails, or -1 */
    /* a gate: fills wait here while `closed` (entered counts them), until opened or cancelled */
    pthread_mutex_t gate_lock;
    pthread_cond_t gate_changed;
    int closed, entered;
    int hold_through_cancel; /* the gate stays shut after a cancel too */
    atomic_llong free_at_batch; /* the worker filling this batch frees the loader, or -1 */
    atomic_int freed;           /* set by that worker once fl_loader_free returned */
    atomic_int let_go;          /* the consumer no longer uses the loader: it may be freed */
} filler_state;

static int on_start(void *ctx, int worker) {
    filler_state *st = ctx;
    atomic_fetch_add(&st->started, 1);
    if (atomic_load(&st->fail_start) == worker)
        return fl_error_set(FL_EINVAL, "worker %d cannot start", worker);
    return FL_OK;
}

static void on_end(void *ctx, int worker) {
    (void)worker;
    atomic_fetch_add(&((filler_state *)ctx)->ended, 1);
}

/* Waits while the gate is closed; 1 if the loader cancelled the wait. */
static int pass_gate(filler_state *st) {
    pthread_mutex_lock(&st->gate_lock);
    st->entered++;
    pthread_cond_broadcast(&st->gate_changed);
    while (st->closed && (st->hold_through_cancel || !fl_loader_cancelled(st->loader))) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 1000000; /* polls the cancel flag every millisecond */
        if (t.tv_nsec >= 1000000000)
            t.tv_sec++, t.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&st->gate_changed, &st->gate_lock, &t);
    }
    pthread_mutex_unlock(&st->gate_lock);
    return 0;
}

static int on_fill(void *ctx, int worker, uint64_t batch, uint64_t seed, const int64_t *ids, size_t count,
                   int slot, unsigned char *data) {
    (void)worker, (void)seed, (void)slot;
    filler_state *st = ctx;
    atomic_fetch_add(&st->fills, 1);
    if ((long long)batch == atomic_load(&st->free_at_batch)) {
        while (!atomic_load(&st->let_go)) /* a caller inside a loader call holds a reference */
            sched_yield();
        fl_loader_free(st->loader); /* as a dataset's code dropping the last reference would */
        CHECK(fl_loader_orphaned());
        atomic_store(&st->freed, 1);
        return FL_OK; /* touches nothing of the loader */
    }
    pass_gate(st);
    int64_t *out = (int64_t *)(data + fl_loader_field_offset(st->loader, 0));
    for (size_t i = 0; i < count; i++) {
        if (ids[i] == atomic_load(&st->fail_sample))
            return fl_error_set(FL_EINVAL, "sample %lld: cannot be read", (long long)ids[i]);
        out[i] = ids[i];
    }
    return FL_OK;
}

static fl_loader *make_filled(filler_state *st, int workers, int shuffle) {
    memset(st, 0, sizeof *st);
    atomic_store(&st->fail_start, -1);
    atomic_store(&st->fail_sample, -1);
    atomic_store(&st->free_at_batch, -1);
    pthread_mutex_init(&st->gate_lock, NULL);
    pthread_cond_init(&st->gate_changed, NULL);
    static fl_field field = {.sample_bytes = sizeof(int64_t)};
    fl_loader_filler filler = {on_start, on_end, on_fill, st};
    fl_loader_config config = {
        .sampler = {.n = SAMPLES, .shuffle = shuffle, .seed = 11, .world_size = 1, .batch_size = BATCH},
        .workers = workers, .slots = workers * 2 + 2, .ahead = workers * 2, .fields = &field, .n_fields = 1,
        .filler = &filler,
    };
    fl_loader *l = NULL;
    CHECK(fl_loader_new(&config, &l) == FL_OK);
    st->loader = l;
    return l;
}

static void open_gate(filler_state *st, int closed) {
    pthread_mutex_lock(&st->gate_lock);
    st->closed = closed;
    pthread_cond_broadcast(&st->gate_changed);
    pthread_mutex_unlock(&st->gate_lock);
}

static void wait_entered(filler_state *st, int n) {
    pthread_mutex_lock(&st->gate_lock);
    while (st->entered < n)
        pthread_cond_wait(&st->gate_changed, &st->gate_lock);
    pthread_mutex_unlock(&st->gate_lock);
}

/* Reads an epoch to its end; returns the batches, marking each sample seen in `seen`. */
static int read_epoch(fl_loader *l, unsigned char *seen, int64_t *order) {
    int slot, batches = 0, rc;
    size_t count, n = 0;
    while ((rc = fl_loader_next(l, 10, &slot, &count)) == FL_OK) {
        const int64_t *ids = (const int64_t *)((unsigned char *)fl_loader_slot(l, slot) + fl_loader_field_offset(l, 0));
        for (size_t i = 0; i < count; i++) {
            seen[ids[i]]++;
            if (order != NULL)
                order[n++] = ids[i];
        }
        fl_loader_release(l, slot);
        batches++;
    }
    CHECK(rc == FL_EEND);
    return batches;
}

static void test_a_filler_fills_every_sample_once_in_the_epoch_order(void) {
    filler_state st;
    fl_loader *l = make_filled(&st, WORKERS, 1);
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        unsigned char seen[SAMPLES] = {0};
        int64_t got[SAMPLES], want[SAMPLES];
        CHECK(fl_loader_start_epoch(l, epoch) == FL_OK);
        CHECK(read_epoch(l, seen, got) == (SAMPLES + BATCH - 1) / BATCH);
        fl_sampler s = {.n = SAMPLES, .shuffle = 1, .seed = 11, .world_size = 1, .batch_size = BATCH};
        CHECK(fl_sampler_epoch(&s, epoch, want) == FL_OK && memcmp(got, want, sizeof want) == 0);
        int once = 1;
        for (int i = 0; i < SAMPLES; i++)
            once &= seen[i] == 1;
        CHECK(once);
    }
    fl_loader_free(l);
    CHECK(atomic_load(&st.started) == WORKERS); /* persistent across finished epochs */
    CHECK(atomic_load(&st.ended) == WORKERS);
}

static void test_a_failing_start_or_fill_is_next_s_error(void) {
    filler_state st;
    fl_loader *l = make_filled(&st, 2, 0);
    atomic_store(&st.fail_start, 1);
    open_gate(&st, 1); /* worker 0 delivers nothing before worker 1's failure is known */
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    int slot, rc;
    size_t count;
    rc = fl_loader_next(l, 10, &slot, &count);
    CHECK(rc == FL_EINVAL && strstr(fl_loader_error(l), "worker 1 cannot start") != NULL);
    open_gate(&st, 0);
    fl_loader_free(l);
    CHECK(atomic_load(&st.ended) == 1); /* the worker that started */

    l = make_filled(&st, 2, 0);
    atomic_store(&st.fail_sample, 42); /* batch 5 of 8-sample batches */
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    int delivered = 0;
    while ((rc = fl_loader_next(l, 10, &slot, &count)) == FL_OK)
        fl_loader_release(l, slot), delivered++;
    CHECK(delivered == 5 && rc == FL_EINVAL && strstr(fl_loader_error(l), "sample 42") != NULL);
    atomic_store(&st.fail_sample, -1); /* the next epoch starts clean */
    unsigned char seen[SAMPLES] = {0};
    CHECK(fl_loader_start_epoch(l, 1) == FL_OK && read_epoch(l, seen, NULL) == 13);
    fl_loader_free(l);
}

static void test_uneven_batches_split_the_order_where_told(void) {
    filler_state st;
    fl_loader *l = make_filled(&st, 2, 0);
    uint64_t ends[] = {3, 11, 12, 20, 100}, bad[] = {3, 12, 100};
    CHECK(fl_loader_set_batches(l, bad, 3) == FL_EINVAL); /* 9 samples in a batch of 8 */
    CHECK(fl_loader_set_batches(l, ends, 4) == FL_EINVAL); /* ends before the order does */
    ends[4] = 28;
    uint64_t tail[] = {3, 11, 12, 20, 28, 36, 44, 52, 60, 68, 76, 84, 92, 100};
    CHECK(fl_loader_set_batches(l, tail, 14) == FL_OK && fl_loader_batches(l) == 14);
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    int slot;
    size_t count, sizes[14], b = 0;
    while (fl_loader_next(l, 10, &slot, &count) == FL_OK) {
        if (b < 14)
            sizes[b] = count;
        b++;
        fl_loader_release(l, slot);
    }
    CHECK(b == 14 && sizes[0] == 3 && sizes[1] == 8 && sizes[2] == 1 && sizes[13] == 8);
    CHECK(fl_loader_set_batches(l, NULL, 0) == FL_OK && fl_loader_batches(l) == 13);
    fl_loader_free(l);
}

typedef struct stopper {
    fl_loader *loader;
    pthread_barrier_t *go;
    int rounds;
} stopper;

static void *stop_rounds(void *arg) {
    stopper *s = arg;
    for (int r = 0; r < s->rounds; r++) {
        pthread_barrier_wait(s->go);
        fl_loader_stop(s->loader);
        pthread_barrier_wait(s->go);
    }
    return NULL;
}

/* Eight threads stop one loader at once, round after round, while its workers fill: each
 * round exactly one joins (a second join of a thread is undefined behaviour: TSan and ASan
 * catch it), and the next epoch runs whole. */
static void test_stops_from_many_threads_at_once_join_the_workers_once(void) {
    enum { STOPPERS = 8, ROUNDS = 50 };
    filler_state st;
    fl_loader *l = make_filled(&st, 2, 0);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, STOPPERS + 1);
    stopper s = {l, &go, ROUNDS};
    pthread_t threads[STOPPERS];
    for (int i = 0; i < STOPPERS; i++)
        pthread_create(&threads[i], NULL, stop_rounds, &s);
    for (int r = 0; r < ROUNDS; r++) {
        CHECK(fl_loader_start_epoch(l, (uint64_t)r) == FL_OK);
        int slot;
        size_t count;
        if (fl_loader_next(l, 10, &slot, &count) == FL_OK) /* workers are filling ahead */
            fl_loader_release(l, slot);
        pthread_barrier_wait(&go);
        pthread_barrier_wait(&go); /* every stop returned: the workers are gone */
        CHECK(fl_loader_next(l, 0, &slot, &count) == FL_EEND);
    }
    for (int i = 0; i < STOPPERS; i++)
        pthread_join(threads[i], NULL);
    unsigned char seen[SAMPLES] = {0};
    CHECK(fl_loader_start_epoch(l, 99) == FL_OK && read_epoch(l, seen, NULL) == 13);
    pthread_barrier_destroy(&go);
    fl_loader_free(l);
}

typedef struct starter {
    fl_loader *loader;
    int rc;
    atomic_int begun;
} starter;

static void *stop_one(void *arg) {
    fl_loader_stop(arg);
    return NULL;
}

static void *start_one(void *arg) {
    starter *s = arg;
    atomic_store(&s->begun, 1);
    s->rc = fl_loader_start_epoch(s->loader, 1);
    return NULL;
}

/* A stop is joining a worker still in its fill while another thread starts an epoch: the
 * start waits for the stop, then the epoch is real (it used to find the workers "running",
 * and the stop's tail ended the new epoch before it gave a batch). */
static void test_an_epoch_started_during_a_stop_waits_and_delivers_everything(void) {
    filler_state st;
    fl_loader *l = make_filled(&st, 1, 0);
    st.hold_through_cancel = 1;
    open_gate(&st, 1);
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    wait_entered(&st, 1); /* the worker is in its fill, held at the gate */
    pthread_t stopping, starting;
    pthread_create(&stopping, NULL, stop_one, l);
    while (!fl_loader_cancelled(l)) /* the stop has begun: it owns the join, held by the gate */
        sched_yield();
    starter s = {l, 1, 0};
    pthread_create(&starting, NULL, start_one, &s);
    while (!atomic_load(&s.begun))
        sched_yield();
    usleep(20000); /* paces: the start most likely reaches the lock while the stop still joins */
    open_gate(&st, 0);
    pthread_join(stopping, NULL);
    pthread_join(starting, NULL);
    CHECK(s.rc == FL_OK);
    unsigned char seen[SAMPLES] = {0};
    CHECK(read_epoch(l, seen, NULL) == 13);
    fl_loader_free(l);
}

/* The worker filling batch 2 frees the loader (a dataset's code dropping the last reference
 * to its Loader): it joins the other workers, detaches itself and returns without touching
 * the loader. ASan checks nothing is read after the free, TSan that nothing races. */
static void test_a_loader_freed_by_its_own_worker_ends_cleanly(void) {
    for (int round = 0; round < 10; round++) {
        filler_state st;
        fl_loader *l = make_filled(&st, WORKERS, 0);
        atomic_store(&st.free_at_batch, 2);
        CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
        atomic_store(&st.let_go, 1);
        while (!atomic_load(&st.freed)) /* the consumer must not use the loader: it is going */
            sched_yield();
        CHECK(atomic_load(&st.ended) == WORKERS - 1); /* the others ended and were joined */
        pthread_mutex_destroy(&st.gate_lock);
        pthread_cond_destroy(&st.gate_changed);
    }
}

static void note_freed(void *arg) { atomic_store((atomic_int *)arg, 1); }

/* fl_loader_free_later returns while a worker is still in its fill (held at the gate, as by a
 * lock the caller holds), and frees the loader once that worker has ended. */
static void test_free_later_returns_at_once_and_frees_after_the_workers_end(void) {
    filler_state st;
    fl_loader *l = make_filled(&st, 2, 0);
    st.hold_through_cancel = 1;
    open_gate(&st, 1);
    CHECK(fl_loader_start_epoch(l, 0) == FL_OK);
    wait_entered(&st, 1);
    atomic_int freed = 0;
    CHECK(fl_loader_free_later(l, note_freed, &freed) == FL_OK);
    CHECK(fl_loader_cancelled(l)); /* asked to stop at once */
    CHECK(!atomic_load(&freed));   /* but not freed: a worker is still in its fill */
    open_gate(&st, 0);
    while (!atomic_load(&freed))
        sched_yield();
    CHECK(atomic_load(&st.ended) == 2);
}

int main(void) {
    RUN(test_a_filler_fills_every_sample_once_in_the_epoch_order);
    RUN(test_a_failing_start_or_fill_is_next_s_error);
    RUN(test_uneven_batches_split_the_order_where_told);
    RUN(test_stops_from_many_threads_at_once_join_the_workers_once);
    RUN(test_an_epoch_started_during_a_stop_waits_and_delivers_everything);
    RUN(test_a_loader_freed_by_its_own_worker_ends_cleanly);
    RUN(test_free_later_returns_at_once_and_frees_after_the_workers_end);
    return check_failures != 0;
}
