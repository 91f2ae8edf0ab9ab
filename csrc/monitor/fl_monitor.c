/* fl_monitor.c - the sampler and writer threads around one record queue.
 *
 * Locking: `lock` guards stopping, closed, threads_taken, writer_done, flush_issued,
 * flushed, the error ring and the watch list; `wake` is signalled when any of them changes.
 * Counters read by other threads (stats, last_step) are relaxed atomics: they are reports,
 * not synchronization.
 *
 * Closing: the first fl_monitor_close() takes the threads (threads_taken, under the lock) and
 * is the only caller that joins or detaches them; every later close that waits, from any
 * thread, waits for writer_done instead, so no thread is joined twice.
 */
#include "monitor/fl_monitor.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"
#include "base/fl_thread.h"
#include "base/fl_time.h"

enum { FLUSH_MARKER = -1, BATCH = 256, MAX_GPUS = 64, ERROR_TEXT = 512 };
enum { ERROR_ROOM = FL_MONITOR_MAX_SINKS }; /* errors waiting to be taken, at most */

typedef struct watched {
    fl_metrics *metrics;
    fl_metric *previous; /* snapshot at the last sample */
    size_t previous_count;
    double previous_time;
} watched;

struct fl_monitor {
    atomic_int refs; /* owner + sampler + writer */
    fl_monitor_config config;
    fl_queue *queue;
    fl_sink *sinks[FL_MONITOR_MAX_SINKS];
    int sink_error_taken[FL_MONITOR_MAX_SINKS]; /* writer-only: error already queued */
    size_t n_sinks;
    fl_gpu *gpu;
    pthread_t sampler, writer;
    int has_sampler, has_writer;

    pthread_mutex_t lock;
    pthread_cond_t wake;        /* the sampler sleeps on it; flush and close waiters too */
    pthread_cond_t writer_wake; /* the writer sleeps on it between polls */
    int writer_wanted;          /* a flush or close wants the writer before its next poll */
    int stopping, closed, threads_taken, writer_done;
    uint64_t flush_issued, flushed;
    char errors[ERROR_ROOM][ERROR_TEXT]; /* a ring: each sink's first error, and reported ones */
    size_t errors_first, errors_waiting;  /* the oldest not taken yet; how many wait */
    uint64_t errors_dropped;              /* came while it was full: told with the next taken */
    watched watch[FL_MONITOR_MAX_WATCHED];
    size_t n_watched;

    atomic_uint_fast64_t records, dropped_samples, dropped_records, samples;
    atomic_int errors_untaken; /* lets fl_monitor_has_error() skip the lock */
    atomic_int_fast64_t last_step;
};

/* ---- lifetime ---- */

/* Frees the summaries still queued (the writer never ran, or stopped early). */
static void free_queued_summaries(fl_queue *queue) {
    fl_item items[64];
    size_t n;
    while (fl_queue_get_many(queue, items, 64, 0, &n) == FL_OK && n > 0)
        for (size_t i = 0; i < n; i++)
            if (items[i].tag == FL_ITEM_POINTER)
                free(items[i].as.pointer);
}

