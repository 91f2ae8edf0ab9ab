/* fl_queue_load.h - test and benchmark support, not part of the core: load generators for fl_queue, shared by the C tests, the Python tests
 * and the benchmarks: C threads that put event records, and a producers x consumers run
 * that checks nothing is lost, duplicated or reordered.
 *
 * The items are fl_item records tagged FL_ITEM_EVENT (what fastloop.Queue carries), with
 * `source` = producer index and `step` = the producer's sequence number.
 */
#ifndef FL_QUEUE_LOAD_H
#define FL_QUEUE_LOAD_H

#include <stdint.h>

#include "base/fl_queue.h"

typedef struct fl_queue_load_result {
    double seconds;      /* from the first thread started to the last joined */
    uint64_t received;   /* items the consumers took */
    uint64_t duplicates; /* items seen twice */
    uint64_t missing;    /* items put but never taken */
    uint64_t reordered;  /* items of one producer that one consumer saw out of order */
} fl_queue_load_result;

/* Runs `producers` threads putting `items_per_producer` items each through a fresh queue
 * of fl_item bounded at `maxsize`, and `consumers` threads taking them until the queue is
 * closed (once the producers finish) and drained. With `close_early` set, the queue is
 * closed when half the items are in, while traffic still flows: producers stop at
 * FL_ECLOSED, and every item whose put succeeded must still be taken exactly once
 * (`missing` counts those that were not). Blocks until done; runs no Python. Returns 0,
 * FL_EINVAL, FL_ENOMEM or FL_ESYS. */
int fl_queue_load_run(int producers, int consumers, uint64_t items_per_producer, size_t maxsize,
                      int close_early, fl_queue_load_result *out);

typedef struct fl_event_emitter fl_event_emitter;

/* Starts `producers` C threads that each put `count` FL_EVENT_SCALAR records named `name`
 * (value = step = the sequence number, source = producer index) on `queue`, blocking
 * while it is full. `queue` must outlive the emitter. Returns 0 and sets *out, or
 * FL_EINVAL/FL_ENOMEM/FL_ESYS. Free with fl_event_emitter_free(). */
int fl_event_emitter_start(fl_queue *queue, int producers, uint64_t count, const char *name,
                           fl_event_emitter **out);

/* Waits up to timeout_s for every producer to finish. Returns 0 or FL_EAGAIN/FL_ETIMEDOUT. */
int fl_event_emitter_wait(fl_event_emitter *emitter, double timeout_s);

/* Asks the producers to stop at their next wait slice, joins them, frees the emitter and
 * returns how many records were put in all. NULL gives 0. */
uint64_t fl_event_emitter_free(fl_event_emitter *emitter);

#endif
