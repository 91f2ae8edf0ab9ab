/* fl_queue.c - bounded MPMC FIFO: a growable ring under one mutex.
 *
 * Locking: `mutex` protects every field below it. Waiters are counted so that put/get
 * signal a condition variable only when a thread actually sleeps on it, which keeps the
 * uncontended path at one lock/unlock pair.
 *
 * Items leave oldest first, but a put wakes the sleeping getter that took an item most
 * recently, not the one asleep longest (what one shared condition variable gives): a pool
 * of workers fed one job at a time then keeps running it on the same warm thread, its
 * caches and any thread pool it drives (torch's OpenMP team) still hot. Each sleeping
 * getter has its own condition variable for that.
 */
#include "base/fl_queue.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "base/fl_time.h"

enum { INITIAL_SLOTS = 64 };

/* A getter asleep in get/get_many, on its caller's stack while it waits. */
typedef struct sleeper {
    pthread_cond_t wake;
    double last_take; /* when its thread last took an item from any queue (0: never) */
    int woken;        /* a put chose it and it has not run since */
    struct sleeper *next;
} sleeper;

/* The monotonic time of this thread's latest take, which ranks it among sleeping getters. */
static _Thread_local double thread_last_take;

struct fl_queue {
    atomic_int refs; /* acq_rel on release: the last owner must see every other's writes */
    pthread_mutex_t mutex;
    sleeper *sleepers; /* getters waiting for an item, newest first */
    pthread_cond_t not_full;
    pthread_cond_t all_done;
    unsigned char *ring;
    size_t item_size;
    size_t slots; /* allocated capacity of ring, in items */
    size_t head;  /* index of the oldest item */
    size_t count;
    size_t maxsize; /* 0: unbounded */
    size_t unfinished;
    int closed;
    int getters_waiting;
    int putters_waiting;
    int joiners_waiting;
};

int fl_queue_new(size_t maxsize, size_t item_size, fl_queue **out) {
    *out = NULL;
    if (item_size == 0)
        return fl_error_set(FL_EINVAL, "item_size must be > 0");
    fl_queue *q = calloc(1, sizeof *q);
    if (q == NULL)
        return FL_ENOMEM;
    atomic_init(&q->refs, 1);
    q->item_size = item_size;
    q->maxsize = maxsize;
    q->slots = (maxsize != 0 && maxsize < INITIAL_SLOTS) ? maxsize : INITIAL_SLOTS;
    if (q->slots > SIZE_MAX / item_size)
        goto fail_alloc;
    q->ring = malloc(q->slots * item_size);
    if (q->ring == NULL)
        goto fail_alloc;
    if (pthread_mutex_init(&q->mutex, NULL) != 0)
        goto fail_ring;
    if (fl_cond_init(&q->not_full) != 0)
        goto fail_mutex;
    if (fl_cond_init(&q->all_done) != 0)
        goto fail_not_full;
    *out = q;
    return FL_OK;

fail_not_full:
    pthread_cond_destroy(&q->not_full);
fail_mutex:
    pthread_mutex_destroy(&q->mutex);
fail_ring:
    free(q->ring);
fail_alloc:
    free(q);
    return FL_ENOMEM;
}

fl_queue *fl_queue_retain(fl_queue *q) {
    atomic_fetch_add_explicit(&q->refs, 1, memory_order_relaxed);
    return q;
}

