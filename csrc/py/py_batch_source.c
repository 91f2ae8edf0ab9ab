/* py_batch_source.c - next/start_epoch/stop and the shared getters of _Loader and
 * _ProcLoader, over the core's fl_batch_source table (see py_batch_source.h).
 *
 * next() hands out each batch through fl_batch_from_slot() (py_batch.c): views into a
 * source-owned slot that give it back when released, or copies when the workers would starve. */
#include "py_batch_source.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "py_batch.h"
#include "py_metrics.h"
#include "py_pipeline.h"

static fl_module_state *source_state(PyObject *self) { return fl_state_from_type(Py_TYPE(self)); }

/* True, with fastloop.Closed set, once the collector cleared `self`. */
static int source_cleared(PyObject *self) {
    if (!((fl_source_object *)self)->cleared)
        return 0;
    fl_raise_with(source_state(self), FL_ECLOSED,
                  &(fl_raise_opts){.what = "Loader", .message = "cleared by the garbage collector"});
    return 1;
}

/* A lease's release, called with the GIL (a batch's last view dropped). */
static void release_slot(void *core, int slot) {
    const fl_batch_source *src = &((fl_source_object *)core)->source;
    if (!src->ops->release_blocks) { /* a mutex and a signal: cheaper than dropping the GIL */
        src->ops->release(src->impl, slot);
        return;
    }
    Py_BEGIN_ALLOW_THREADS /* the slot goes to a busy worker at once: a write that can wait */
    src->ops->release(src->impl, slot);
    Py_END_ALLOW_THREADS
}

/* `batch` (a tuple, stolen) with `extra` (stolen) after its items; NULL if either is. */
static PyObject *appended(PyObject *batch, PyObject *extra) {
    PyObject *out = batch != NULL && extra != NULL ? PyTuple_New(PyTuple_GET_SIZE(batch) + 1) : NULL;
    for (Py_ssize_t i = 0; out != NULL && i < PyTuple_GET_SIZE(batch); i++)
        PyTuple_SET_ITEM(out, i, Py_NewRef(PyTuple_GET_ITEM(batch, i)));
    if (out != NULL)
        PyTuple_SET_ITEM(out, PyTuple_GET_SIZE(batch), extra);
    else
        Py_XDECREF(extra);
    Py_XDECREF(batch);
    return out;
}

/* The batch in `slot` as a tuple of arrays: views under a lease, or copies when lending it
 * would leave the workers no slot to fill; then the mode's batch_extra, if it has one. */
static PyObject *batch_from_slot(fl_source_object *self, int slot, size_t count) {
    const fl_batch_source *src = &self->source;
    PyObject *extra = NULL;
    if (self->type->batch_extra != NULL && (extra = self->type->batch_extra(self, slot)) == NULL) {
        release_slot(self, slot);
        return NULL;
    }
    fl_slot_batch batch = {
        .owner = (PyObject *)self, .core = self, .release = release_slot, .slot = slot,
        .data = src->ops->slot(src->impl, slot), .offsets = self->offsets, .count = count,
        .descrs = self->out_descrs, .shapes = self->out_shapes,
        .copy_out = fl_copy_out(src->ops->lent(src->impl), src->ops->slots(src->impl)),
    };
    if (batch.copy_out)
        atomic_fetch_add_explicit(&self->copied_out, 1, memory_order_relaxed); /* orders nothing */
    PyObject *arrays = fl_batch_from_slot(source_state((PyObject *)self), &batch);
    return extra != NULL ? appended(arrays, extra) : arrays;
}

typedef struct {
    const fl_batch_source *source;
    int slot;
    size_t count;
} next_call;

static int attempt_next(void *ctx, double timeout_s) {
    next_call *call = ctx;
    return call->source->ops->next(call->source->impl, timeout_s, &call->slot, &call->count);
}

static PyObject *source_next(PyObject *self_obj, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    static fl_arg_cache next_args = FL_ARG_CACHE("next");
    fl_source_object *self = (fl_source_object *)self_obj;
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args(&next_args, args, nargs, kwnames,
                      FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0 || source_cleared(self_obj))
        return NULL;
    next_call call = {&self->source, -1, 0};
    int rc = fl_wait_interruptibly(attempt_next, &call, timeout);
    if (rc == FL_OK)
        return batch_from_slot(self, call.slot, call.count);
    if (rc == FL_EEND)
        Py_RETURN_NONE;
    if (rc == FL_EINTR)
        return NULL;
    if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
        char message[96]; /* PyErr_Format has no %g */
        snprintf(message, sizeof message, self->type->timeout_format, timeout);
        return fl_raise_with(source_state(self_obj), FL_ETIMEDOUT, &(fl_raise_opts){.message = message});
    }
    return self->type->raise_error(self, rc);
}

static void stop_without_gil(const fl_batch_source *src) {
    Py_BEGIN_ALLOW_THREADS /* joins or reaps the workers: each ends the batch in hand */
    src->ops->stop(src->impl);
    Py_END_ALLOW_THREADS
}