static void destroy(fl_monitor *m) {
    if (m->queue != NULL)
        free_queued_summaries(m->queue);
    for (size_t i = 0; i < m->n_sinks; i++)
        fl_sink_free(m->sinks[i]);
    for (size_t i = 0; i < m->n_watched; i++) {
        fl_metrics_free(m->watch[i].metrics);
        free(m->watch[i].previous);
    }
    fl_gpu_close(m->gpu);
    fl_queue_free(m->queue);
    pthread_cond_destroy(&m->writer_wake);
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void fl_monitor_release(fl_monitor *m) {
    if (m != NULL && atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1)
        destroy(m);
}

/* ---- the error ring ---- */

/* Queues `message` for the owner to take, or counts it as dropped when ERROR_ROOM errors
 * wait already. Returns FL_OK or FL_EAGAIN. Called with the lock held. */
static int queue_error_locked(fl_monitor *m, const char *message) {
    if (m->errors_waiting == ERROR_ROOM) {
        m->errors_dropped++;
        return FL_EAGAIN;
    }
    size_t last = (m->errors_first + m->errors_waiting) % ERROR_ROOM;
    snprintf(m->errors[last], ERROR_TEXT, "%s", message);
    m->errors_waiting++;
    atomic_store_explicit(&m->errors_untaken, (int)m->errors_waiting, memory_order_relaxed);
    return FL_OK;
}

/* Copies the oldest waiting error into message, with the count of those dropped since the
 * last one taken (they came while the ring was full), and frees its place. Lock held. */
static void take_error_locked(fl_monitor *m, char *message, size_t len) {
    const char *text = m->errors[m->errors_first];
    uint64_t dropped = m->errors_dropped;
    if (dropped == 0)
        snprintf(message, len, "%s", text);
    else
        snprintf(message, len, "%s (and %llu more error%s dropped: over %d waited to be reported)",
                 text, (unsigned long long)dropped, dropped == 1 ? " was" : "s were", ERROR_ROOM);
    m->errors_dropped = 0;
    m->errors_first = (m->errors_first + 1) % ERROR_ROOM;
    m->errors_waiting--;
    atomic_store_explicit(&m->errors_untaken, (int)m->errors_waiting, memory_order_relaxed);
}

/* ---- writer thread ---- */

/* Queues the first error of every sink that has failed since the last look. */
static void collect_errors(fl_monitor *m) {
    for (size_t i = 0; i < m->n_sinks; i++) {
        const char *message;
        if (m->sink_error_taken[i] || fl_sink_error(m->sinks[i], &message) == 0)
            continue;
        m->sink_error_taken[i] = 1;
        pthread_mutex_lock(&m->lock);
        queue_error_locked(m, message);
        pthread_mutex_unlock(&m->lock);
    }
}

static void flush_sinks(fl_monitor *m) {
    for (size_t i = 0; i < m->n_sinks; i++)
        fl_sink_flush(m->sinks[i]);
    collect_errors(m);
}

/* Hands k scalar/marker records to every sink. */
static void write_events(fl_monitor *m, const fl_event *events, size_t k) {
    if (k == 0)
        return;
    for (size_t s = 0; s < m->n_sinks; s++)
        fl_sink_write(m->sinks[s], events, k);
    atomic_fetch_add_explicit(&m->records, k, memory_order_relaxed);
}

/* Hands one summary to every sink (encoded here, off the owner's thread) and frees it. */
static void write_summary(fl_monitor *m, fl_summary *summary) {
    for (size_t s = 0; s < m->n_sinks; s++)
        fl_sink_write_summary(m->sinks[s], summary);
    atomic_fetch_add_explicit(&m->records, 1, memory_order_relaxed);
    free(summary);
}

/* Hands a batch to every sink, in order; returns the highest flush ticket found in it (0:
 * none). */
static uint64_t write_batch(fl_monitor *m, const fl_item *items, size_t n, fl_event *events) {
    uint64_t ticket = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].tag == FL_ITEM_POINTER) {
            write_events(m, events, k); /* what came before it goes first */
            k = 0;
            write_summary(m, items[i].as.pointer);
        } else if (items[i].as.event.kind == FLUSH_MARKER) {
            uint64_t t = (uint64_t)items[i].as.event.step;
            ticket = t > ticket ? t : ticket;
        } else {
            events[k++] = items[i].as.event;
        }
    }
    write_events(m, events, k);
    if (n > 0)
        collect_errors(m);
    return ticket;
}