void fl_queue_free(fl_queue *q) {
    if (q == NULL || atomic_fetch_sub_explicit(&q->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_cond_destroy(&q->all_done);
    pthread_cond_destroy(&q->not_full);
    pthread_mutex_destroy(&q->mutex);
    free(q->ring);
    free(q);
}

/* position < slots, so one subtraction wraps it (cheaper than % on the hot path). */
static unsigned char *slot_at(fl_queue *q, size_t position) {
    size_t index = q->head + position;
    if (index >= q->slots)
        index -= q->slots;
    return q->ring + index * q->item_size;
}

static int is_full(const fl_queue *q) { return q->maxsize != 0 && q->count >= q->maxsize; }

/* Doubles the ring (never past maxsize), unrolling it so the oldest item lands at 0. */
static int grow(fl_queue *q) {
    size_t new_slots = q->slots * 2;
    if (q->maxsize != 0 && new_slots > q->maxsize)
        new_slots = q->maxsize;
    if (new_slots <= q->slots || new_slots > SIZE_MAX / q->item_size)
        return FL_ENOMEM;
    unsigned char *ring = malloc(new_slots * q->item_size);
    if (ring == NULL)
        return FL_ENOMEM;
    size_t first = q->slots - q->head < q->count ? q->slots - q->head : q->count;
    memcpy(ring, q->ring + q->head * q->item_size, first * q->item_size);
    memcpy(ring + first * q->item_size, q->ring, (q->count - first) * q->item_size);
    free(q->ring);
    q->ring = ring;
    q->slots = new_slots;
    q->head = 0;
    return FL_OK;
}

/* Blocks on `cond` until ready(q) or closed, honouring the timeout; called with the mutex
 * held. Returns 0 when ready (or closed: the caller checks), else FL_EAGAIN/FL_ETIMEDOUT. */
static int wait_for(fl_queue *q, pthread_cond_t *cond, int *waiters, int (*ready)(fl_queue *),
                    double timeout_s) {
    if (ready(q) || q->closed)
        return FL_OK;
    if (timeout_s == 0)
        return FL_EAGAIN;
    struct timespec deadline = fl_deadline_after(timeout_s);
    const struct timespec *until = timeout_s < 0 ? NULL : &deadline;
    int rc = FL_OK;
    (*waiters)++;
    while (!ready(q) && !q->closed && rc == FL_OK)
        rc = fl_cond_wait_until(cond, &q->mutex, until);
    (*waiters)--;
    return (ready(q) || q->closed) ? FL_OK : rc;
}

/* Wakes the sleeping getter not yet woken whose thread took an item last (ties: the newest
 * sleeper); called with the mutex held. */
static void wake_warmest_getter(fl_queue *q) {
    sleeper *chosen = NULL;
    for (sleeper *s = q->sleepers; s != NULL; s = s->next)
        if (!s->woken && (chosen == NULL || s->last_take > chosen->last_take))
            chosen = s;
    if (chosen != NULL) {
        chosen->woken = 1;
        pthread_cond_signal(&chosen->wake);
    }
}

static void unlink_sleeper(fl_queue *q, sleeper *me) {
    for (sleeper **link = &q->sleepers; *link != NULL; link = &(*link)->next)
        if (*link == me) {
            *link = me->next;
            return;
        }
}

/* wait_for() for a getter: sleeps on its own condition variable, listed in q->sleepers, until
 * an item is queued or the queue closes. Called with the mutex held; same return codes. */
static int wait_for_item(fl_queue *q, double timeout_s) {
    if (q->count > 0 || q->closed)
        return FL_OK;
    if (timeout_s == 0)
        return FL_EAGAIN;
    sleeper me = {.last_take = thread_last_take, .woken = 0, .next = q->sleepers};
    int made = fl_cond_init(&me.wake);
    if (made != FL_OK)
        return made;
    struct timespec deadline = fl_deadline_after(timeout_s);
    const struct timespec *until = timeout_s < 0 ? NULL : &deadline;
    int rc = FL_OK;
    q->sleepers = &me;
    q->getters_waiting++;
    while (q->count == 0 && !q->closed && rc == FL_OK) {
        me.woken = 0; /* woken for an item another getter took first: sleep again, choosable */
        rc = fl_cond_wait_until(&me.wake, &q->mutex, until);
    }
    q->getters_waiting--;
    unlink_sleeper(q, &me);
    pthread_cond_destroy(&me.wake);
    return (q->count > 0 || q->closed) ? FL_OK : rc;
}

static int has_room(fl_queue *q) { return !is_full(q); }
static int tasks_done(fl_queue *q) { return q->unfinished == 0; }

int fl_queue_put(fl_queue *q, const void *item, double timeout_s) {
    pthread_mutex_lock(&q->mutex);
    int rc = wait_for(q, &q->not_full, &q->putters_waiting, has_room, timeout_s);
    if (rc == FL_OK && q->closed)
        rc = FL_ECLOSED;
    if (rc == FL_OK && q->count == q->slots)
        rc = grow(q);
    if (rc == FL_OK) {
        memcpy(slot_at(q, q->count), item, q->item_size);
        q->count++;
        q->unfinished++;
        if (q->getters_waiting > 0)
            wake_warmest_getter(q);
    }
    pthread_mutex_unlock(&q->mutex);
    return rc;
}

/* Moves up to max_items of the oldest items out; called with the mutex held. */
static size_t take_locked(fl_queue *q, unsigned char *out, size_t max_items) {
    size_t n = q->count < max_items ? q->count : max_items;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + i * q->item_size, q->ring + q->head * q->item_size, q->item_size);
        if (++q->head == q->slots)
            q->head = 0;
    }
    q->count -= n;
    if (n > 0 && q->putters_waiting > 0) {
        if (n == 1)
            pthread_cond_signal(&q->not_full);
        else
            pthread_cond_broadcast(&q->not_full);
    }
    return n;
}