static PyObject *source_stop(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static fl_arg_cache stop_args = FL_ARG_CACHE("stop");
    int wait = 1;
    if (fl_parse_args(&stop_args, args, nargs, kwnames, FL_ARG("|wait", BOOL, &wait)) < 0)
        return NULL;
    const fl_batch_source *src = &((fl_source_object *)self)->source;
    if (!wait && src->ops->request_stop != NULL)
        src->ops->request_stop(src->impl); /* a mutex and a signal: the next stop joins */
    else
        stop_without_gil(src);
    Py_RETURN_NONE;
}

static PyObject *source_start_epoch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames) {
    static fl_arg_cache start_epoch_args = FL_ARG_CACHE("start_epoch");
    const fl_batch_source *src = &((fl_source_object *)self)->source;
    unsigned long long epoch, first_batch = 0;
    if (fl_parse_args(&start_epoch_args, args, nargs, kwnames, FL_ARG("epoch", UINT64, &epoch),
                      FL_ARG("|first_batch", UINT64, &first_batch)) < 0 ||
        source_cleared(self))
        return NULL;
    if (src->ops->needs_stop(src->impl)) /* an abandoned epoch's workers go first, without the GIL */
        stop_without_gil(src);
    fl_source_object *source = (fl_source_object *)self;
    if (source->type->epoch_starting != NULL)
        source->type->epoch_starting(source);
    int rc;
    if (src->ops->start_forks) { /* the fork hooks run PyOS_BeforeFork & co: the GIL stays held */
        rc = src->ops->start_epoch(src->impl, epoch, first_batch);
    } else {
        Py_BEGIN_ALLOW_THREADS /* starts the worker threads */
        rc = src->ops->start_epoch(src->impl, epoch, first_batch);
        Py_END_ALLOW_THREADS
    }
    if (rc != FL_OK)
        return fl_raise(source_state(self), rc, "start_epoch");
    Py_RETURN_NONE;
}

int fl_source_set_batch_ends(PyObject *self, PyObject *value,
                             int (*set)(void *impl, const uint64_t *ends, uint64_t n)) {
    if (value == NULL) {
        fl_raisef(NULL, FL_EXC_ATTRIBUTE, "batch_ends cannot be deleted; set None");
        return -1;
    }
    PyArrayObject *ends = NULL;
    if (value != Py_None &&
        (ends = (PyArrayObject *)PyArray_FROMANY(value, NPY_UINT64, 1, 1, NPY_ARRAY_CARRAY)) == NULL)
        return -1;
    int rc = set(((fl_source_object *)self)->source.impl, ends ? (const uint64_t *)PyArray_DATA(ends) : NULL,
                 ends ? (uint64_t)PyArray_DIM(ends, 0) : 0);
    Py_XDECREF(ends);
    if (rc == FL_OK)
        return 0;
    fl_raise(source_state(self), rc, "batch_sampler");
    return -1;
}

PyObject *fl_source_get_batches(PyObject *self, void *closure) {
    (void)closure;
    const fl_batch_source *src = &((fl_source_object *)self)->source;
    return PyLong_FromUnsignedLongLong(src->ops->batches(src->impl));
}

PyObject *fl_source_get_lent(PyObject *self, void *closure) {
    (void)closure;
    const fl_batch_source *src = &((fl_source_object *)self)->source;
    return PyLong_FromLong(src->ops->lent(src->impl));
}

PyObject *fl_source_get_ahead(PyObject *self, void *closure) {
    (void)closure;
    const fl_batch_source *src = &((fl_source_object *)self)->source;
    return PyLong_FromLong(src->ops->ahead(src->impl));
}

PyObject *fl_source_get_output(PyObject *self, void *closure) {
    (void)closure;
    fl_source_object *source = (fl_source_object *)self;
    return PyTuple_Pack(2, source->out_descrs, source->out_shapes);
}

PyObject *fl_source_get_copied_out(PyObject *self, void *closure) {
    (void)closure;
    fl_source_object *source = (fl_source_object *)self;
    unsigned long long copied = atomic_load_explicit(&source->copied_out, memory_order_relaxed);
    return PyLong_FromUnsignedLongLong(copied);
}

/* gc support: what the core reads (keep_alive) may be a user's objects that refer back to
 * the loader (an ndarray subclass holding it; a dataset whose fetch is in the mode's part). */
static int source_traverse(PyObject *self_obj, visitproc visit, void *arg) {
    fl_source_object *self = (fl_source_object *)self_obj;
    Py_VISIT(Py_TYPE(self_obj));
    Py_VISIT(self->out_descrs);
    Py_VISIT(self->out_shapes);
    Py_VISIT(self->keep_alive);
    return self->type != NULL && self->type->traverse != NULL ? self->type->traverse(self_obj, visit, arg) : 0;
}