static void mark_flushed(fl_monitor *m, uint64_t ticket, int done) {
    pthread_mutex_lock(&m->lock);
    if (ticket > m->flushed)
        m->flushed = ticket;
    if (done) {
        m->writer_done = 1;
        m->flushed = m->flush_issued; /* sinks are closed: every flush is complete */
    }
    pthread_cond_broadcast(&m->wake);
    pthread_mutex_unlock(&m->lock);
}

/* Sleeps until the next poll, the next flush, or a wake-up (flush request, close). The
 * writer never waits on the queue itself: a waiting reader would make every put pay a
 * wake-up (a futex call and a context switch), and logging needs no such latency. */
static void writer_sleep(fl_monitor *m, double next_flush) {
    double until = fl_monotonic() + FL_MONITOR_POLL_S;
    if (next_flush < until)
        until = next_flush;
    pthread_mutex_lock(&m->lock);
    if (!m->stopping && !m->writer_wanted && until > fl_monotonic()) {
        struct timespec deadline = fl_deadline_after(until - fl_monotonic());
        fl_cond_wait_until(&m->writer_wake, &m->lock, &deadline);
    }
    m->writer_wanted = 0;
    pthread_mutex_unlock(&m->lock);
}

/* Wakes the writer now (a flush was requested, or the monitor is closing). */
static void wake_writer(fl_monitor *m) {
    pthread_mutex_lock(&m->lock);
    m->writer_wanted = 1;
    pthread_cond_signal(&m->writer_wake);
    pthread_mutex_unlock(&m->lock);
}

static void *writer_main(void *arg) {
    fl_monitor *m = arg;
    fl_thread_background();
    fl_item items[BATCH];
    fl_event events[BATCH];
    double next_flush = fl_monotonic() + m->config.flush_interval_s;
    for (;;) {
        size_t n = 0;
        int rc = fl_queue_get_many(m->queue, items, BATCH, 0, &n);
        uint64_t ticket = write_batch(m, items, n, events);
        if (ticket != 0 || fl_monotonic() >= next_flush) {
            flush_sinks(m);
            next_flush = fl_monotonic() + m->config.flush_interval_s;
            if (ticket != 0)
                mark_flushed(m, ticket, 0);
        }
        if (rc == FL_ECLOSED)
            break;
        if (n < BATCH) /* drained: rest until there is more to do */
            writer_sleep(m, next_flush);
    }
    for (size_t i = 0; i < m->n_sinks; i++)
        fl_sink_close(m->sinks[i]);
    collect_errors(m);
    mark_flushed(m, 0, 1);
    fl_monitor_release(m);
    return NULL;
}

/* ---- sampler thread ---- */

/* Queues one sampled scalar without waiting; a full queue drops it. */
static void sample(fl_monitor *m, const char *name, double value, int source) {
    fl_item item = {.tag = FL_ITEM_EVENT};
    fl_event_init(&item.as.event, FL_EVENT_SCALAR, name, value,
                  atomic_load_explicit(&m->last_step, memory_order_relaxed), source);
    if (fl_queue_put(m->queue, &item, 0) != FL_OK)
        atomic_fetch_add_explicit(&m->dropped_samples, 1, memory_order_relaxed);
}

void fl_monitor_put_sample(fl_monitor *m, const char *name, double value) {
    sample(m, name, value, -1);
}

static void sample_host(fl_monitor *m, fl_host_sampler *host) {
    fl_host_stats stats;
    if (fl_host_sample(host, &stats) != FL_OK)
        return;
    sample(m, "host/rss_bytes", stats.rss_bytes, -1);
    if (stats.cpu_percent >= 0)
        sample(m, "host/cpu_percent", stats.cpu_percent, -1);
    if (stats.mem_available_bytes >= 0)
        sample(m, "host/mem_available_bytes", stats.mem_available_bytes, -1);
}

