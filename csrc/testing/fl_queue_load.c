/* fl_queue_load.c - producer/consumer load on fl_queue with exact bookkeeping.
 *
 * Threads: producers and consumers of one run share `load_run`. Each producer writes only
 * its own put_ok slot (read after join). `seen` marks are atomics because a duplicate
 * would be the same slot marked by two consumers; `items_put` is an atomic counter read by
 * the closing thread. Relaxed ordering suffices: results are read after pthread_join.
 */
#include "testing/fl_queue_load.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "base/fl_event.h"
#include "base/fl_thread.h"
#include "base/fl_time.h"

typedef struct load_run {
    fl_queue *queue;
    int producers;
    uint64_t items_per_producer;
    atomic_uchar *seen; /* producers x items_per_producer marks */
    uint64_t *put_ok;   /* per producer: items put before the queue closed */
    atomic_uint_fast64_t items_put;
} load_run;

typedef struct load_thread {
    load_run *run;
    int index;
    uint64_t received, duplicates, reordered;
    pthread_t thread;
} load_thread;

static void *producer_main(void *arg) {
    load_thread *self = arg;
    load_run *run = self->run;
    fl_item item = {.tag = FL_ITEM_EVENT};
    uint64_t seq = 0;
    for (; seq < run->items_per_producer; seq++) {
        fl_event_init(&item.as.event, FL_EVENT_SCALAR, "load", (double)seq, (int64_t)seq,
                      self->index);
        if (fl_queue_put(run->queue, &item, -1) != FL_OK)
            break; /* closed early */
        atomic_fetch_add_explicit(&run->items_put, 1, memory_order_relaxed);
    }
    run->put_ok[self->index] = seq;
    return NULL;
}

static void *consumer_main(void *arg) {
    load_thread *self = arg;
    load_run *run = self->run;
    int64_t *last = malloc((size_t)run->producers * sizeof *last);
    if (last == NULL)
        return NULL;
    for (int p = 0; p < run->producers; p++)
        last[p] = -1;
    fl_item item;
    while (fl_queue_get(run->queue, &item, -1) == FL_OK) {
        const fl_event *event = &item.as.event;
        size_t mark = (size_t)event->source * run->items_per_producer + (size_t)event->step;
        self->received++;
        if (atomic_fetch_add_explicit(&run->seen[mark], 1, memory_order_relaxed) != 0)
            self->duplicates++;
        if (event->step <= last[event->source]) /* FIFO: one producer's items stay in order */
            self->reordered++;
        last[event->source] = event->step;
    }
    free(last);
    return NULL;
}

/* Starts n threads running fn; returns how many started. */
static int start_threads(load_thread *threads, int n, load_run *run, void *(*fn)(void *)) {
    for (int i = 0; i < n; i++) {
        threads[i] = (load_thread){.run = run, .index = i};
        if (fl_thread_start(&threads[i].thread, fn, &threads[i]) != FL_OK)
            return i;
    }
    return n;
}

static void join_threads(load_thread *threads, int n) {
    for (int i = 0; i < n; i++)
        pthread_join(threads[i].thread, NULL);
}

static void close_when_half_put(load_run *run) {
    uint64_t half = run->items_per_producer * (uint64_t)run->producers / 2;
    while (atomic_load_explicit(&run->items_put, memory_order_relaxed) < half)
        nanosleep(&(struct timespec){0, 100000}, NULL);
    fl_queue_close(run->queue);
}

static void tally(const load_run *run, const load_thread *consumers, int n_consumers,
                  fl_queue_load_result *out) {
    for (int i = 0; i < n_consumers; i++) {
        out->received += consumers[i].received;
        out->duplicates += consumers[i].duplicates;
        out->reordered += consumers[i].reordered;
    }
    for (int p = 0; p < run->producers; p++)
        for (uint64_t seq = 0; seq < run->put_ok[p]; seq++)
            out->missing += run->seen[(size_t)p * run->items_per_producer + seq] == 0;
}

int fl_queue_load_run(int producers, int consumers, uint64_t items_per_producer, size_t maxsize,
                      int close_early, fl_queue_load_result *out) {
    memset(out, 0, sizeof *out);
    if (producers < 1 || consumers < 1 || producers > 1024 || consumers > 1024)
        return fl_error_set(FL_EINVAL, "producers and consumers must be in 1..1024");
    load_run run = {.producers = producers, .items_per_producer = items_per_producer};
    atomic_init(&run.items_put, 0);
    size_t marks = (size_t)producers * items_per_producer;
    run.seen = calloc(marks ? marks : 1, sizeof *run.seen);
    run.put_ok = calloc((size_t)producers, sizeof *run.put_ok);
    load_thread *threads = calloc((size_t)(producers + consumers), sizeof *threads);
    int rc = FL_ENOMEM;
    if (run.seen == NULL || run.put_ok == NULL || threads == NULL)
        goto done;
    rc = fl_queue_new(maxsize, sizeof(fl_item), &run.queue);
    if (rc != FL_OK)
        goto done;
    load_thread *consumer_threads = threads + producers;
    double start = fl_monotonic();
    int started_consumers = start_threads(consumer_threads, consumers, &run, consumer_main);
    int started_producers = start_threads(threads, producers, &run, producer_main);
    if (started_producers == producers && started_consumers == consumers && close_early)
        close_when_half_put(&run);
    join_threads(threads, started_producers);
    fl_queue_close(run.queue);
    join_threads(consumer_threads, started_consumers);
    out->seconds = fl_monotonic() - start;
    rc = started_producers == producers && started_consumers == consumers ? FL_OK : FL_ESYS;
    tally(&run, consumer_threads, started_consumers, out);
    fl_queue_free(run.queue);
done:
    free(threads);
    free(run.put_ok);
    free(run.seen);
    return rc;
}

