/* test_queue.c - fl_queue: FIFO order, timeouts, close, task_done/join, growth, drain, and
 * producers x consumers load with nothing lost, duplicated or reordered. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "base/fl_error.h"
#include "base/fl_event.h"
#include "base/fl_queue.h"
#include "testing/fl_queue_load.h"
#include "base/fl_time.h"

static void test_fifo_order_and_size(void) {
    fl_queue *q;
    CHECK(fl_queue_new(8, sizeof(int), &q) == FL_OK);
    for (int i = 0; i < 8; i++)
        CHECK(fl_queue_put(q, &i, 0) == FL_OK);
    CHECK(fl_queue_size(q) == 8);
    int extra = 99;
    CHECK(fl_queue_put(q, &extra, 0) == FL_EAGAIN);
    for (int i = 0; i < 8; i++) {
        int got = -1;
        CHECK(fl_queue_get(q, &got, 0) == FL_OK);
        CHECK(got == i);
    }
    int got;
    CHECK(fl_queue_get(q, &got, 0) == FL_EAGAIN);
    fl_queue_free(q);
}

static void test_timeouts_wait_about_as_long_as_asked(void) {
    fl_queue *q;
    CHECK(fl_queue_new(1, sizeof(int), &q) == FL_OK);
    int item = 1;
    double start = fl_monotonic();
    CHECK(fl_queue_get(q, &item, 0.05) == FL_ETIMEDOUT);
    double waited = fl_monotonic() - start;
    CHECK(waited >= 0.049 && waited < 5.0); /* at least as asked; the upper bound only catches a hang */
    CHECK(fl_queue_put(q, &item, 0) == FL_OK);
    start = fl_monotonic();
    CHECK(fl_queue_put(q, &item, 0.05) == FL_ETIMEDOUT);
    waited = fl_monotonic() - start;
    CHECK(waited >= 0.049 && waited < 5.0);
    fl_queue_free(q);
}

static void test_close_refuses_puts_and_drains_gets(void) {
    fl_queue *q;
    CHECK(fl_queue_new(0, sizeof(int), &q) == FL_OK);
    int a = 1, b = 2, got = 0;
    CHECK(fl_queue_put(q, &a, 0) == FL_OK);
    CHECK(fl_queue_put(q, &b, 0) == FL_OK);
    fl_queue_close(q);
    CHECK(fl_queue_is_closed(q));
    CHECK(fl_queue_put(q, &a, -1) == FL_ECLOSED);
    CHECK(fl_queue_get(q, &got, -1) == FL_OK && got == 1);
    CHECK(fl_queue_get(q, &got, -1) == FL_OK && got == 2);
    CHECK(fl_queue_get(q, &got, -1) == FL_ECLOSED);
    fl_queue_free(q);
}

typedef struct blocked_call {
    fl_queue *q;
    int is_put;
    int rc;
    double returned_at;
} blocked_call;

static void *blocked_main(void *arg) {
    blocked_call *call = arg;
    int item = 7;
    call->rc = call->is_put ? fl_queue_put(call->q, &item, -1) : fl_queue_get(call->q, &item, -1);
    call->returned_at = fl_monotonic();
    return NULL;
}

static void test_close_wakes_every_waiter(void) {
    fl_queue *empty, *full;
    CHECK(fl_queue_new(1, sizeof(int), &empty) == FL_OK);
    CHECK(fl_queue_new(1, sizeof(int), &full) == FL_OK);
    int item = 0;
    CHECK(fl_queue_put(full, &item, 0) == FL_OK);
    enum { WAITERS = 6 };
    blocked_call calls[WAITERS];
    pthread_t threads[WAITERS];
    for (int i = 0; i < WAITERS; i++) {
        calls[i] = (blocked_call){i % 2 ? full : empty, i % 2, 12345, 0};
        pthread_create(&threads[i], NULL, blocked_main, &calls[i]);
    }
    /* paces only: a waiter that starts after the close gets FL_ECLOSED just the same */
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    double closed_at = fl_monotonic();
    fl_queue_close(empty);
    fl_queue_close(full);
    for (int i = 0; i < WAITERS; i++) {
        pthread_join(threads[i], NULL);
        CHECK(calls[i].rc == FL_ECLOSED);
        CHECK(calls[i].returned_at - closed_at < 5.0); /* a missed wake-up waits 12345 s */
    }
    fl_queue_free(empty);
    fl_queue_free(full);
}