static void sample_gpus(fl_monitor *m) {
    fl_gpu_stats gpus[MAX_GPUS];
    int count = 0;
    if (m->gpu == NULL || fl_gpu_source_of(m->gpu) == FL_GPU_NONE ||
        fl_gpu_sample(m->gpu, gpus, MAX_GPUS, &count) != FL_OK)
        return;
    char name[FL_EVENT_NAME_MAX];
    for (int i = 0; i < count; i++) {
        snprintf(name, sizeof name, "gpu%d/memory_used_bytes", gpus[i].index);
        sample(m, name, gpus[i].memory_used_bytes, gpus[i].index);
        snprintf(name, sizeof name, "gpu%d/memory_total_bytes", gpus[i].index);
        sample(m, name, gpus[i].memory_total_bytes, gpus[i].index);
        snprintf(name, sizeof name, "gpu%d/utilization_percent", gpus[i].index);
        sample(m, name, gpus[i].utilization_percent, gpus[i].index);
    }
}

static const fl_metric *find_metric(const fl_metric *items, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(items[i].name, name) == 0)
            return &items[i];
    return NULL;
}

/* Samples one watched table: rates and means since the previous look. Called by the
 * sampler with the lock held (the watch list is shared with fl_monitor_watch()). */
static void sample_watched(fl_monitor *m, watched *w, double now) {
    size_t count;
    fl_metric *current = fl_metrics_copy(w->metrics, &count);
    if (current == NULL)
        return;
    double elapsed = now - w->previous_time;
    char name[FL_EVENT_NAME_MAX];
    for (size_t i = 0; i < count && elapsed > 0; i++) {
        const fl_metric *before = find_metric(w->previous, w->previous_count, current[i].name);
        double sum = current[i].sum - (before ? before->sum : 0);
        uint64_t added = current[i].count - (before ? before->count : 0);
        if (snprintf(name, sizeof name, "%s/per_s", current[i].name) < (int)sizeof name)
            sample(m, name, sum / elapsed, -1);
        if (added > 0 && snprintf(name, sizeof name, "%s/mean", current[i].name) < (int)sizeof name)
            sample(m, name, sum / (double)added, -1);
    }
    free(w->previous);
    w->previous = current;
    w->previous_count = count;
    w->previous_time = now;
}

static void sample_all(fl_monitor *m, fl_host_sampler *host) {
    if (m->config.sample_host)
        sample_host(m, host);
    sample_gpus(m);
    pthread_mutex_lock(&m->lock);
    double now = fl_monotonic();
    for (size_t i = 0; i < m->n_watched; i++)
        sample_watched(m, &m->watch[i], now);
    pthread_mutex_unlock(&m->lock);
    sample(m, "monitor/dropped",
           (double)(atomic_load_explicit(&m->dropped_samples, memory_order_relaxed) +
                    atomic_load_explicit(&m->dropped_records, memory_order_relaxed)),
           -1);
    atomic_fetch_add_explicit(&m->samples, 1, memory_order_relaxed);
}

static void *sampler_main(void *arg) {
    fl_monitor *m = arg;
    fl_thread_background();
    fl_host_sampler host;
    fl_host_sampler_init(&host);
    double next = fl_monotonic();
    pthread_mutex_lock(&m->lock);
    while (!m->stopping) {
        if (fl_monotonic() < next) {
            struct timespec until = fl_deadline_after(next - fl_monotonic());
            fl_cond_wait_until(&m->wake, &m->lock, &until);
            continue;
        }
        pthread_mutex_unlock(&m->lock);
        sample_all(m, &host);
        double now = fl_monotonic();
        next += m->config.interval_s;
        if (next < now) /* fell behind (a slow nvidia-smi): skip the missed rounds */
            next = now + m->config.interval_s;
        pthread_mutex_lock(&m->lock);
    }
    pthread_mutex_unlock(&m->lock);
    fl_monitor_release(m);
    return NULL;
}

/* ---- owner API ---- */

