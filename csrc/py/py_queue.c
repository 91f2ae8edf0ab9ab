/* py_queue.c - fastloop.Queue (a C MPMC queue for Python objects and C event records) and
 * fastloop.Event (how an event record put by a C thread looks from Python). */
#include "fl_module.h"

#include <structmember.h>

#include "base/fl_error.h"
#include "base/fl_event.h"
#include "base/fl_queue.h"
#include "py_queue.h"

typedef struct {
    PyObject_HEAD fl_queue *queue; /* of fl_item; pointer items hold a strong reference */
    PyObject *weakrefs;
} QueueObject;

/* ---- Event ---- */

static PyStructSequence_Field event_fields[] = {
    {"name", "what was measured or happened (str)"},
    {"value", "the measured value (float; 0.0 for markers)"},
    {"step", "training step or counter (int)"},
    {"wall_time", "seconds since the Unix epoch when it was recorded (float)"},
    {"kind", "'scalar' or 'marker'"},
    {"source", "producer id: worker or GPU index, -1 for none (int)"},
    {NULL, NULL},
};

static PyStructSequence_Desc event_desc = {
    "fastloop.Event",
    "Event(name, value, step, wall_time, kind, source)\n\n"
    "A fixed-size record put on a fastloop.Queue by a C thread (a monitor, a loader worker)\n"
    "without the GIL. Python receives it as this read-only named tuple.",
    event_fields,
    6,
};

static const char *event_kind_name(int32_t kind) {
    switch (kind) {
    case FL_EVENT_SCALAR:
        return "scalar";
    case FL_EVENT_MARKER:
        return "marker";
    default:
        return "unknown";
    }
}

/* Builds a fastloop.Event from a record; NULL on error. */
static PyObject *event_to_python(fl_module_state *state, const fl_event *event) {
    PyObject *result = PyStructSequence_New(state->event_type);
    if (result == NULL)
        return NULL;
    PyObject *items[6] = {
        PyUnicode_DecodeUTF8(event->name, strnlen(event->name, FL_EVENT_NAME_MAX), "replace"),
        PyFloat_FromDouble(event->value),
        PyLong_FromLongLong(event->step),
        PyFloat_FromDouble(event->wall_time),
        PyUnicode_FromString(event_kind_name(event->kind)),
        PyLong_FromLong(event->source),
    };
    int failed = 0;
    for (int i = 0; i < 6; i++) {
        failed |= items[i] == NULL;
        PyStructSequence_SetItem(result, i, items[i]); /* steals, NULL allowed before DECREF */
    }
    if (failed) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

/* Converts a taken item to Python, consuming the reference a pointer item holds. */
static PyObject *item_to_python(fl_module_state *state, fl_item *item) {
    if (item->tag == FL_ITEM_POINTER)
        return (PyObject *)item->as.pointer;
    return event_to_python(state, &item->as.event);
}

static void release_item(void *ctx, void *raw) {
    (void)ctx;
    fl_item *item = raw;
    if (item->tag == FL_ITEM_POINTER)
        Py_DECREF((PyObject *)item->as.pointer);
}

/* ---- blocking calls ---- */

typedef struct {
    fl_queue *queue;
    fl_item item;
} item_call;

static int attempt_put(void *ctx, double timeout_s) {
    item_call *call = ctx;
    return fl_queue_put(call->queue, &call->item, timeout_s);
}

static int attempt_get(void *ctx, double timeout_s) {
    item_call *call = ctx;
    return fl_queue_get(call->queue, &call->item, timeout_s);
}

static int attempt_join(void *ctx, double timeout_s) {
    return fl_queue_join(((item_call *)ctx)->queue, timeout_s);
}

static fl_module_state *queue_state(QueueObject *self) { return fl_state_from_type(Py_TYPE(self)); }

/* ---- methods ---- */

static PyObject *do_put(QueueObject *self, PyObject *item, int block, PyObject *timeout_obj) {
    double timeout;
    if (fl_parse_timeout(timeout_obj, block, &timeout) < 0)
        return NULL;
    item_call call = {self->queue, {.tag = FL_ITEM_POINTER, .as.pointer = Py_NewRef(item)}};
    int rc = fl_wait_interruptibly(attempt_put, &call, timeout);
    if (rc == FL_OK)
        Py_RETURN_NONE;
    Py_DECREF(item);
    fl_module_state *state = queue_state(self);
    if (rc == FL_EINTR)
        return NULL;
    if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
        fl_raisef(&state->exc, FL_EXC_FULL,
                  "%s", timeout > 0 ? "queue still full after the timeout" : "queue is full");
        return NULL;
    }
    if (rc == FL_ECLOSED) {
        fl_raisef(&state->exc, FL_EXC_CLOSED, "put() on a closed queue");
        return NULL;
    }
    return fl_raise(state, rc, "put");
}