int fl_queue_get_many(fl_queue *q, void *items_out, size_t max_items, double timeout_s,
                      size_t *n_out) {
    *n_out = 0;
    if (max_items == 0)
        return fl_error_set(FL_EINVAL, "max_items must be > 0");
    pthread_mutex_lock(&q->mutex);
    int rc = wait_for_item(q, timeout_s);
    if (rc == FL_OK && q->count == 0) /* woken by close with nothing left */
        rc = FL_ECLOSED;
    if (rc == FL_OK)
        *n_out = take_locked(q, items_out, max_items);
    pthread_mutex_unlock(&q->mutex);
    if (*n_out > 0)
        thread_last_take = fl_monotonic();
    return rc;
}

int fl_queue_get(fl_queue *q, void *item_out, double timeout_s) {
    size_t n;
    return fl_queue_get_many(q, item_out, 1, timeout_s, &n);
}

size_t fl_queue_size(fl_queue *q) {
    pthread_mutex_lock(&q->mutex);
    size_t n = q->count;
    pthread_mutex_unlock(&q->mutex);
    return n;
}

size_t fl_queue_maxsize(const fl_queue *q) { return q->maxsize; }

size_t fl_queue_getters_waiting(fl_queue *q) {
    pthread_mutex_lock(&q->mutex);
    size_t n = (size_t)q->getters_waiting;
    pthread_mutex_unlock(&q->mutex);
    return n;
}

void fl_queue_close(fl_queue *q) {
    pthread_mutex_lock(&q->mutex);
    q->closed = 1;
    for (sleeper *s = q->sleepers; s != NULL; s = s->next)
        pthread_cond_signal(&s->wake);
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->mutex);
}

int fl_queue_is_closed(fl_queue *q) {
    pthread_mutex_lock(&q->mutex);
    int closed = q->closed;
    pthread_mutex_unlock(&q->mutex);
    return closed;
}

/* Lowers the unfinished count by n (n <= unfinished) and wakes joiners at zero. */
static void finish_tasks_locked(fl_queue *q, size_t n) {
    q->unfinished -= n;
    if (q->unfinished == 0 && q->joiners_waiting > 0)
        pthread_cond_broadcast(&q->all_done);
}

int fl_queue_task_done(fl_queue *q) {
    pthread_mutex_lock(&q->mutex);
    int rc = FL_OK;
    if (q->unfinished == 0)
        rc = fl_error_set(FL_EINVAL, "task_done() called more times than items were put");
    else
        finish_tasks_locked(q, 1);
    pthread_mutex_unlock(&q->mutex);
    return rc;
}

int fl_queue_join(fl_queue *q, double timeout_s) {
    pthread_mutex_lock(&q->mutex);
    int rc = FL_OK;
    if (!tasks_done(q)) {
        if (timeout_s == 0) {
            rc = FL_EAGAIN;
        } else {
            struct timespec deadline = fl_deadline_after(timeout_s);
            const struct timespec *until = timeout_s < 0 ? NULL : &deadline;
            q->joiners_waiting++;
            while (!tasks_done(q) && rc == FL_OK)
                rc = fl_cond_wait_until(&q->all_done, &q->mutex, until);
            q->joiners_waiting--;
            if (tasks_done(q))
                rc = FL_OK;
        }
    }
    pthread_mutex_unlock(&q->mutex);
    return rc;
}

size_t fl_queue_drain(fl_queue *q, void (*fn)(void *ctx, void *item), void *ctx) {
    unsigned char small[256];
    unsigned char *item = q->item_size <= sizeof small ? small : malloc(q->item_size);
    if (item == NULL)
        return 0; /* out of memory: the items stay queued rather than leak */
    size_t removed = 0;
    for (;;) {
        pthread_mutex_lock(&q->mutex);
        size_t n = take_locked(q, item, 1);
        if (n == 1 && q->unfinished > 0)
            finish_tasks_locked(q, 1);
        pthread_mutex_unlock(&q->mutex);
        if (n == 0)
            break;
        removed++;
        if (fn != NULL)
            fn(ctx, item);
    }
    if (item != small)
        free(item);
    return removed;
}

int fl_queue_foreach(fl_queue *q, int (*fn)(void *ctx, const void *item), void *ctx) {
    pthread_mutex_lock(&q->mutex);
    int rc = 0;
    for (size_t i = 0; i < q->count && rc == 0; i++)
        rc = fn(ctx, slot_at(q, i));
    pthread_mutex_unlock(&q->mutex);
    return rc;
}