int fl_monitor_new(const fl_monitor_config *config, fl_sink **sinks, size_t n, fl_gpu *gpu,
                   fl_monitor **out) {
    *out = NULL;
    fl_monitor *m = calloc(1, sizeof *m);
    if (m == NULL || n > FL_MONITOR_MAX_SINKS) {
        for (size_t i = 0; i < n; i++)
            fl_sink_free(sinks[i]);
        fl_gpu_close(gpu);
        free(m);
        return m == NULL ? FL_ENOMEM : fl_error_set(FL_EINVAL, "at most %d sinks", FL_MONITOR_MAX_SINKS);
    }
    m->config = *config;
    if (m->config.flush_interval_s <= 0)
        m->config.flush_interval_s = 1.0;
    memcpy(m->sinks, sinks, n * sizeof *sinks);
    m->n_sinks = n;
    m->gpu = gpu;
    atomic_init(&m->refs, 1);
    atomic_init(&m->last_step, config->start_step); /* a resumed run goes on from its step */
    pthread_mutex_init(&m->lock, NULL);
    int rc = fl_cond_init(&m->wake);
    if (rc == FL_OK)
        rc = fl_cond_init(&m->writer_wake);
    if (rc == FL_OK)
        rc = fl_queue_new(config->queue_size, sizeof(fl_item), &m->queue);
    if (rc == FL_OK) {
        atomic_fetch_add(&m->refs, 1);
        rc = fl_thread_start(&m->writer, writer_main, m);
        m->has_writer = rc == FL_OK;
        if (rc != FL_OK)
            atomic_fetch_sub(&m->refs, 1);
    }
    if (rc == FL_OK && config->interval_s > 0) {
        atomic_fetch_add(&m->refs, 1);
        rc = fl_thread_start(&m->sampler, sampler_main, m);
        m->has_sampler = rc == FL_OK;
        if (rc != FL_OK)
            atomic_fetch_sub(&m->refs, 1);
    }
    if (rc != FL_OK) {
        fl_monitor_close(m, 1);
        fl_monitor_release(m);
        return rc;
    }
    *out = m;
    return FL_OK;
}

int fl_monitor_put(fl_monitor *m, const fl_event *event, double timeout_s) {
    fl_item item = {.tag = FL_ITEM_EVENT, .as.event = *event};
    if (event->step < 0)
        item.as.event.step = atomic_load_explicit(&m->last_step, memory_order_relaxed);
    else
        atomic_store_explicit(&m->last_step, event->step, memory_order_relaxed);
    return fl_queue_put(m->queue, &item, timeout_s);
}

int fl_monitor_put_summary(fl_monitor *m, fl_summary *summary, double timeout_s) {
    fl_item item = {.tag = FL_ITEM_POINTER, .as.pointer = summary};
    if (summary->step < 0)
        summary->step = atomic_load_explicit(&m->last_step, memory_order_relaxed);
    else
        atomic_store_explicit(&m->last_step, summary->step, memory_order_relaxed);
    return fl_queue_put(m->queue, &item, timeout_s);
}

void fl_monitor_count_dropped(fl_monitor *m) {
    atomic_fetch_add_explicit(&m->dropped_records, 1, memory_order_relaxed);
}

uint64_t fl_monitor_request_flush(fl_monitor *m, double timeout_s, int *err) {
    pthread_mutex_lock(&m->lock);
    uint64_t ticket = ++m->flush_issued;
    pthread_mutex_unlock(&m->lock);
    fl_item item = {.tag = FL_ITEM_EVENT};
    item.as.event.kind = FLUSH_MARKER;
    item.as.event.step = (int64_t)ticket;
    *err = fl_queue_put(m->queue, &item, timeout_s);
    if (*err == FL_OK)
        wake_writer(m);
    return *err == FL_OK ? ticket : 0;
}