static void test_task_done_and_join(void) {
    fl_queue *q;
    CHECK(fl_queue_new(0, sizeof(int), &q) == FL_OK);
    CHECK(fl_queue_join(q, 0) == FL_OK);
    int item = 1;
    CHECK(fl_queue_put(q, &item, 0) == FL_OK);
    CHECK(fl_queue_put(q, &item, 0) == FL_OK);
    CHECK(fl_queue_join(q, 0) == FL_EAGAIN);
    CHECK(fl_queue_join(q, 0.02) == FL_ETIMEDOUT);
    CHECK(fl_queue_get(q, &item, 0) == FL_OK);
    CHECK(fl_queue_task_done(q) == FL_OK);
    CHECK(fl_queue_get(q, &item, 0) == FL_OK);
    CHECK(fl_queue_task_done(q) == FL_OK);
    CHECK(fl_queue_join(q, 0) == FL_OK);
    CHECK(fl_queue_task_done(q) == FL_EINVAL);
    fl_queue_free(q);
}

static void test_unbounded_queue_grows_and_keeps_order(void) {
    fl_queue *q;
    CHECK(fl_queue_new(0, sizeof(long), &q) == FL_OK);
    /* interleave gets so the ring wraps before it grows */
    long next_put = 0, next_get = 0;
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 100; i++, next_put++)
            CHECK(fl_queue_put(q, &next_put, 0) == FL_OK);
        for (int i = 0; i < 60; i++, next_get++) {
            long got = -1;
            CHECK(fl_queue_get(q, &got, 0) == FL_OK && got == next_get);
        }
    }
    CHECK(fl_queue_size(q) == (size_t)(next_put - next_get));
    long got;
    while (fl_queue_get(q, &got, 0) == FL_OK)
        CHECK(got == next_get++);
    CHECK(next_get == next_put);
    fl_queue_free(q);
}

static int count_items(void *ctx, const void *item) {
    (void)item;
    (*(int *)ctx)++;
    return 0;
}

static void sum_items(void *ctx, void *item) { *(long *)ctx += *(int *)item; }

static void test_get_many_foreach_and_drain(void) {
    fl_queue *q;
    CHECK(fl_queue_new(0, sizeof(int), &q) == FL_OK);
    for (int i = 1; i <= 10; i++)
        CHECK(fl_queue_put(q, &i, 0) == FL_OK);
    int batch[4];
    size_t n = 0;
    CHECK(fl_queue_get_many(q, batch, 4, 0, &n) == FL_OK && n == 4);
    CHECK(batch[0] == 1 && batch[3] == 4);
    int visited = 0;
    CHECK(fl_queue_foreach(q, count_items, &visited) == 0 && visited == 6);
    long sum = 0;
    CHECK(fl_queue_drain(q, sum_items, &sum) == 6);
    CHECK(sum == 5 + 6 + 7 + 8 + 9 + 10);
    CHECK(fl_queue_size(q) == 0);
    for (int i = 0; i < 4; i++)
        CHECK(fl_queue_task_done(q) == FL_OK);
    CHECK(fl_queue_join(q, 0) == FL_OK); /* drained items count as done */
    fl_queue_free(q);
}

