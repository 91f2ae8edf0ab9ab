/* fl_sink.c - the four sink kinds behind one small vtable. File sinks format into an fl_buf
 * and write it with fl_file_write_all(), so short writes and errors are handled in one place.
 */
#include "monitor/fl_sink.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fl_buf.h"
#include "base/fl_error.h"
#include "base/fl_file.h"
#include "monitor/fl_tfevents.h"
#include "base/fl_time.h"

enum { FLUSH_AT_BYTES = 64 * 1024 };

typedef enum sink_kind { SINK_CSV, SINK_JSONL, SINK_TENSORBOARD, SINK_QUEUE } sink_kind;

struct fl_sink {
    sink_kind kind;
    int fd; /* -1 when closed or for queue sinks */
    fl_queue *queue;
    fl_buf pending;
    int error;
    uint64_t dropped;
    char error_text[PATH_MAX + 128];
    char path[PATH_MAX];
};

static const char *kind_name(int32_t kind) {
    return kind == FL_EVENT_SCALAR ? "scalar" : kind == FL_EVENT_MARKER ? "marker" : "unknown";
}

/* Keeps the first error's code and message (taken from fl_error_detail()); returns it. */
static int record_error(fl_sink *sink, int err) {
    if (sink->error == 0) {
        sink->error = err;
        snprintf(sink->error_text, sizeof sink->error_text, "%s",
                 err == FL_ENOMEM ? "out of memory formatting records" : fl_error_detail());
    }
    return sink->error;
}

/* Opens `path` for writing, creating its directory first (as the TensorBoard sink does). */
static int open_file(fl_sink *sink, const char *path, int flags) {
    snprintf(sink->path, sizeof sink->path, "%s", path);
    char *slash = strrchr(sink->path, '/');
    if (slash != NULL && slash != sink->path) {
        *slash = '\0';
        int rc = fl_file_make_dirs(sink->path);
        *slash = '/';
        if (rc != FL_OK)
            return rc;
    }
    sink->fd = open(path, flags | O_WRONLY | O_CLOEXEC, 0666);
    if (sink->fd < 0)
        return fl_error_sys("cannot open %s", path);
    return FL_OK;
}

static fl_sink *new_sink(sink_kind kind) {
    fl_sink *sink = calloc(1, sizeof *sink);
    if (sink != NULL) {
        sink->kind = kind;
        sink->fd = -1;
    }
    return sink;
}

/* ---- formatting ---- */

static void csv_text(fl_buf *b, const char *text) {
    if (strpbrk(text, ",\"\r\n") == NULL) {
        fl_buf_append(b, text, strlen(text));
        return;
    }
    fl_buf_append(b, "\"", 1);
    for (const char *p = text; *p; p++) {
        if (*p == '"')
            fl_buf_append(b, "\"\"", 2); /* a quote inside a quoted field is doubled */
        else
            fl_buf_append(b, p, 1);
    }
    fl_buf_append(b, "\"", 1);
}

static void format_csv(fl_buf *b, const fl_event *e) {
    fl_buf_seconds(b, e->wall_time);
    fl_buf_append(b, ",", 1);
    fl_buf_int(b, e->step);
    fl_buf_append(b, ",", 1);
    csv_text(b, e->name);
    fl_buf_append(b, ",", 1);
    fl_buf_double(b, e->value);
    const char *kind = kind_name(e->kind);
    fl_buf_append(b, ",", 1);
    fl_buf_append(b, kind, strlen(kind));
    fl_buf_append(b, ",", 1);
    fl_buf_int(b, e->source);
    fl_buf_append(b, "\n", 1);
}

