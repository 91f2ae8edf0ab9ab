/* fl_metrics.h - thread-safe named statistics: for each name, the count, sum, min, max and
 * last of the values added (so counters, totals, means and maxima all come from one call).
 *
 * One mutex guards the table; an update holds it for a hash lookup and five stores, so any
 * number of threads may update without losing a value. Names are at most
 * FL_METRIC_NAME_MAX - 1 bytes. No call blocks for long; none needs Python.
 */
#ifndef FL_METRICS_H
#define FL_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/fl_event.h"

enum { FL_METRIC_NAME_MAX = FL_EVENT_NAME_MAX };

typedef struct fl_metrics fl_metrics;

typedef struct fl_metric {
    char name[FL_METRIC_NAME_MAX];
    uint64_t count;
    double sum, min, max, last;
} fl_metric;

/* Returns 0 and sets *out, or FL_ENOMEM. Free with fl_metrics_free(). */
int fl_metrics_new(fl_metrics **out);

/* Drops one reference; the last frees the table. NULL is a no-op. */
void fl_metrics_free(fl_metrics *metrics);

/* Takes another reference (a monitor watching the table holds one). Returns metrics. */
fl_metrics *fl_metrics_retain(fl_metrics *metrics);

/* Adds one value to `name` (created on first use): count += 1, sum += value, min/max/last
 * updated. Returns 0, FL_EINVAL (name empty or too long) or FL_ENOMEM. */
int fl_metrics_add(fl_metrics *metrics, const char *name, double value);

/* Copies `name`'s statistics into *out. Returns 0 or FL_EINVAL when no value was added. */
int fl_metrics_get(fl_metrics *metrics, const char *name, fl_metric *out);

/* How many names the table holds now. */
size_t fl_metrics_count(fl_metrics *metrics);

/* A malloc'd copy of every metric in first-use order, taken under one lock hold (free()
 * it); *count says how many. NULL (and *count 0) when out of memory. */
fl_metric *fl_metrics_copy(fl_metrics *metrics, size_t *count);

/* Forgets every metric. */
void fl_metrics_reset(fl_metrics *metrics);

#endif