static PyObject *do_get(QueueObject *self, int block, PyObject *timeout_obj) {
    double timeout;
    if (fl_parse_timeout(timeout_obj, block, &timeout) < 0)
        return NULL;
    item_call call = {self->queue, {0}};
    int rc = fl_wait_interruptibly(attempt_get, &call, timeout);
    fl_module_state *state = queue_state(self);
    if (rc == FL_OK)
        return item_to_python(state, &call.item);
    if (rc == FL_EINTR)
        return NULL;
    if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
        fl_raisef(&state->exc, FL_EXC_EMPTY,
                  "%s", timeout > 0 ? "queue still empty after the timeout" : "queue is empty");
        return NULL;
    }
    if (rc == FL_ECLOSED) {
        fl_raisef(&state->exc, FL_EXC_CLOSED, "get() on a closed, empty queue");
        return NULL;
    }
    return fl_raise(state, rc, "get");
}

static PyObject *queue_put(QueueObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    static fl_arg_cache put_args = FL_ARG_CACHE("put");
    PyObject *item, *timeout = Py_None;
    int block = 1;
    if (fl_parse_args(&put_args, args, nargs, kwnames, FL_ARG("item", OBJECT, &item),
                      FL_ARG("|block", BOOL, &block), FL_ARG("timeout", OBJECT, &timeout)) < 0)
        return NULL;
    return do_put(self, item, block, timeout);
}

static PyObject *queue_put_nowait(QueueObject *self, PyObject *item) {
    return do_put(self, item, 0, NULL);
}

static PyObject *queue_get(QueueObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    static fl_arg_cache get_args = FL_ARG_CACHE("get");
    PyObject *timeout = Py_None;
    int block = 1;
    if (fl_parse_args(&get_args, args, nargs, kwnames, FL_ARG("|block", BOOL, &block),
                      FL_ARG("timeout", OBJECT, &timeout)) < 0)
        return NULL;
    return do_get(self, block, timeout);
}

static PyObject *queue_get_nowait(QueueObject *self, PyObject *unused) {
    (void)unused;
    return do_get(self, 0, NULL);
}

/* get_many waits like get() for the first item, then takes up to max_items - 1 more. */
typedef struct {
    fl_queue *queue;
    fl_item *items;
    size_t max_items;
    size_t taken;
} many_call;

static int attempt_get_many(void *ctx, double timeout_s) {
    many_call *call = ctx;
    return fl_queue_get_many(call->queue, call->items, call->max_items, timeout_s, &call->taken);
}

static PyObject *queue_get_many(QueueObject *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache get_many_args = FL_ARG_CACHE("get_many");
    Py_ssize_t max_items;
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args_dict(&get_many_args, args, kwargs, FL_ARG("max_items", SSIZE, &max_items),
                           FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0)
        return NULL;
    if (max_items < 1 || max_items > 1 << 20) {
        fl_raisef(NULL, FL_EXC_VALUE, "'max_items' must be in 1..%d, not %zd", 1 << 20, max_items);
        return NULL;
    }
    if (fl_parse_timeout(timeout_obj, 1, &timeout) < 0)
        return NULL;
    many_call call = {self->queue, PyMem_Malloc((size_t)max_items * sizeof(fl_item)),
                      (size_t)max_items, 0};
    if (call.items == NULL)
        return PyErr_NoMemory();
    int rc = fl_wait_interruptibly(attempt_get_many, &call, timeout);
    fl_module_state *state = queue_state(self);
    PyObject *result = NULL;
    if (rc == FL_OK) {
        result = PyList_New((Py_ssize_t)call.taken);
        for (size_t i = 0; i < call.taken; i++) {
            PyObject *value = result != NULL ? item_to_python(state, &call.items[i]) : NULL;
            if (value == NULL) { /* keep consuming so no reference leaks */
                release_item(NULL, &call.items[i]);
                Py_CLEAR(result);
                continue;
            }
            PyList_SET_ITEM(result, (Py_ssize_t)i, value);
        }
    } else if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
        result = PyList_New(0); /* nothing arrived in time: an empty batch, not an error */
    } else if (rc == FL_ECLOSED) {
        fl_raisef(&state->exc, FL_EXC_CLOSED, "get_many() on a closed, empty queue");
    } else if (rc != FL_EINTR) {
        fl_raise(state, rc, "get_many");
    }
    PyMem_Free(call.items);
    return result;
}

static PyObject *queue_qsize(QueueObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromSize_t(fl_queue_size(self->queue));
}

static PyObject *queue_empty(QueueObject *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(fl_queue_size(self->queue) == 0);
}

static PyObject *queue_full(QueueObject *self, PyObject *unused) {
    (void)unused;
    size_t maxsize = fl_queue_maxsize(self->queue);
    return PyBool_FromLong(maxsize != 0 && fl_queue_size(self->queue) >= maxsize);
}