/* ---- event emitter ---- */

struct fl_event_emitter {
    fl_queue *queue;
    uint64_t count;
    char name[FL_EVENT_NAME_MAX];
    atomic_int stop;              /* set by fl_event_emitter_free() */
    atomic_uint_fast64_t emitted; /* records put, all producers */
    pthread_mutex_t mutex;        /* protects finished */
    pthread_cond_t all_finished;
    int finished;
    int producers;
    struct emitter_thread {
        fl_event_emitter *emitter;
        int index;
        pthread_t thread;
    } *threads;
};

static void *emitter_main(void *arg) {
    struct emitter_thread *self = arg;
    fl_event_emitter *e = self->emitter;
    fl_item item = {.tag = FL_ITEM_EVENT};
    for (uint64_t seq = 0; seq < e->count; seq++) {
        fl_event_init(&item.as.event, FL_EVENT_SCALAR, e->name, (double)seq, (int64_t)seq,
                      self->index);
        int rc;
        do { /* short slices so a stop request is seen quickly */
            rc = fl_queue_put(e->queue, &item, 0.02);
        } while (rc == FL_ETIMEDOUT && !atomic_load_explicit(&e->stop, memory_order_relaxed));
        if (rc != FL_OK)
            break;
        atomic_fetch_add_explicit(&e->emitted, 1, memory_order_relaxed);
    }
    pthread_mutex_lock(&e->mutex);
    if (++e->finished == e->producers)
        pthread_cond_broadcast(&e->all_finished);
    pthread_mutex_unlock(&e->mutex);
    return NULL;
}

int fl_event_emitter_start(fl_queue *queue, int producers, uint64_t count, const char *name,
                           fl_event_emitter **out) {
    *out = NULL;
    if (producers < 1 || producers > 1024)
        return fl_error_set(FL_EINVAL, "producers must be in 1..1024, not %d", producers);
    fl_event_emitter *e = calloc(1, sizeof *e);
    if (e == NULL)
        return FL_ENOMEM;
    e->threads = calloc((size_t)producers, sizeof *e->threads);
    if (e->threads == NULL || pthread_mutex_init(&e->mutex, NULL) != 0) {
        free(e->threads);
        free(e);
        return FL_ENOMEM;
    }
    if (fl_cond_init(&e->all_finished) != FL_OK) {
        pthread_mutex_destroy(&e->mutex);
        free(e->threads);
        free(e);
        return FL_ESYS;
    }
    e->queue = queue;
    e->count = count;
    e->producers = producers;
    strncpy(e->name, name, FL_EVENT_NAME_MAX - 1);
    atomic_init(&e->stop, 0);
    atomic_init(&e->emitted, 0);
    int started = 0;
    for (; started < producers; started++) {
        struct emitter_thread *t = &e->threads[started];
        t->emitter = e;
        t->index = started;
        if (fl_thread_start(&t->thread, emitter_main, t) != FL_OK)
            break;
    }
    if (started < producers) { /* stop and reap the ones that did start */
        pthread_mutex_lock(&e->mutex);
        e->producers = started;
        pthread_mutex_unlock(&e->mutex);
        fl_event_emitter_free(e);
        return fl_error_set(FL_ESYS, "could not start producer thread %d", started);
    }
    *out = e;
    return FL_OK;
}

int fl_event_emitter_wait(fl_event_emitter *e, double timeout_s) {
    pthread_mutex_lock(&e->mutex);
    int rc = FL_OK;
    if (e->finished < e->producers && timeout_s == 0)
        rc = FL_EAGAIN;
    struct timespec deadline = fl_deadline_after(timeout_s);
    while (rc == FL_OK && e->finished < e->producers)
        rc = fl_cond_wait_until(&e->all_finished, &e->mutex, timeout_s < 0 ? NULL : &deadline);
    if (e->finished == e->producers)
        rc = FL_OK;
    pthread_mutex_unlock(&e->mutex);
    return rc;
}

uint64_t fl_event_emitter_free(fl_event_emitter *e) {
    if (e == NULL)
        return 0;
    atomic_store_explicit(&e->stop, 1, memory_order_relaxed);
    for (int i = 0; i < e->producers; i++)
        pthread_join(e->threads[i].thread, NULL);
    uint64_t emitted = atomic_load_explicit(&e->emitted, memory_order_relaxed);
    pthread_cond_destroy(&e->all_finished);
    pthread_mutex_destroy(&e->mutex);
    free(e->threads);
    free(e);
    return emitted;
}
