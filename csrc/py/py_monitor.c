/* py_monitor.c - fastloop._core._Monitor, the C half of fastloop.Monitor: argument checks
 * around fl_monitor. scalar() is the hot path: positional fast-call parsing, a lock-free
 * check for pending sink errors, and one non-blocking put with the GIL held. */
#include "fl_module.h"

#include "base/fl_error.h"
#include "base/fl_size.h"
#include "monitor/fl_monitor.h"
#include "py_metrics.h"
#include "py_queue.h"

typedef struct {
    PyObject_HEAD
    fl_monitor *monitor;
    double record_wait_s; /* how long scalar()/event() may wait for room */
    PyObject *keep_alive; /* the sink specs given (the C side holds its own references) */
} MonitorObject;

static fl_module_state *monitor_state(PyObject *self) { return fl_state_from_type(Py_TYPE(self)); }

/* Raises the oldest unreported sink error as fastloop.SinkError; returns -1 when it did. */
static int raise_pending_error(PyObject *self) {
    fl_monitor *m = ((MonitorObject *)self)->monitor;
    char message[FL_MONITOR_ERROR_MAX];
    if (!fl_monitor_has_error(m) || !fl_monitor_take_error(m, message, sizeof message))
        return 0;
    fl_raisef(&monitor_state(self)->exc, FL_EXC_SINK, "%s", message);
    return -1;
}

typedef struct {
    fl_monitor *monitor;
    fl_event event;
} put_call;

static int attempt_put(void *ctx, double timeout_s) {
    put_call *call = ctx;
    return fl_monitor_put(call->monitor, &call->event, timeout_s);
}

/* *step from an int >= 0, or -1 for None/absent; -1 with TypeError/ValueError naming 'step'. */
static int parse_step(PyObject *step_obj, int64_t *step) {
    *step = -1;
    if (step_obj == NULL || step_obj == Py_None)
        return 0;
    if (!PyIndex_Check(step_obj) || PyBool_Check(step_obj)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'step' must be an int or None, not %.100s",
                  Py_TYPE(step_obj)->tp_name);
        return -1;
    }
    *step = PyLong_AsLongLong(step_obj);
    if (*step == -1 && PyErr_Occurred())
        return -1;
    if (*step < 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'step' must be >= 0, not %lld", (long long)*step);
        return -1;
    }
    return 0;
}

/* Queues a record: at once if there is room, else waiting up to record_wait_s with the GIL
 * released; a record that still does not fit is counted as dropped (never an error). */
