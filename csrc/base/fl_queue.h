/* fl_queue.h - a bounded multi-producer multi-consumer FIFO of fixed-size items.
 *
 * Items are copied in and out by value (item_size bytes each), so a queue carries plain C
 * records (fl_event) or pointers whose ownership the caller manages. One mutex protects
 * the ring; producers and consumers block on condition variables and are woken only when
 * somebody waits. Any thread may call any function; none of them needs Python.
 *
 * Waits take a timeout in seconds: < 0 forever, 0 never wait (FL_EAGAIN), > 0 at most that
 * long (FL_ETIMEDOUT). Callers that must stay interruptible wait in short slices.
 * Semantics follow Python's queue.Queue, plus close(): once closed, put fails with
 * FL_ECLOSED and get returns the items still queued, then FL_ECLOSED.
 *
 * Items leave oldest first; a put wakes the waiting getter whose thread took an item most
 * recently (its caches warm), not the one that has waited longest.
 */
#ifndef FL_QUEUE_H
#define FL_QUEUE_H

#include <stddef.h>

typedef struct fl_queue fl_queue;

/* Creates a queue holding up to `maxsize` items of `item_size` bytes (maxsize 0: no bound).
 * Storage grows on demand. Returns 0 and sets *out, or FL_EINVAL (item_size 0) or FL_ENOMEM.
 * The caller frees it with fl_queue_free(). */
int fl_queue_new(size_t maxsize, size_t item_size, fl_queue **out);

/* Drops one reference; the last frees the queue and any items still in it (their bytes only:
 * drain first if the items own resources). A queue starts with one reference. Nobody may use
 * the queue through a dropped reference. NULL is a no-op. */
void fl_queue_free(fl_queue *q);

/* Takes another reference (for a component that must keep the queue alive, such as a sink
 * fed by a background thread); pair it with fl_queue_free(). Returns q. */
fl_queue *fl_queue_retain(fl_queue *q);

/* Copies `item` in. Blocks while the queue is full, up to timeout_s. Returns 0, FL_EAGAIN
 * (timeout 0 and full), FL_ETIMEDOUT, FL_ECLOSED, or FL_ENOMEM (growth failed). */
int fl_queue_put(fl_queue *q, const void *item, double timeout_s);

/* Copies the oldest item into `item_out`. Blocks while empty, up to timeout_s. Returns 0,
 * FL_EAGAIN (timeout 0 and empty), FL_ETIMEDOUT, FL_ECLOSED (closed and empty), or FL_ESYS
 * when the system refuses the wait's condition variable. */
int fl_queue_get(fl_queue *q, void *item_out, double timeout_s);

/* Like fl_queue_get() for up to max_items items: waits (up to timeout_s) for the first, then
 * takes whatever else is queued without waiting. Sets *n_out to the number copied (0 on
 * error). Same return codes as fl_queue_get(). */
int fl_queue_get_many(fl_queue *q, void *items_out, size_t max_items, double timeout_s,
                      size_t *n_out);

/* Number of items queued now (a snapshot). Never fails. */
size_t fl_queue_size(fl_queue *q);

/* Number of threads blocked in get/get_many now, waiting for an item (a snapshot). */
size_t fl_queue_getters_waiting(fl_queue *q);

/* The bound given to fl_queue_new() (0: none). Never fails. */
size_t fl_queue_maxsize(const fl_queue *q);

/* Closes the queue and wakes every waiting put and get. Idempotent; never fails. */
void fl_queue_close(fl_queue *q);

/* 1 once fl_queue_close() was called, else 0. */
int fl_queue_is_closed(fl_queue *q);

/* Marks one item taken by a consumer as processed (queue.Queue.task_done). Returns 0, or
 * FL_EINVAL when called more times than items were put. */
int fl_queue_task_done(fl_queue *q);

/* Waits until every item put has been marked done, up to timeout_s. Returns 0, FL_EAGAIN
 * (timeout 0 and work pending) or FL_ETIMEDOUT. */
int fl_queue_join(fl_queue *q, double timeout_s);

/* Removes every queued item, calling fn(ctx, item) on each outside the lock (fn may free
 * what the item owns, even call back into the queue). Items removed count as done for
 * fl_queue_join(). Returns the number removed (0 with the items left queued if a scratch item
 * larger than 256 bytes cannot be allocated). */
size_t fl_queue_drain(fl_queue *q, void (*fn)(void *ctx, void *item), void *ctx);

/* Calls fn(ctx, item) on each queued item, oldest first, while holding the lock: fn must
 * not call into this queue. Stops early and returns fn's value when it is non-zero. */
int fl_queue_foreach(fl_queue *q, int (*fn)(void *ctx, const void *item), void *ctx);

#endif
