/* fl_metrics.c - an append-only array of metrics plus an open-addressing index of it, both
 * under one mutex (`lock` protects everything after it). */
#include "base/fl_metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/fl_error.h"

struct fl_metrics {
    atomic_int refs;
    pthread_mutex_t lock;
    fl_metric *items; /* in first-use order */
    size_t count, capacity;
    size_t *index; /* hash slot -> items position + 1; 0 is empty */
    size_t slots;  /* power of two, at least twice count */
};

int fl_metrics_new(fl_metrics **out) {
    fl_metrics *m = calloc(1, sizeof *m);
    if (m == NULL || pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m);
        *out = NULL;
        return FL_ENOMEM;
    }
    atomic_init(&m->refs, 1);
    *out = m;
    return FL_OK;
}

fl_metrics *fl_metrics_retain(fl_metrics *m) {
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
    return m;
}

void fl_metrics_free(fl_metrics *m) {
    if (m == NULL || atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&m->lock);
    free(m->items);
    free(m->index);
    free(m);
}

static uint64_t hash(const char *name) { /* FNV-1a */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *name; name++)
        h = (h ^ (unsigned char)*name) * 0x100000001b3ULL;
    return h;
}

/* The slot holding `name`, or the empty slot where it would go. Called with the lock held. */
static size_t find_slot(const fl_metrics *m, const char *name) {
    size_t slot = hash(name) & (m->slots - 1);
    while (m->index[slot] != 0 && strcmp(m->items[m->index[slot] - 1].name, name) != 0)
        slot = (slot + 1) & (m->slots - 1);
    return slot;
}

/* Doubles the index (and the array when full). Called with the lock held. */
static int grow(fl_metrics *m) {
    if (m->count == m->capacity) {
        size_t capacity = m->capacity ? m->capacity * 2 : 16;
        fl_metric *items = realloc(m->items, capacity * sizeof *items);
        if (items == NULL)
            return FL_ENOMEM;
        m->items = items;
        m->capacity = capacity;
    }
    if (2 * (m->count + 1) > m->slots) {
        size_t slots = m->slots ? m->slots * 2 : 32;
        size_t *index = calloc(slots, sizeof *index);
        if (index == NULL)
            return FL_ENOMEM;
        free(m->index);
        m->index = index;
        m->slots = slots;
        for (size_t i = 0; i < m->count; i++)
            m->index[find_slot(m, m->items[i].name)] = i + 1;
    }
    return FL_OK;
}

int fl_metrics_add(fl_metrics *m, const char *name, double value) {
    size_t len = strlen(name);
    if (len == 0 || len >= FL_METRIC_NAME_MAX)
        return fl_error_set(FL_EINVAL, "metric names are 1 to %d bytes, not %zu",
                            FL_METRIC_NAME_MAX - 1, len);
    pthread_mutex_lock(&m->lock);
    int rc = FL_OK;
    size_t slot = m->slots ? find_slot(m, name) : 0;
    if (m->slots == 0 || m->index[slot] == 0) {
        rc = grow(m);
        if (rc == FL_OK) {
            slot = find_slot(m, name);
            fl_metric *fresh = &m->items[m->count];
            memset(fresh, 0, sizeof *fresh);
            memcpy(fresh->name, name, len + 1);
            fresh->min = fresh->max = value;
            m->index[slot] = ++m->count;
        }
    }
    if (rc == FL_OK) {
        fl_metric *metric = &m->items[m->index[slot] - 1];
        metric->count++;
        metric->sum += value;
        metric->last = value;
        if (value < metric->min)
            metric->min = value;
        if (value > metric->max)
            metric->max = value;
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int fl_metrics_get(fl_metrics *m, const char *name, fl_metric *out) {
    pthread_mutex_lock(&m->lock);
    size_t slot = m->slots ? find_slot(m, name) : 0;
    int found = m->slots && m->index[slot] != 0;
    if (found)
        *out = m->items[m->index[slot] - 1];
    pthread_mutex_unlock(&m->lock);
    return found ? FL_OK : fl_error_set(FL_EINVAL, "no metric named '%.60s'", name);
}

size_t fl_metrics_count(fl_metrics *m) {
    pthread_mutex_lock(&m->lock);
    size_t count = m->count;
    pthread_mutex_unlock(&m->lock);
    return count;
}

fl_metric *fl_metrics_copy(fl_metrics *m, size_t *count) {
    pthread_mutex_lock(&m->lock);
    fl_metric *copy = malloc((m->count ? m->count : 1) * sizeof *copy);
    *count = copy != NULL ? m->count : 0;
    if (copy != NULL && m->count > 0)
        memcpy(copy, m->items, m->count * sizeof *copy);
    pthread_mutex_unlock(&m->lock);
    return copy;
}

void fl_metrics_reset(fl_metrics *m) {
    pthread_mutex_lock(&m->lock);
    m->count = 0;
    if (m->index != NULL)
        memset(m->index, 0, m->slots * sizeof *m->index);
    pthread_mutex_unlock(&m->lock);
}
