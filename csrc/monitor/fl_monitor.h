/* fl_monitor.h - a background monitor: a sampler thread that records host, GPU and watched
 * metrics every interval, and a writer thread that drains every record (sampled or put by
 * the owner) into the sinks, flushing them on an interval.
 *
 * Records travel through one bounded fl_queue of fl_item. Putting one never does I/O and
 * never wakes a thread: the writer polls every FL_MONITOR_POLL_S.
 * Policy when the queue is full: sampled records are dropped (counted as dropped_samples);
 * the owner's records are refused with FL_EAGAIN and the owner decides how long to retry
 * (fastloop.Monitor waits a bounded time, then counts them as dropped_records).
 *
 * Threads: the sampler and the writer each hold a reference to the monitor, so a monitor
 * closed without waiting finishes writing and frees itself. Neither thread runs Python.
 * `lock` (inside) guards the stop flag, flush tickets, errors and the watch list.
 */
#ifndef FL_MONITOR_H
#define FL_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "base/fl_event.h"
#include "base/fl_metrics.h"
#include "monitor/fl_sink.h"
#include "monitor/fl_summary.h"
#include "monitor/fl_sysstats.h"

typedef struct fl_monitor fl_monitor;

typedef struct fl_monitor_config {
    double interval_s;       /* sampling period; <= 0: no sampler thread */
    double flush_interval_s; /* sinks are written out at least this often */
    size_t queue_size;       /* bound of the record queue */
    int sample_host;         /* record host/... metrics */
    int64_t start_step;      /* the step sampled records carry before the first record sets one */
} fl_monitor_config;

enum { FL_MONITOR_MAX_SINKS = 32, FL_MONITOR_MAX_WATCHED = 32 };

/* The writer drains the queue this often (and at once on flush or close): records reach
 * the sinks' buffers within this time, the files within the flush interval. */
#define FL_MONITOR_POLL_S 0.02

/* Starts a monitor writing to `sinks` (ownership of the n sinks and of `gpu`, which may be
 * NULL, passes to the monitor even on failure). Returns 0 and sets *out, or FL_EINVAL,
 * FL_ENOMEM or FL_ESYS. The owner ends it with fl_monitor_close() then fl_monitor_release(). */
int fl_monitor_new(const fl_monitor_config *config, fl_sink **sinks, size_t n, fl_gpu *gpu,
                   fl_monitor **out);

/* Queues a record, waiting up to timeout_s for room. A record with a step >= 0 sets the
 * monitor's latest step; one with step < 0 (and every sampled record) is stamped with it,
 * so everything lines up in step-indexed plots. Returns 0, FL_EAGAIN/FL_ETIMEDOUT (full)
 * or FL_ECLOSED. Any thread. */
int fl_monitor_put(fl_monitor *monitor, const fl_event *event, double timeout_s);

/* Queues a histogram/image/text record (fl_summary.h), waiting up to timeout_s for room. On
 * 0 the monitor owns `summary` (the writer encodes and frees it); otherwise (FL_EAGAIN /
 * FL_ETIMEDOUT: full, FL_ECLOSED) the caller still does. A step < 0 is stamped with the
 * latest step, as for fl_monitor_put(). Any thread. */
int fl_monitor_put_summary(fl_monitor *monitor, fl_summary *summary, double timeout_s);

/* Queues a sampled scalar made outside the sampler thread (an attached stats() source that
 * the Python layer reads every interval), stamped with the latest step; never waits: a full
 * queue drops it, counted as dropped_samples like the sampler's own. Any thread. */
void fl_monitor_put_sample(fl_monitor *monitor, const char *name, double value);

/* Counts one of the owner's records as dropped (after it gave up retrying). */
void fl_monitor_count_dropped(fl_monitor *monitor);

/* Asks the writer to write and flush everything queued so far; returns a ticket for
 * fl_monitor_flushed(), or 0 on failure (FL_EAGAIN: no room within timeout_s; FL_ECLOSED). */
uint64_t fl_monitor_request_flush(fl_monitor *monitor, double timeout_s, int *err);

/* Waits up to timeout_s until the flush with `ticket` is done. Returns 0, FL_EAGAIN or
 * FL_ETIMEDOUT. */
int fl_monitor_flushed(fl_monitor *monitor, uint64_t ticket, double timeout_s);

/* Samples `metrics` every interval as "<name>/per_s" (sum added per second) and
 * "<name>/mean" (mean of the values added since the last sample). Takes a reference.
 * Returns 0 or FL_EINVAL (too many watched tables). */
int fl_monitor_watch(fl_monitor *monitor, fl_metrics *metrics);

/* Stops sampling and closes the queue; the writer writes what is queued, flushes and closes
 * the sinks. With wait set, returns once the writer has finished (sinks closed); else returns
 * at once and the threads finish on their own. Idempotent, and safe from any number of
 * threads at once: the first call joins (wait) or detaches the threads, later ones that wait
 * wait for the writer to finish. Records put after it begins get FL_ECLOSED. */
void fl_monitor_close(fl_monitor *monitor, int wait);

/* Waits up to timeout_s for the writer to finish after close. Returns 0 or FL_ETIMEDOUT. */
int fl_monitor_wait_closed(fl_monitor *monitor, double timeout_s);

/* A buffer this long holds any message fl_monitor_take_error() gives (the error's text and
 * the count of those dropped). */
#define FL_MONITOR_ERROR_MAX 640

/* Copies the oldest error not yet taken (a sink's or a reported one) into `message` and
 * returns 1, or returns 0. Each sink's first error is reported once. Up to
 * FL_MONITOR_MAX_SINKS errors wait to be taken; those that come while that many wait are
 * counted, and the next message taken ends with "(and N more errors were dropped: ...)".
 * Any thread. */
int fl_monitor_take_error(fl_monitor *monitor, char *message, size_t len);

/* 1 when an error waits to be taken (a lock-free check for hot paths). */
int fl_monitor_has_error(fl_monitor *monitor);

/* Queues an error found outside the monitor (a failing Python callback) to be reported
 * like a sink's. Returns 0, or FL_EAGAIN when FL_MONITOR_MAX_SINKS errors already wait (it
 * is then counted as dropped, see fl_monitor_take_error()). Any thread. */
int fl_monitor_report_error(fl_monitor *monitor, const char *message);

typedef struct fl_monitor_stats {
    uint64_t records;         /* records the writer handed to the sinks */
    uint64_t dropped_samples; /* sampled records that found the queue full */
    uint64_t dropped_records; /* owner records given up on */
    uint64_t samples;         /* sampling rounds done */
} fl_monitor_stats;

void fl_monitor_stats_get(fl_monitor *monitor, fl_monitor_stats *out);

/* The GPU source in use (FL_GPU_NONE without a gpu) and its reason ("" without one). */
fl_gpu_source fl_monitor_gpu_source(const fl_monitor *monitor);
const char *fl_monitor_gpu_reason(const fl_monitor *monitor);

/* Path written by sink i (n as given to fl_monitor_new). */
const char *fl_monitor_sink_path(const fl_monitor *monitor, size_t i);

/* Drops the owner's reference (after fl_monitor_close()). NULL is a no-op. */
void fl_monitor_release(fl_monitor *monitor);

#endif