static void json_string(fl_buf *b, const char *text) {
    fl_buf_append(b, "\"", 1);
    const unsigned char *run = (const unsigned char *)text, *p = run;
    for (; *p; p++) { /* copy runs of plain bytes at once; escape the rest */
        if (*p != '"' && *p != '\\' && *p >= 0x20)
            continue;
        fl_buf_append(b, run, (size_t)(p - run));
        if (*p < 0x20)
            fl_buf_printf(b, "\\u%04x", *p);
        else
            fl_buf_printf(b, "\\%c", *p);
        run = p + 1;
    }
    fl_buf_append(b, run, (size_t)(p - run));
    fl_buf_append(b, "\"", 1);
}

static void json_number(fl_buf *b, double value) {
    if (isnan(value)) /* JSON has no NaN/inf: written as Python's json module does */
        fl_buf_append(b, "NaN", 3);
    else if (isinf(value) && value > 0)
        fl_buf_append(b, "Infinity", 8);
    else if (isinf(value))
        fl_buf_append(b, "-Infinity", 9);
    else
        fl_buf_double(b, value);
}

/* TensorBoard stores a scalar as float32: a finite double beyond its range becomes +-inf
 * (as numpy's float32() does), said here rather than left to an out-of-range conversion. */
static float scalar_as_float(double value) {
    if (value > FLT_MAX)
        return INFINITY;
    if (value < -FLT_MAX)
        return -INFINITY;
    return (float)value;
}

static void format_jsonl(fl_buf *b, const fl_event *e) {
    static const char wall[] = "{\"wall_time\": ", step[] = ", \"step\": ", name[] = ", \"name\": ",
                      value[] = ", \"value\": ", kind[] = ", \"kind\": \"", source[] = "\", \"source\": ";
    fl_buf_append(b, wall, sizeof wall - 1);
    fl_buf_seconds(b, e->wall_time);
    fl_buf_append(b, step, sizeof step - 1);
    fl_buf_int(b, e->step);
    fl_buf_append(b, name, sizeof name - 1);
    json_string(b, e->name);
    fl_buf_append(b, value, sizeof value - 1);
    json_number(b, e->value);
    fl_buf_append(b, kind, sizeof kind - 1);
    fl_buf_append(b, kind_name(e->kind), strlen(kind_name(e->kind)));
    fl_buf_append(b, source, sizeof source - 1);
    fl_buf_int(b, e->source);
    fl_buf_append(b, "}\n", 2);
}

/* ---- opening ---- */

/* Ends an open: on failure frees the sink and clears *out (the detail message stays). */
static int finish_open(fl_sink **out, int rc) {
    if (rc != FL_OK) {
        fl_sink_free(*out);
        *out = NULL;
    }
    return rc;
}

int fl_sink_open_csv(const char *path, fl_sink **out) {
    fl_sink *sink = *out = new_sink(SINK_CSV);
    if (sink == NULL)
        return FL_ENOMEM;
    int rc = open_file(sink, path, O_CREAT | O_APPEND);
    struct stat st;
    if (rc == FL_OK && fstat(sink->fd, &st) == 0 && st.st_size == 0)
        fl_buf_printf(&sink->pending, "wall_time,step,name,value,kind,source\n");
    return finish_open(out, rc == FL_OK ? fl_sink_flush(sink) : rc);
}

int fl_sink_open_jsonl(const char *path, fl_sink **out) {
    fl_sink *sink = *out = new_sink(SINK_JSONL);
    if (sink == NULL)
        return FL_ENOMEM;
    return finish_open(out, open_file(sink, path, O_CREAT | O_APPEND));
}

int fl_sink_open_tensorboard(const char *logdir, fl_sink **out) {
    static int counter; /* distinguishes files opened in the same second by one process */
    fl_sink *sink = *out = new_sink(SINK_TENSORBOARD);
    if (sink == NULL)
        return FL_ENOMEM;
    int rc = fl_file_make_dirs(logdir);
    if (rc != FL_OK)
        return finish_open(out, rc);
    char host[256] = "localhost", path[PATH_MAX];
    gethostname(host, sizeof host - 1);
    int n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    if (snprintf(path, sizeof path, "%s/events.out.tfevents.%010lld.%s.%d.%d", logdir,
                 (long long)time(NULL), host, (int)getpid(), n) >= (int)sizeof path)
        return finish_open(out, fl_error_set(FL_EINVAL, "log directory path too long: %s", logdir));
    rc = open_file(sink, path, O_CREAT | O_EXCL);
    if (rc == FL_OK) {
        fl_tfevents_append_file_version(&sink->pending, fl_wall_time());
        rc = fl_sink_flush(sink);
    }
    return finish_open(out, rc);
}