int fl_monitor_flushed(fl_monitor *m, uint64_t ticket, double timeout_s) {
    pthread_mutex_lock(&m->lock);
    int rc = FL_OK;
    if (m->flushed < ticket && timeout_s == 0)
        rc = FL_EAGAIN;
    struct timespec until = fl_deadline_after(timeout_s);
    while (rc == FL_OK && m->flushed < ticket)
        rc = fl_cond_wait_until(&m->wake, &m->lock, timeout_s < 0 ? NULL : &until);
    if (m->flushed >= ticket)
        rc = FL_OK;
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int fl_monitor_watch(fl_monitor *m, fl_metrics *metrics) {
    pthread_mutex_lock(&m->lock);
    int rc = FL_OK;
    if (m->n_watched == FL_MONITOR_MAX_WATCHED) {
        rc = fl_error_set(FL_EINVAL, "at most %d watched metric tables", FL_MONITOR_MAX_WATCHED);
    } else {
        watched *w = &m->watch[m->n_watched++];
        *w = (watched){fl_metrics_retain(metrics), NULL, 0, fl_monotonic()};
        w->previous = fl_metrics_copy(metrics, &w->previous_count); /* rates start from now */
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

void fl_monitor_close(fl_monitor *m, int wait) {
    pthread_mutex_lock(&m->lock);
    int first = !m->threads_taken;
    m->threads_taken = 1;
    m->stopping = 1;
    pthread_cond_broadcast(&m->wake);
    pthread_mutex_unlock(&m->lock);
    if (m->queue != NULL)
        fl_queue_close(m->queue);
    wake_writer(m);
    if (!first) {
        if (wait)
            fl_monitor_wait_closed(m, -1);
        return;
    }
    if (m->has_sampler)
        wait ? pthread_join(m->sampler, NULL) : pthread_detach(m->sampler);
    if (m->has_writer)
        wait ? pthread_join(m->writer, NULL) : pthread_detach(m->writer);
}

int fl_monitor_wait_closed(fl_monitor *m, double timeout_s) {
    pthread_mutex_lock(&m->lock);
    int rc = FL_OK;
    struct timespec until = fl_deadline_after(timeout_s);
    while (!m->writer_done && m->has_writer && rc == FL_OK)
        rc = timeout_s == 0 ? FL_ETIMEDOUT
                            : fl_cond_wait_until(&m->wake, &m->lock, timeout_s < 0 ? NULL : &until);
    if (m->writer_done || !m->has_writer)
        rc = FL_OK;
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int fl_monitor_take_error(fl_monitor *m, char *message, size_t len) {
    pthread_mutex_lock(&m->lock);
    int found = m->errors_waiting > 0;
    if (found)
        take_error_locked(m, message, len);
    pthread_mutex_unlock(&m->lock);
    return found;
}

int fl_monitor_has_error(fl_monitor *m) {
    return atomic_load_explicit(&m->errors_untaken, memory_order_relaxed) > 0;
}

int fl_monitor_report_error(fl_monitor *m, const char *message) {
    pthread_mutex_lock(&m->lock);
    int rc = queue_error_locked(m, message);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

void fl_monitor_stats_get(fl_monitor *m, fl_monitor_stats *out) {
    out->records = atomic_load_explicit(&m->records, memory_order_relaxed);
    out->dropped_samples = atomic_load_explicit(&m->dropped_samples, memory_order_relaxed);
    out->dropped_records = atomic_load_explicit(&m->dropped_records, memory_order_relaxed);
    out->samples = atomic_load_explicit(&m->samples, memory_order_relaxed);
}

fl_gpu_source fl_monitor_gpu_source(const fl_monitor *m) {
    return m->gpu ? fl_gpu_source_of(m->gpu) : FL_GPU_NONE;
}

const char *fl_monitor_gpu_reason(const fl_monitor *m) { return m->gpu ? fl_gpu_reason(m->gpu) : ""; }

const char *fl_monitor_sink_path(const fl_monitor *m, size_t i) {
    return i < m->n_sinks ? fl_sink_path(m->sinks[i]) : "";
}