static void check_load(int producers, int consumers, uint64_t items, size_t maxsize,
                       int close_early) {
    fl_queue_load_result r;
    CHECK(fl_queue_load_run(producers, consumers, items, maxsize, close_early, &r) == FL_OK);
    CHECK(r.duplicates == 0);
    CHECK(r.missing == 0);
    CHECK(r.reordered == 0);
    if (!close_early)
        CHECK(r.received == (uint64_t)producers * items);
    fprintf(stderr, "  %dx%d x %llu items, maxsize %zu%s: %.0f items/s\n", producers, consumers,
            (unsigned long long)items, maxsize, close_early ? ", closed early" : "",
            (double)r.received / r.seconds);
}

static void test_4_producers_4_consumers_lose_nothing(void) {
    uint64_t items = (uint64_t)(1e6 * test_scale());
    check_load(4, 4, items, 1024, 0);
    check_load(1, 1, items, 64, 0);
    check_load(4, 1, items / 4, 0, 0);
}

static void test_close_during_traffic_loses_nothing_put(void) {
    uint64_t items = (uint64_t)(2e5 * test_scale());
    for (int round = 0; round < 5; round++)
        check_load(4, 4, items, 128, 1);
}

/* A getter thread: takes items until the queue closes, noting which thread took each. */
typedef struct {
    fl_queue *queue;
    pthread_mutex_t lock;
    int taken_by[64];
    int taken;
} warm_run;

typedef struct {
    warm_run *run;
    int id;
} warm_getter;

static void *take_and_note(void *arg) {
    warm_getter *me = arg;
    int item;
    while (fl_queue_get(me->run->queue, &item, -1) == FL_OK) {
        pthread_mutex_lock(&me->run->lock);
        me->run->taken_by[item] = me->id;
        me->run->taken++;
        pthread_mutex_unlock(&me->run->lock);
    }
    return NULL;
}

/* Polls until `taken` items were noted and both getters sleep again (5 s: a hang, failed). */
static int until_both_sleep_after(warm_run *run, int taken) {
    for (double start = fl_monotonic(); fl_monotonic() - start < 5.0;) {
        pthread_mutex_lock(&run->lock);
        int noted = run->taken;
        pthread_mutex_unlock(&run->lock);
        if (noted == taken && fl_queue_getters_waiting(run->queue) == 2)
            return 1;
        struct timespec nap = {0, 200000};
        nanosleep(&nap, NULL);
    }
    return 0;
}

/* Items fed one at a time to two sleeping getters all go to the one that took the last:
 * the warm thread, not the one asleep longest. */
static void test_a_put_wakes_the_getter_that_took_last(void) {
    warm_run run = {.taken = 0};
    pthread_mutex_init(&run.lock, NULL);
    CHECK(fl_queue_new(0, sizeof(int), &run.queue) == FL_OK);
    warm_getter getters[2] = {{&run, 0}, {&run, 1}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&threads[i], NULL, take_and_note, &getters[i]) == 0);
    int items = 20;
    for (int i = 0; i < items; i++) {
        CHECK(until_both_sleep_after(&run, i));
        CHECK(fl_queue_put(run.queue, &i, 0) == FL_OK);
    }
    CHECK(until_both_sleep_after(&run, items));
    for (int i = 1; i < items; i++)
        CHECK(run.taken_by[i] == run.taken_by[0]);
    fl_queue_close(run.queue);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    CHECK(fl_queue_getters_waiting(run.queue) == 0);
    fl_queue_free(run.queue);
    pthread_mutex_destroy(&run.lock);
}

int main(void) {
    RUN(test_fifo_order_and_size);
    RUN(test_timeouts_wait_about_as_long_as_asked);
    RUN(test_close_refuses_puts_and_drains_gets);
    RUN(test_close_wakes_every_waiter);
    RUN(test_task_done_and_join);
    RUN(test_unbounded_queue_grows_and_keeps_order);
    RUN(test_get_many_foreach_and_drain);
    RUN(test_4_producers_4_consumers_lose_nothing);
    RUN(test_close_during_traffic_loses_nothing_put);
    RUN(test_a_put_wakes_the_getter_that_took_last);
    return check_failures != 0;
}