int fl_sink_open_queue(fl_queue *queue, fl_sink **out) {
    fl_sink *sink = *out = new_sink(SINK_QUEUE);
    if (sink == NULL)
        return FL_ENOMEM;
    sink->queue = fl_queue_retain(queue); /* the Python Queue may go before the writer does */
    return FL_OK;
}

/* ---- writing ---- */

static void forward(fl_sink *sink, const fl_event *e) {
    fl_item item = {.tag = FL_ITEM_EVENT, .as.event = *e};
    if (fl_queue_put(sink->queue, &item, 0) != FL_OK)
        sink->dropped++; /* a slow callback must never hold up the writer */
}

int fl_sink_write(fl_sink *sink, const fl_event *events, size_t n) {
    if (sink->error != 0 || (sink->kind != SINK_QUEUE && sink->fd < 0)) {
        sink->dropped += n;
        return sink->error;
    }
    for (size_t i = 0; i < n; i++) {
        const fl_event *e = &events[i];
        switch (sink->kind) {
        case SINK_CSV:
            format_csv(&sink->pending, e);
            break;
        case SINK_JSONL:
            format_jsonl(&sink->pending, e);
            break;
        case SINK_TENSORBOARD:
            if (e->kind == FL_EVENT_SCALAR)
                fl_tfevents_append_scalar(&sink->pending, e->wall_time, e->step, e->name,
                                          scalar_as_float(e->value));
            break;
        case SINK_QUEUE:
            forward(sink, e);
            break;
        }
    }
    if (sink->pending.failed)
        return record_error(sink, FL_ENOMEM);
    return sink->pending.len >= FLUSH_AT_BYTES ? fl_sink_flush(sink) : FL_OK;
}

int fl_sink_write_summary(fl_sink *sink, const fl_summary *summary) {
    if (sink->error != 0 || sink->kind != SINK_TENSORBOARD || sink->fd < 0)
        return sink->error;
    int rc = fl_tfevents_append_summary(&sink->pending, summary);
    if (rc != FL_OK)
        return record_error(sink, rc);
    return sink->pending.len >= FLUSH_AT_BYTES ? fl_sink_flush(sink) : FL_OK;
}

int fl_sink_flush(fl_sink *sink) {
    if (sink->error != 0 || sink->fd < 0 || sink->pending.len == 0)
        return sink->error;
    int rc = fl_file_write_all(sink->fd, sink->pending.data, sink->pending.len, sink->path);
    sink->pending.len = 0;
    return rc == FL_OK ? FL_OK : record_error(sink, rc);
}

int fl_sink_close(fl_sink *sink) {
    if (sink->queue != NULL)
        fl_queue_close(sink->queue); /* the reader's stream ends once it has drained it */
    if (sink->fd >= 0) {
        fl_sink_flush(sink);
        if (close(sink->fd) != 0 && sink->error == 0)
            record_error(sink, fl_error_sys("cannot close %s", sink->path));
        sink->fd = -1;
    }
    return sink->error;
}

void fl_sink_free(fl_sink *sink) {
    if (sink == NULL)
        return;
    fl_sink_close(sink);
    fl_buf_free(&sink->pending);
    fl_queue_free(sink->queue);
    free(sink);
}

int fl_sink_error(const fl_sink *sink, const char **message) {
    *message = sink->error_text;
    return sink->error;
}

uint64_t fl_sink_dropped(const fl_sink *sink) { return sink->dropped; }

const char *fl_sink_path(const fl_sink *sink) { return sink->path; }