/* Ends the workers before dropping what they read; `self` then refuses new epochs. The
 * source itself is freed at dealloc, when no lease is left. Workers that run Python are only
 * asked to stop (see workers_run_python) and keep what they read until that free: the
 * cycle breaks at the other objects in it. */
static int source_clear(PyObject *self_obj) {
    fl_source_object *self = (fl_source_object *)self_obj;
    if (self->source.ops != NULL && self->type != NULL && self->type->workers_run_python) {
        self->source.ops->request_stop(self->source.impl);
        self->cleared = 1;
        return 0;
    }
    if (self->source.ops != NULL && !self->cleared)
        stop_without_gil(&self->source);
    self->cleared = 1;
    Py_CLEAR(self->keep_alive);
    if (self->type != NULL && self->type->clear != NULL)
        self->type->clear(self);
    return 0;
}

static void release_python_side(fl_source_object *self);

/* free_later's continuation, on the thread that joined the workers and freed the source: the
 * Python side goes too, attached (not once the interpreter is exiting: it goes with it). */
static void release_later(void *arg) {
    if (Py_IsFinalizing())
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    release_python_side(arg);
    PyGILState_Release(gil);
}

static void source_dealloc(PyObject *self_obj) {
    fl_source_object *self = (fl_source_object *)self_obj;
    PyObject_GC_UnTrack(self_obj);
    if (self->source.ops != NULL) { /* first: the workers read what the mode frees */
        fl_batch_source src = self->source;
        self->source.ops = NULL;
        if (self->type != NULL && self->type->workers_run_python &&
            src.ops->free_later(src.impl, release_later, self) == FL_OK)
            return; /* never join them here: see workers_run_python */
        Py_BEGIN_ALLOW_THREADS /* joins or reaps the workers */
        src.ops->free(src.impl);
        Py_END_ALLOW_THREADS
    }
    release_python_side(self);
}

/* What the object holds besides its source, then the object. */
static void release_python_side(fl_source_object *self) {
    PyObject *self_obj = (PyObject *)self;
    PyTypeObject *type = Py_TYPE(self_obj);
    Py_CLEAR(self->out_descrs);
    Py_CLEAR(self->out_shapes);
    Py_CLEAR(self->keep_alive);
    if (self->type != NULL && self->type->clear != NULL)
        self->type->clear(self);
    if (self->type != NULL && self->type->free != NULL)
        self->type->free(self);
    type->tp_free(self_obj);
    Py_DECREF(type);
}

static PyMethodDef source_methods[] = {
    {"next", (PyCFunction)(void (*)(void))source_next, METH_FASTCALL | METH_KEYWORDS,
     "next($self, timeout=None)\n--\n\nThe next batch as a tuple of arrays; None after the last."},
    {"start_epoch", (PyCFunction)(void (*)(void))source_start_epoch,
     METH_FASTCALL | METH_KEYWORDS,
     "start_epoch($self, epoch, first_batch=0)\n--\n\nBegin an epoch (abandoning one in progress) at "
     "batch first_batch; start the workers if none run."},
    {"stop", (PyCFunction)(void (*)(void))source_stop, METH_FASTCALL | METH_KEYWORDS,
     "stop($self, wait=True)\n--\n\nAbandon the epoch; end the workers (wait=False: ask them to end and "
     "return; the next stop or start_epoch joins them)."},
    {NULL, NULL, 0, NULL},
};

int fl_source_borrow(fl_source_object *self, PyObject *pipeline_obj, PyObject *metrics_obj,
                     const fl_pipeline **pipeline, fl_metrics **metrics) {
    fl_module_state *state = source_state((PyObject *)self);
    *pipeline = NULL;
    *metrics = NULL;
    if (pipeline_obj != Py_None && ((*pipeline = fl_pipeline_from_python(pipeline_obj, state)) == NULL ||
                                    PyList_Append(self->keep_alive, pipeline_obj) < 0))
        return -1;
    if (metrics_obj != Py_None && ((*metrics = fl_metrics_from_python(metrics_obj, state)) == NULL ||
                                   PyList_Append(self->keep_alive, metrics_obj) < 0))
        return -1;
    return 0;
}

PyTypeObject *fl_source_add_type(PyObject *module, const fl_source_type *def) {
    PyType_Slot slots[] = { /* read while the type is made; the type copies the doc */
        {Py_tp_doc, (void *)def->doc},
        {Py_tp_new, def->new},
        {Py_tp_dealloc, source_dealloc},
        {Py_tp_traverse, source_traverse},
        {Py_tp_clear, source_clear},
        {Py_tp_methods, source_methods},
        {Py_tp_getset, def->getset},
        {0, NULL},
    };
    PyType_Spec spec = {
        .name = def->name,
        .basicsize = (int)def->basicsize,
        .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
        .slots = slots,
    };
    PyTypeObject *type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &spec, NULL);
    if (type != NULL && PyModule_AddType(module, type) < 0)
        Py_CLEAR(type);
    return type;
}