static PyObject *record(PyObject *self, fl_event_kind kind, PyObject *name_obj, double value,
                        PyObject *step_obj) {
    MonitorObject *mon = (MonitorObject *)self;
    if (!PyUnicode_Check(name_obj)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'name' must be str, not %.100s", Py_TYPE(name_obj)->tp_name);
        return NULL;
    }
    Py_ssize_t len;
    const char *name = PyUnicode_AsUTF8AndSize(name_obj, &len);
    if (name == NULL)
        return NULL;
    if (len == 0 || len >= FL_EVENT_NAME_MAX) {
        fl_raisef(NULL, FL_EXC_VALUE, "'name' must be 1 to %d bytes of UTF-8, not %zd: %R",
                  FL_EVENT_NAME_MAX - 1, len, name_obj);
        return NULL;
    }
    int64_t step;
    if (parse_step(step_obj, &step) < 0)
        return NULL;
    put_call call = {.monitor = mon->monitor};
    fl_event_init(&call.event, kind, NULL, value, step, -1); /* step -1: the latest seen */
    memcpy(call.event.name, name, (size_t)len);
    int rc = fl_wait_interruptibly(attempt_put, &call, mon->record_wait_s);
    if (rc == FL_EINTR)
        return NULL;
    if (rc == FL_ECLOSED) {
        fl_raisef(&monitor_state(self)->exc, FL_EXC_CLOSED, "the monitor is closed");
        return NULL;
    }
    if (rc != FL_OK)
        fl_monitor_count_dropped(mon->monitor);
    /* an earlier record's sink error, reported after this record is queued: it is not lost */
    if (raise_pending_error(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *monitor_scalar(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    static fl_arg_cache scalar_args = FL_ARG_CACHE("scalar");
    PyObject *name_obj, *step_obj = NULL;
    double value;
    if (fl_parse_args(&scalar_args, args, nargs, kwnames, FL_ARG("name", OBJECT, &name_obj),
                      FL_ARG("value", DOUBLE, &value), FL_ARG("|step", OBJECT, &step_obj)) < 0)
        return NULL;
    return record(self, FL_EVENT_SCALAR, name_obj, value, step_obj);
}

static PyObject *monitor_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
    static fl_arg_cache event_args = FL_ARG_CACHE("event");
    PyObject *name_obj, *step_obj = NULL;
    double value = 0.0;
    if (fl_parse_args(&event_args, args, nargs, kwnames, FL_ARG("name", OBJECT, &name_obj),
                      FL_ARG("|value", DOUBLE, &value), FL_ARG("step", OBJECT, &step_obj)) < 0)
        return NULL;
    return record(self, FL_EVENT_MARKER, name_obj, value, step_obj);
}

/* sample(name, value): a sampled scalar from an attached stats() source (fastloop.Monitor
 * reads it on its sampling thread); never waits, never raises a sink error (the owner's next
 * call does), a full queue drops it. */
static PyObject *monitor_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static fl_arg_cache sample_args = FL_ARG_CACHE("sample");
    PyObject *name_obj;
    double value;
    if (fl_parse_args(&sample_args, args, nargs, NULL, FL_ARG("name", STR_OBJECT, &name_obj),
                      FL_ARG("value", DOUBLE, &value)) < 0)
        return NULL;
    const char *name = PyUnicode_AsUTF8(name_obj);
    if (name == NULL)
        return NULL;
    fl_monitor_put_sample(((MonitorObject *)self)->monitor, name, value);
    Py_RETURN_NONE;
}

typedef struct {
    fl_monitor *monitor;
    fl_summary *summary;
} summary_call;

static int attempt_put_summary(void *ctx, double timeout_s) {
    summary_call *call = ctx;
    return fl_monitor_put_summary(call->monitor, call->summary, timeout_s);
}

/* summary(kind, name, data, step, bins, height, width, channels): data is a C-contiguous
 * buffer already in the kind's layout (fastloop.Monitor converts and checks it). */
static PyObject *monitor_summary(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
    static fl_arg_cache summary_args = FL_ARG_CACHE("summary");
    MonitorObject *mon = (MonitorObject *)self;
    int kind, bins, height, width, channels;
    PyObject *name_obj, *data_obj, *step_obj;
    Py_buffer data;
    if (fl_parse_args(&summary_args, args, nargs, kwnames, FL_ARG("kind", INT, &kind),
                      FL_ARG("name", STR_OBJECT, &name_obj), FL_ARG("data", OBJECT, &data_obj),
                      FL_ARG("step", OBJECT, &step_obj), FL_ARG("bins", INT, &bins),
                      FL_ARG("height", INT, &height), FL_ARG("width", INT, &width),
                      FL_ARG("channels", INT, &channels)) < 0 ||
        PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) /* C-contiguous bytes */
        return NULL;
    fl_summary *summary = NULL;
    int64_t step;
    Py_ssize_t name_len;
    const char *name = PyUnicode_AsUTF8AndSize(name_obj, &name_len);
    if (name == NULL || parse_step(step_obj, &step) < 0 || raise_pending_error(self) < 0)
        goto fail;
    if (name_len == 0 || name_len >= FL_SUMMARY_TAG_MAX) {
        fl_raisef(NULL, FL_EXC_VALUE, "'name' must be 1 to %d bytes of UTF-8, not %zd",
                  FL_SUMMARY_TAG_MAX - 1, name_len);
        goto fail;
    }
    size_t pixels = 0, image_bytes = 0; /* the dimensions must describe the data: a wrapped product could not */
    int image_ok = height > 0 && width > 0 && channels > 0 &&
                   fl_size_mul((size_t)height, (size_t)width, "summary", &pixels) == FL_OK &&
                   fl_size_mul(pixels, (size_t)channels, "summary", &image_bytes) == FL_OK &&
                   (size_t)data.len == image_bytes;
    fl_error_clear();
    if ((kind == FL_SUMMARY_IMAGE && !image_ok) || (kind == FL_SUMMARY_HISTOGRAM && (bins < 1 || data.len % 8)) ||
        kind < FL_SUMMARY_HISTOGRAM || kind > FL_SUMMARY_TEXT) {
        fl_raisef(NULL, FL_EXC_VALUE, "summary: data does not match its kind and shape");
        goto fail;
    }
    summary = fl_summary_new((fl_summary_kind)kind, (size_t)data.len);
    if (summary == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(summary->tag, name, (size_t)name_len);
    summary->step = step;
    summary->bins = bins;
    summary->height = height;
    summary->width = width;
    summary->channels = channels;
    summary->count = kind == FL_SUMMARY_HISTOGRAM ? (size_t)data.len / 8 : (size_t)data.len;
    Py_BEGIN_ALLOW_THREADS
    memcpy(summary->payload, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    summary_call call = {mon->monitor, summary};
    int rc = fl_wait_interruptibly(attempt_put_summary, &call, mon->record_wait_s);
    if (rc == FL_OK)
        Py_RETURN_NONE; /* the writer owns it now */
    free(summary);
    if (rc == FL_EINTR)
        return NULL;
    if (rc == FL_ECLOSED) {
        fl_raisef(&monitor_state(self)->exc, FL_EXC_CLOSED, "the monitor is closed");
        return NULL;
    }
    fl_monitor_count_dropped(mon->monitor);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&data);
    free(summary);
    return NULL;
}

static int attempt_flushed(void *ctx, double timeout_s) {
    put_call *call = ctx; /* event.step holds the ticket */
    return fl_monitor_flushed(call->monitor, (uint64_t)call->event.step, timeout_s);
}

typedef struct {
    fl_monitor *monitor;
    uint64_t ticket;
} flush_call;

static int attempt_request(void *ctx, double timeout_s) {
    flush_call *call = ctx;
    int err;
    call->ticket = fl_monitor_request_flush(call->monitor, timeout_s, &err);
    return err;
}

static PyObject *monitor_flush(PyObject *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache flush_args = FL_ARG_CACHE("flush");
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args_dict(&flush_args, args, kwargs,
                           FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0)
        return NULL;
    flush_call request = {((MonitorObject *)self)->monitor, 0};
    int rc = fl_wait_interruptibly(attempt_request, &request, timeout);
    if (rc == FL_OK) {
        put_call wait = {.monitor = request.monitor};
        wait.event.step = (int64_t)request.ticket;
        rc = fl_wait_interruptibly(attempt_flushed, &wait, timeout);
    }
    if (rc == FL_EINTR || raise_pending_error(self) < 0)
        return NULL;
    if (rc == FL_ECLOSED)
        Py_RETURN_TRUE; /* closed: everything queued has been written */
    return PyBool_FromLong(rc == FL_OK);
}

static int attempt_wait_closed(void *ctx, double timeout_s) {
    return fl_monitor_wait_closed(ctx, timeout_s);
}

/* close(timeout=None): stops sampling and closes the queue, then waits up to `timeout` (None:
 * no limit) for the writer to write everything and close the sinks. Returns whether it
 * finished; when it did, raises a sink error not reported yet. */
static PyObject *monitor_close(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
    static fl_arg_cache close_args = FL_ARG_CACHE("close");
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args(&close_args, args, nargs, kwnames, FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0)
        return NULL;
    fl_monitor *m = ((MonitorObject *)self)->monitor;
    fl_monitor_close(m, 0); /* never join with the GIL held; wait below, interruptibly */
    int rc = fl_wait_interruptibly(attempt_wait_closed, m, timeout);
    if (rc == FL_EINTR)
        return NULL;
    if (rc != FL_OK)
        Py_RETURN_FALSE; /* still writing in the background */
    if (raise_pending_error(self) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *monitor_wait_closed(PyObject *self, PyObject *args) {
    static fl_arg_cache wait_closed_args = FL_ARG_CACHE("wait_closed"); /* positional only */
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args_dict(&wait_closed_args, args, NULL,
                           FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0)
        return NULL;
    int rc = fl_wait_interruptibly(attempt_wait_closed, ((MonitorObject *)self)->monitor, timeout);
    if (rc == FL_EINTR)
        return NULL;
    return PyBool_FromLong(rc == FL_OK);
}

static PyObject *monitor_take_error(PyObject *self, PyObject *unused) {
    (void)unused;
    char message[FL_MONITOR_ERROR_MAX];
    if (!fl_monitor_take_error(((MonitorObject *)self)->monitor, message, sizeof message))
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(message, strlen(message), "replace");
}

static PyObject *monitor_report_error(PyObject *self, PyObject *message_obj) {
    const char *message = PyUnicode_AsUTF8(message_obj);
    if (message == NULL)
        return NULL;
    fl_monitor_report_error(((MonitorObject *)self)->monitor, message);
    Py_RETURN_NONE;
}

static PyObject *monitor_watch(PyObject *self, PyObject *metrics_obj) {
    MonitorObject *mon = (MonitorObject *)self;
    fl_metrics *metrics = fl_metrics_from_python(metrics_obj, monitor_state(self));
    if (metrics == NULL)
        return NULL;
    int rc = fl_monitor_watch(mon->monitor, metrics);
    if (rc != FL_OK)
        return fl_raise(monitor_state(self), rc, "watch");
    Py_RETURN_NONE;
}

static PyObject *monitor_stats(PyObject *self, PyObject *unused) {
    (void)unused;
    fl_monitor_stats s;
    fl_monitor_stats_get(((MonitorObject *)self)->monitor, &s);
    return Py_BuildValue("{s:K,s:K,s:K,s:K}", "records", (unsigned long long)s.records,
                         "dropped_samples", (unsigned long long)s.dropped_samples,
                         "dropped_records", (unsigned long long)s.dropped_records, "samples",
                         (unsigned long long)s.samples);
}

static PyObject *monitor_get_gpu_source(PyObject *self, void *closure) {
    (void)closure;
    static const char *names[] = {"none", "nvml", "nvidia-smi"};
    return PyUnicode_FromString(names[fl_monitor_gpu_source(((MonitorObject *)self)->monitor)]);
}

static PyObject *monitor_get_gpu_reason(PyObject *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(fl_monitor_gpu_reason(((MonitorObject *)self)->monitor));
}

/* ---- construction ---- */

/* Opens the sink described by a ("csv"|"jsonl"|"tensorboard", path) or ("queue", Queue)
 * tuple; NULL with an exception (SinkError naming the path for an unopenable file). */
static fl_sink *open_sink(fl_module_state *state, PyObject *spec) {
    const char *kind;
    PyObject *target;
    if (!PyArg_ParseTuple(spec, "sO;a sink is a (kind, target) tuple", &kind, &target))
        return NULL;
    fl_sink *sink = NULL;
    int rc;
    if (strcmp(kind, "queue") == 0) {
        fl_queue *queue = fl_queue_from_python(target, state);
        if (queue == NULL)
            return NULL;
        rc = fl_sink_open_queue(queue, &sink);
    } else {
        PyObject *path_bytes = NULL;
        if (!PyUnicode_FSConverter(target, &path_bytes))
            return NULL;
        const char *path = PyBytes_AS_STRING(path_bytes);
        if (strcmp(kind, "csv") == 0)
            rc = fl_sink_open_csv(path, &sink);
        else if (strcmp(kind, "jsonl") == 0)
            rc = fl_sink_open_jsonl(path, &sink);
        else if (strcmp(kind, "tensorboard") == 0)
            rc = fl_sink_open_tensorboard(path, &sink);
        else
            rc = fl_error_set(FL_EINVAL, "unknown sink kind '%s'", kind);
        Py_DECREF(path_bytes);
    }
    if (rc != FL_OK) /* a failed open raises SinkError with the detail, which names the path */
        return (fl_sink *)fl_raise_with(state, rc, &(fl_raise_opts){.what = rc == FL_ESYS ? NULL : "sink",
                                                                    .in = FL_IN_SINK});
    return sink;
}

static PyObject *monitor_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache monitor_args = FL_ARG_CACHE("_Monitor");
    PyObject *sinks_obj;
    double interval_s = 30.0, flush_interval_s = 5.0, record_wait_s = 0.01;
    Py_ssize_t queue_size = 65536;
    long long start_step = 0;
    int host = 1, gpu = 1;
    const char *nvml_library = NULL, *smi_command = NULL;
    if (fl_parse_args_dict(&monitor_args, args, kwargs, FL_ARG("sinks", OBJECT, &sinks_obj),
                           FL_ARG("|interval_s", DOUBLE, &interval_s),
                           FL_ARG("flush_interval_s", DOUBLE, &flush_interval_s),
                           FL_ARG("queue_size", SSIZE, &queue_size), FL_ARG("host", BOOL, &host),
                           FL_ARG("gpu", BOOL, &gpu),
                           FL_ARG("nvml_library", STR_OR_NONE, &nvml_library),
                           FL_ARG("smi_command", STR_OR_NONE, &smi_command),
                           FL_ARG("record_wait_s", DOUBLE, &record_wait_s),
                           FL_ARG("start_step", INT64, &start_step)) < 0)
        return NULL;
    if (queue_size < 1 || record_wait_s < 0 || flush_interval_s <= 0 || start_step < 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "queue_size must be >= 1, record_wait_s >= 0, "
                                          "flush_interval_s > 0 and start_step >= 0");
        return NULL;
    }
    fl_module_state *state = fl_state_from_type(type);
    PyObject *sinks = PySequence_Tuple(sinks_obj);
    if (sinks == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(sinks);
    if (n > FL_MONITOR_MAX_SINKS) {
        Py_DECREF(sinks);
        fl_raisef(NULL, FL_EXC_VALUE, "at most %d sinks", FL_MONITOR_MAX_SINKS);
        return NULL;
    }
    fl_sink *opened[FL_MONITOR_MAX_SINKS];
    Py_ssize_t i = 0;
    for (; i < n; i++)
        if ((opened[i] = open_sink(state, PyTuple_GET_ITEM(sinks, i))) == NULL)
            break;
    if (i < n) { /* free what opened before the failing one */
        while (i-- > 0)
            fl_sink_free(opened[i]);
        Py_DECREF(sinks);
        return NULL;
    }
    fl_gpu *gpus = NULL;
    int rc = FL_OK;
    if (gpu) {
        Py_BEGIN_ALLOW_THREADS /* probing may run nvidia-smi */
        rc = fl_gpu_open(nvml_library, smi_command, &gpus);
        Py_END_ALLOW_THREADS
    }
    MonitorObject *self = rc == FL_OK ? (MonitorObject *)type->tp_alloc(type, 0) : NULL;
    if (self == NULL) {
        for (i = 0; i < n; i++)
            fl_sink_free(opened[i]);
        fl_gpu_close(gpus);
        Py_DECREF(sinks);
        return rc == FL_OK ? NULL : PyErr_NoMemory();
    }
    fl_monitor_config config = {interval_s, flush_interval_s, (size_t)queue_size, host, start_step};
    rc = fl_monitor_new(&config, opened, (size_t)n, gpus, &self->monitor); /* owns them now */
    if (rc != FL_OK) {
        Py_DECREF(self);
        Py_DECREF(sinks);
        return fl_raise(state, rc, "Monitor");
    }
    self->record_wait_s = record_wait_s;
    self->keep_alive = sinks;
    return (PyObject *)self;
}

static int monitor_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((MonitorObject *)self)->keep_alive);
    return 0;
}

static int monitor_clear(PyObject *self) {
    Py_CLEAR(((MonitorObject *)self)->keep_alive);
    return 0;
}

/* A monitor dropped without close() finishes in the background: the C side keeps what it
 * uses alive by its own references, so this never blocks. */
static void monitor_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    MonitorObject *mon = (MonitorObject *)self;
    if (mon->monitor != NULL) {
        fl_monitor_close(mon->monitor, 0);
        fl_monitor_release(mon->monitor);
    }
    monitor_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMethodDef monitor_methods[] = {
    {"scalar", (PyCFunction)(void (*)(void))monitor_scalar, METH_FASTCALL | METH_KEYWORDS,
     "scalar($self, name, value, step=None)\n--\n\nQueue a scalar record."},
    {"event", (PyCFunction)(void (*)(void))monitor_event, METH_FASTCALL | METH_KEYWORDS,
     "event($self, name, value=0.0, step=None)\n--\n\nQueue a marker record."},
    {"sample", (PyCFunction)(void (*)(void))monitor_sample, METH_FASTCALL,
     "sample($self, name, value, /)\n--\n\nQueue a sampled scalar (dropped when the queue is full)."},
    {"summary", (PyCFunction)(void (*)(void))monitor_summary, METH_FASTCALL | METH_KEYWORDS,
     "summary($self, kind, name, data, step, bins, height, width, channels)\n--\n\n"
     "Queue a histogram (1), image (2) or text (3) record; the writer encodes it."},
    {"flush", (PyCFunction)(void (*)(void))monitor_flush, METH_VARARGS | METH_KEYWORDS,
     "flush($self, /, timeout=None)\n--\n\nWait until everything queued is written; False on "
     "timeout."},
    {"close", (PyCFunction)(void (*)(void))monitor_close, METH_FASTCALL | METH_KEYWORDS,
     "close($self, /, timeout=None)\n--\n\nStop; wait up to timeout for the sinks to be written "
     "and closed; False when still writing."},
    {"wait_closed", monitor_wait_closed, METH_VARARGS,
     "wait_closed($self, timeout=None, /)\n--\n\nWait for the writer to finish after close."},
    {"take_error", monitor_take_error, METH_NOARGS,
     "take_error($self, /)\n--\n\nThe oldest unreported sink error, or None."},
    {"report_error", monitor_report_error, METH_O,
     "report_error($self, message, /)\n--\n\nQueue an error to be raised like a sink's."},
    {"watch", monitor_watch, METH_O,
     "watch($self, metrics, /)\n--\n\nSample a fastloop.Metrics every interval."},
    {"stats", monitor_stats, METH_NOARGS,
     "stats($self, /)\n--\n\nRecords written, dropped (sampled/owner) and sampling rounds."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef monitor_getset[] = {
    {"gpu_source", monitor_get_gpu_source, NULL, "'nvml', 'nvidia-smi' or 'none'.", NULL},
    {"gpu_reason", monitor_get_gpu_reason, NULL, "How GPUs are read, or why not.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot monitor_slots[] = {
    {Py_tp_doc, "The C half of fastloop.Monitor (use fastloop.Monitor)."},
    {Py_tp_new, monitor_new},
    {Py_tp_dealloc, monitor_dealloc},
    {Py_tp_traverse, monitor_traverse},
    {Py_tp_clear, monitor_clear},
    {Py_tp_methods, monitor_methods},
    {Py_tp_getset, monitor_getset},
    {0, NULL},
};

static PyType_Spec monitor_spec = {
    .name = "fastloop._core._Monitor",
    .basicsize = sizeof(MonitorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = monitor_slots,
};

int fl_monitor_module_init(PyObject *module, fl_module_state *state) {
    state->monitor_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &monitor_spec, NULL);
    if (state->monitor_type == NULL || PyModule_AddType(module, state->monitor_type) < 0)
        return -1;
    return 0;
}
