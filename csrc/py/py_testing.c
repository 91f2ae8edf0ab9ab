/* py_testing.c - private hooks for the tests and benchmarks: C threads putting event
 * records on a fastloop.Queue, and the C-only producers x consumers queue run. */
#include "fl_module.h"

#include "base/fl_error.h"
#include "testing/fl_queue_load.h"
#include "py_queue.h"

static int attempt_emitter_wait(void *ctx, double timeout_s) {
    return fl_event_emitter_wait(ctx, timeout_s);
}

static PyObject *emit_events(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"queue", "count", "producers", "name", NULL};
    PyObject *queue_obj;
    unsigned long long count;
    int producers = 1;
    const char *name = "event";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OK|is:_emit_events", keywords, &queue_obj,
                                     &count, &producers, &name))
        return NULL;
    fl_module_state *state = fl_state_from_module(module);
    fl_queue *queue = fl_queue_from_python(queue_obj, state);
    if (queue == NULL)
        return NULL;
    fl_event_emitter *emitter;
    int rc = fl_event_emitter_start(queue, producers, count, name, &emitter);
    if (rc != FL_OK)
        return fl_raise(state, rc, "_emit_events");
    rc = fl_wait_interruptibly(attempt_emitter_wait, emitter, -1);
    uint64_t emitted;
    Py_BEGIN_ALLOW_THREADS
        emitted = fl_event_emitter_free(emitter); /* joins: at most one put slice */
    Py_END_ALLOW_THREADS
    if (rc == FL_EINTR)
        return NULL;
    return PyLong_FromUnsignedLongLong(emitted);
}

static PyObject *queue_load(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"producers", "consumers",   "items_per_producer",
                               "maxsize",   "close_early", NULL};
    int producers, consumers, close_early = 0;
    unsigned long long items;
    Py_ssize_t maxsize = 1024;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiK|np:_queue_load", keywords, &producers,
                                     &consumers, &items, &maxsize, &close_early))
        return NULL;
    fl_queue_load_result result;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_queue_load_run(producers, consumers, items, maxsize > 0 ? (size_t)maxsize : 0,
                               close_early, &result);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK)
        return fl_raise(fl_state_from_module(module), rc, "_queue_load");
    return Py_BuildValue("{s:d,s:K,s:K,s:K,s:K}", "seconds", result.seconds, "received",
                         (unsigned long long)result.received, "duplicates",
                         (unsigned long long)result.duplicates, "missing",
                         (unsigned long long)result.missing, "reordered",
                         (unsigned long long)result.reordered);
}

static PyObject *pool_workers(PyObject *module, PyObject *unused) {
    (void)unused;
    fl_module_state *state = fl_state_from_module(module);
    pthread_mutex_lock(&state->pool_lock);
    int workers = state->pool != NULL ? fl_pool_workers(state->pool) : 0;
    pthread_mutex_unlock(&state->pool_lock);
    return PyLong_FromLong(workers);
}

static PyMethodDef testing_functions[] = {
    {"_emit_events", (PyCFunction)(void (*)(void))emit_events, METH_VARARGS | METH_KEYWORDS,
     "_emit_events(queue, count, producers=1, name='event')\n--\n\n"
     "Start `producers` C threads that each put `count` scalar event records on queue\n"
     "without the GIL; return the number put once all finished (fewer if it was closed)."},
    {"_queue_load", (PyCFunction)(void (*)(void))queue_load, METH_VARARGS | METH_KEYWORDS,
     "_queue_load(producers, consumers, items_per_producer, maxsize=1024, close_early=False)\n"
     "--\n\n"
     "Run C producer and consumer threads through a fresh C queue with the GIL released;\n"
     "return a dict with seconds, received, duplicates, missing and reordered."},
    {"_pool_workers", pool_workers, METH_NOARGS,
     "_pool_workers()\n--\n\nThe number of worker threads the ops pool has started."},
    {NULL, NULL, 0, NULL},
};

int fl_testing_module_init(PyObject *module) {
    if (PyModule_AddFunctions(module, testing_functions) < 0)
        return -1;
    return fl_gpu_math_testing_init(module);
}