static PyObject *queue_task_done(QueueObject *self, PyObject *unused) {
    (void)unused;
    if (fl_queue_task_done(self->queue) != FL_OK) {
        fl_raisef(NULL, FL_EXC_VALUE, "task_done() called too many times");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *queue_join(QueueObject *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache join_args = FL_ARG_CACHE("join");
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args_dict(&join_args, args, kwargs,
                           FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0)
        return NULL;
    item_call call = {self->queue, {0}};
    int rc = fl_wait_interruptibly(attempt_join, &call, timeout);
    if (rc == FL_EINTR)
        return NULL;
    return PyBool_FromLong(rc == FL_OK);
}

static PyObject *queue_close(QueueObject *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache close_args = FL_ARG_CACHE("close");
    int immediate = 0;
    if (fl_parse_args_dict(&close_args, args, kwargs,
                           FL_ARG("|immediate", BOOL, &immediate)) < 0)
        return NULL;
    fl_queue_close(self->queue);
    if (immediate)
        fl_queue_drain(self->queue, release_item, NULL);
    Py_RETURN_NONE;
}

static PyObject *queue_enter(QueueObject *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *queue_exit(QueueObject *self, PyObject *args) {
    (void)args;
    fl_queue_close(self->queue);
    Py_RETURN_NONE;
}

/* Iterating gets items until the queue is closed and empty. */
static PyObject *queue_iternext(QueueObject *self) {
    PyObject *item = do_get(self, 1, NULL);
    if (item == NULL && PyErr_ExceptionMatches(queue_state(self)->exc.cls[FL_EXC_CLOSED]))
        PyErr_Clear(); /* NULL without an exception ends the iteration */
    return item;
}

static PyObject *queue_repr(QueueObject *self) {
    size_t maxsize = fl_queue_maxsize(self->queue);
    return PyUnicode_FromFormat("<fastloop.Queue maxsize=%zu qsize=%zu%s>", maxsize,
                                fl_queue_size(self->queue),
                                fl_queue_is_closed(self->queue) ? " closed" : "");
}

static PyObject *queue_get_maxsize(QueueObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(fl_queue_maxsize(self->queue));
}

static PyObject *queue_get_closed(QueueObject *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(fl_queue_is_closed(self->queue));
}

/* ---- lifetime ---- */

static PyObject *queue_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache queue_args = FL_ARG_CACHE("Queue");
    Py_ssize_t maxsize = 0;
    if (fl_parse_args_dict(&queue_args, args, kwargs, FL_ARG("|maxsize", SSIZE, &maxsize)) < 0)
        return NULL;
    QueueObject *self = (QueueObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    /* maxsize <= 0 means unbounded, as in queue.Queue */
    if (fl_queue_new(maxsize > 0 ? (size_t)maxsize : 0, sizeof(fl_item), &self->queue) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static int visit_item(void *ctx, const void *raw) {
    const fl_item *item = raw;
    if (item->tag != FL_ITEM_POINTER)
        return 0;
    void **visit_args = ctx;
    visitproc visit = (visitproc)visit_args[0];
    return visit((PyObject *)item->as.pointer, visit_args[1]);
}

static int queue_traverse(QueueObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    if (self->queue == NULL)
        return 0;
    void *visit_args[2] = {(void *)visit, arg};
    return fl_queue_foreach(self->queue, visit_item, visit_args);
}

static int queue_clear(QueueObject *self) {
    if (self->queue != NULL)
        fl_queue_drain(self->queue, release_item, NULL);
    return 0;
}

static void queue_dealloc(QueueObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    queue_clear(self);
    fl_queue_free(self->queue);
    type->tp_free(self);
    Py_DECREF(type);
}

fl_queue *fl_queue_from_python(PyObject *obj, fl_module_state *state) {
    if (!PyObject_TypeCheck(obj, state->queue_type)) {
        fl_raisef(NULL, FL_EXC_TYPE, "expected a fastloop.Queue, not %.200s",
                  Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((QueueObject *)obj)->queue;
}

/* ---- type ---- */

static PyMethodDef queue_methods[] = {
    {"put", (PyCFunction)(void (*)(void))queue_put, METH_FASTCALL | METH_KEYWORDS,
     "put($self, /, item, block=True, timeout=None)\n--\n\n"
     "Put item on the queue, waiting while it is full (for at most timeout seconds).\n"
     "Raises fastloop.QueueFull when no slot frees in time (at once if block is false),\n"
     "fastloop.Closed after close(). Waits with the GIL released; Ctrl-C interrupts."},
    {"put_nowait", (PyCFunction)queue_put_nowait, METH_O,
     "put_nowait($self, item, /)\n--\n\nput(item, block=False)."},
    {"get", (PyCFunction)(void (*)(void))queue_get, METH_FASTCALL | METH_KEYWORDS,
     "get($self, /, block=True, timeout=None)\n--\n\n"
     "Remove and return the oldest item, waiting while the queue is empty (for at most\n"
     "timeout seconds). Raises fastloop.Empty when nothing arrives in time (at once if\n"
     "block is false), fastloop.Closed once the queue is closed and empty. Records put by\n"
     "C threads come back as fastloop.Event. Waits with the GIL released."},
    {"get_nowait", (PyCFunction)queue_get_nowait, METH_NOARGS,
     "get_nowait($self, /)\n--\n\nget(block=False)."},
    {"get_many", (PyCFunction)(void (*)(void))queue_get_many, METH_VARARGS | METH_KEYWORDS,
     "get_many($self, /, max_items, timeout=None)\n--\n\n"
     "Wait like get() for one item, then also take whatever else is queued, up to\n"
     "max_items in all, in one lock round trip. Returns a list, empty when the timeout\n"
     "passed first. Raises fastloop.Closed once the queue is closed and empty."},
    {"qsize", (PyCFunction)queue_qsize, METH_NOARGS,
     "qsize($self, /)\n--\n\nThe number of items queued now (a snapshot)."},
    {"empty", (PyCFunction)queue_empty, METH_NOARGS,
     "empty($self, /)\n--\n\nTrue when no item is queued now (a snapshot)."},
    {"full", (PyCFunction)queue_full, METH_NOARGS,
     "full($self, /)\n--\n\nTrue when maxsize items are queued now (a snapshot)."},
    {"task_done", (PyCFunction)queue_task_done, METH_NOARGS,
     "task_done($self, /)\n--\n\n"
     "Mark one item taken with get() as processed, for join(). Raises ValueError when\n"
     "called more times than items were put."},
    {"join", (PyCFunction)(void (*)(void))queue_join, METH_VARARGS | METH_KEYWORDS,
     "join($self, /, timeout=None)\n--\n\n"
     "Wait until every item put has been marked done with task_done(). Returns True, or\n"
     "False when timeout seconds passed first."},
    {"close", (PyCFunction)(void (*)(void))queue_close, METH_VARARGS | METH_KEYWORDS,
     "close($self, /, immediate=False)\n--\n\n"
     "Close the queue and wake every waiting put() and get(). Later put() calls raise\n"
     "fastloop.Closed; get() still returns the queued items, then raises fastloop.Closed.\n"
     "With immediate=True the queued items are discarded (and count as done for join())."},
    {"__enter__", (PyCFunction)queue_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)queue_exit, METH_VARARGS, NULL},
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS,
     "See PEP 585: Queue[int] for type hints."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef queue_getset[] = {
    {"maxsize", (getter)queue_get_maxsize, NULL, "The bound given at construction (0: none).",
     NULL},
    {"closed", (getter)queue_get_closed, NULL, "True once close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef queue_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(QueueObject, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(queue_doc,
             "Queue(maxsize=0)\n--\n\n"
             "A thread-safe FIFO queue implemented in C, with the semantics of queue.Queue\n"
             "(put/get with block and timeout, qsize, task_done/join) plus close().\n"
             "maxsize <= 0 means no bound. Blocking calls release the GIL and stop on\n"
             "Ctrl-C within 50 ms. C threads inside fastloop (monitors, loaders) put\n"
             "fixed-size records on it without the GIL; get() returns them as\n"
             "fastloop.Event. Iterating yields items until the queue is closed and empty.\n\n"
             "    q = fastloop.Queue(maxsize=1024)\n"
             "    q.put(item); item = q.get(timeout=1.0)");

static PyType_Slot queue_slots[] = {
    {Py_tp_doc, (void *)queue_doc},  {Py_tp_new, queue_new},
    {Py_tp_dealloc, queue_dealloc},  {Py_tp_traverse, queue_traverse},
    {Py_tp_clear, queue_clear},      {Py_tp_repr, queue_repr},
    {Py_tp_iter, PyObject_SelfIter}, {Py_tp_iternext, queue_iternext},
    {Py_tp_methods, queue_methods},  {Py_tp_getset, queue_getset},
    {Py_tp_members, queue_members},  {0, NULL},
};

static PyType_Spec queue_spec = {
    .name = "fastloop.Queue",
    .basicsize = sizeof(QueueObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = queue_slots,
};

int fl_queue_module_init(PyObject *module, fl_module_state *state) {
    state->queue_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &queue_spec, NULL);
    if (state->queue_type == NULL || PyModule_AddType(module, state->queue_type) < 0)
        return -1;
    state->event_type = PyStructSequence_NewType(&event_desc);
    if (state->event_type == NULL || PyModule_AddType(module, state->event_type) < 0)
        return -1;
    return 0;
}
