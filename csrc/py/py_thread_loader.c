/* py_thread_loader.c - fastloop._core._ThreadLoader, threads mode of fastloop.Loader over
 * Python code (a map-style dataset, Python transforms): the fl_loader's worker threads run it,
 * with no fork and no serialization.
 *
 * Each worker thread attaches a thread state of its own as it starts (PyGILState_Ensure) and
 * runs worker_setup(worker_id) there, which gives it its own (fetch, finish) pair: a Fetcher
 * holding that worker's WorkerInfo and per-batch state (python/fastloop/data/_samples.py).
 * For each batch it re-attaches, writes the samples into the slot with fl_sample_store
 * (py_sample_writer.h), keeps what finish(raw) returns (the batch's other values, as Python
 * objects) with the slot, and detaches; next() hands those objects out after the arrays. On a
 * free-threaded build the workers run Python in parallel; with the GIL they take turns, and
 * gain where the code waits in C that releases it (decoding, NumPy, torch ops).
 *
 * A failing sample's exception object is kept (the earliest batch's), and next() raises what
 * on_failure(worker, index, exception) makes of it: the same type, naming the sample, the
 * original as its cause. A worker never attaches once the interpreter is finalizing: the
 * Loader stops its workers at exit first (fastloop/_lifecycle.py).
 *
 * No finalizer joins these workers (workers_run_python, py_batch_source.h): a worker may be
 * waiting on a lock the finalizing thread holds. The object is freed on a thread of its own
 * once they have ended, so a worker never outlives what it reads.
 */
#include "fl_module.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "data/fl_loader.h"
#include "py_batch.h"
#include "py_batch_source.h"
#include "py_sample_writer.h"

/* One worker's Python side; touched only on its thread (and by gc, which stops the world). */
typedef struct thread_worker {
    PyObject *fetch, *finish; /* worker_setup's pair (finish may be NULL) */
    fl_sample_scratch scratch;
} thread_worker;

typedef struct {
    fl_source_object base;      /* source: the fl_loader; keep_alive: pipeline, metrics */
    fl_sample_writer writer;    /* its references are the ones below */
    PyObject *worker_setup;     /* worker_id -> (fetch, finish), run on the worker's thread */
    PyObject *on_failure;       /* (worker, index, exception) -> the exception next() raises */
    PyObject *in_descrs, *in_shapes; /* per field, as fetched */
    int workers, slots;
    thread_worker *per_worker;  /* [workers] */
    PyObject **slot_objects;    /* [slots]: finish's objects for the batch in that slot, or NULL;
                                 * written by the filling worker, taken by next() once lent */
    fl_loader_filler filler;
    pthread_mutex_t failure_lock; /* guards the failure fields: workers fail at once */
    PyObject *failure;          /* the earliest failing batch's exception, or NULL */
    uint64_t failure_batch;
    int64_t failure_index;      /* the sample, or -1 */
    int failure_worker;
} ThreadLoaderObject;

/* A worker thread's GIL state, and its thread state between batches. */
static _Thread_local PyGILState_STATE worker_gil;
static _Thread_local PyThreadState *worker_tstate;

static fl_loader *core_loader(ThreadLoaderObject *self) { return self->base.source.impl; }

/* ---- failures ---- */

/* The pending exception, normalized, with its traceback; NULL if none is set. */
static PyObject *take_exception(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* Keeps the pending exception as batch `batch`'s failure (sample `index`, -1: none in
 * particular) if no earlier batch failed, and returns FL_EWORKER with a detail naming it. */
static int keep_failure(ThreadLoaderObject *self, uint64_t batch, int64_t index, int worker) {
    PyObject *error = take_exception();
    PyObject *text = error != NULL ? PyObject_Str(error) : NULL;
    const char *message = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
    fl_error_set(FL_EWORKER, "sample %lld: %s: %s", (long long)index, error ? Py_TYPE(error)->tp_name : "error",
                 message ? message : "");
    PyErr_Clear();
    Py_XDECREF(text);
    PyObject *dropped = error;
    pthread_mutex_lock(&self->failure_lock);
    if (error != NULL && (self->failure == NULL || batch < self->failure_batch)) {
        dropped = self->failure;
        self->failure = error;
        self->failure_batch = batch, self->failure_index = index, self->failure_worker = worker;
    }
    pthread_mutex_unlock(&self->failure_lock);
    Py_XDECREF(dropped); /* outside the lock: a finalizer may run */
    return FL_EWORKER;
}

/* next()'s exception for a worker's failure: on_failure's, from the kept exception. */
static PyObject *raise_failure(fl_source_object *base, int rc) {
    ThreadLoaderObject *self = (ThreadLoaderObject *)base;
    fl_module_state *state = fl_state_from_type(Py_TYPE(self));
    pthread_mutex_lock(&self->failure_lock);
    PyObject *error = rc == FL_EWORKER ? self->failure : NULL;
    int worker = self->failure_worker;
    long long index = (long long)self->failure_index;
    if (error != NULL)
        self->failure = NULL;
    pthread_mutex_unlock(&self->failure_lock);
    if (error == NULL)
        return fl_raise_with(state, rc, &(fl_raise_opts){.message = fl_loader_error(core_loader(self)),
                                                         .in = FL_IN_DATA});
    PyObject *raised = PyObject_CallFunction(self->on_failure, "iLO", worker, index, error);
    Py_DECREF(error);
    if (raised == NULL)
        return NULL;
    fl_raise_with(state, rc, &(fl_raise_opts){.instance = raised});
    Py_DECREF(raised);
    return NULL;
}

static void forget_failure(fl_source_object *base) {
    ThreadLoaderObject *self = (ThreadLoaderObject *)base;
    pthread_mutex_lock(&self->failure_lock);
    PyObject *error = self->failure;
    self->failure = NULL;
    pthread_mutex_unlock(&self->failure_lock);
    Py_XDECREF(error);
}

/* ---- the filler: what the worker threads run ---- */

static int worker_start(void *ctx, int worker) {
    ThreadLoaderObject *self = ctx;
    if (Py_IsFinalizing())
        return fl_error_set(FL_ECLOSED, "the interpreter is exiting");
    worker_gil = PyGILState_Ensure();
    thread_worker *me = &self->per_worker[worker];
    PyObject *pair = PyObject_CallFunction(self->worker_setup, "i", worker), *fetch, *finish;
    int rc = FL_OK;
    if (pair == NULL || !PyArg_ParseTuple(pair, "OO;worker_setup returns (fetch, finish)", &fetch, &finish)) {
        rc = keep_failure(self, 0, -1, worker);
    } else {
        me->fetch = Py_NewRef(fetch);
        me->finish = finish != Py_None ? Py_NewRef(finish) : NULL;
    }
    Py_XDECREF(pair);
    if (rc != FL_OK) {
        PyGILState_Release(worker_gil);
        return rc;
    }
    worker_tstate = PyEval_SaveThread();
    return FL_OK;
}

static void worker_end(void *ctx, int worker) {
    ThreadLoaderObject *self = ctx;
    if (Py_IsFinalizing()) /* too late to attach: what the worker holds is left to the exit */
        return;
    PyEval_RestoreThread(worker_tstate);
    thread_worker *me = &self->per_worker[worker];
    Py_CLEAR(me->fetch);
    Py_CLEAR(me->finish);
    fl_sample_scratch_free(&me->scratch);
    PyGILState_Release(worker_gil);
}

/* Keeps finish's objects with the slot (None: nothing), dropping a stale batch's. */
static void keep_objects(ThreadLoaderObject *self, int slot, PyObject *objects) {
    PyObject *stale = self->slot_objects[slot];
    self->slot_objects[slot] = objects != Py_None ? objects : NULL;
    if (objects == Py_None)
        Py_DECREF(objects);
    Py_XDECREF(stale); /* a batch a stop dropped before next() took it */
}

/* The batch's samples into the slot, then finish's objects; attached. FL_ECLOSED when a
 * stop cancelled it. */
static int fill_batch(ThreadLoaderObject *self, PyObject *fetch, PyObject *finish, int worker, uint64_t batch,
                      uint64_t seed, const int64_t *ids, size_t count, int slot, unsigned char *data) {
    thread_worker *me = &self->per_worker[worker];
    if (fl_sample_scratch_ready(&self->writer, &me->scratch) < 0)
        return keep_failure(self, batch, -1, worker);
    int raw = 0;
    for (size_t i = 0; i < count; i++) {
        if (fl_loader_cancelled(core_loader(self)))
            return fl_error_set(FL_ECLOSED, "the loader stopped");
        int rc = fl_sample_store(&self->writer, &me->scratch, fetch, ids[i], seed, i, data, raw);
        if (rc < 0)
            return keep_failure(self, batch, ids[i], worker);
        raw |= rc;
    }
    if (finish == NULL)
        return FL_OK;
    PyObject *objects = PyObject_CallFunction(finish, "i", raw);
    if (objects == NULL)
        return keep_failure(self, batch, -1, worker); /* the message names the sample */
    keep_objects(self, slot, objects);
    return FL_OK;
}

static int worker_fill(void *ctx, int worker, uint64_t batch, uint64_t seed, const int64_t *ids, size_t count,
                       int slot, unsigned char *data) {
    ThreadLoaderObject *self = ctx;
    if (Py_IsFinalizing())
        return fl_error_set(FL_ECLOSED, "the interpreter is exiting");
    PyEval_RestoreThread(worker_tstate);
    thread_worker *me = &self->per_worker[worker];
    PyObject *fetch = Py_NewRef(me->fetch), *finish = Py_XNewRef(me->finish); /* held through the calls */
    int rc = fill_batch(self, fetch, finish, worker, batch, seed, ids, count, slot, data);
    Py_DECREF(fetch);
    Py_XDECREF(finish);
    worker_tstate = PyEval_SaveThread();
    return rc;
}

/* ---- next() and the other getters ---- */

/* next() appends finish's objects for the batch in the lent `slot` (taken: the slot's next
 * batch brings its own), or None. */
static PyObject *thread_batch_extra(fl_source_object *base, int slot) {
    ThreadLoaderObject *self = (ThreadLoaderObject *)base;
    PyObject *objects = self->slot_objects[slot];
    self->slot_objects[slot] = NULL;
    return objects != NULL ? objects : Py_NewRef(Py_None);
}

/* batch_ends: a batch sampler's uneven batches (fl_source_set_batch_ends), set between epochs. */
static int set_batches(void *impl, const uint64_t *ends, uint64_t n) {
    return fl_loader_set_batches(impl, ends, n);
}

static int thread_set_batch_ends(PyObject *self, PyObject *value, void *closure) {
    (void)closure;
    return fl_source_set_batch_ends(self, value, set_batches);
}

/* ---- construction ---- */

static const fl_source_type thread_type;

/* Makes the fl_loader over the writer's output fields (a field of no bytes when a sample has
 * only object values) and hands it to the shared binding as its source. */
static int build_source(ThreadLoaderObject *self, fl_loader_config *config, PyObject *descrs, PyObject *shapes) {
    fl_sample_writer *w = &self->writer;
    fl_field fields[FL_SOURCE_MAX_FIELDS] = {{0}};
    if (fl_sample_writer_outputs(w, descrs, shapes) < 0)
        return -1;
    for (size_t f = 0; f < w->n_fields; f++)
        fields[f].sample_bytes = w->out_bytes[f];
    config->fields = fields;
    config->n_fields = w->n_fields > 0 ? w->n_fields : 1;
    fl_loader *loader;
    int rc = fl_loader_new(config, &loader);
    if (rc != FL_OK) {
        fl_raise(w->state, rc, "Loader");
        return -1;
    }
    self->base.source = fl_loader_source(loader);
    for (size_t f = 0; f < w->n_fields; f++)
        self->base.offsets[f] = fl_loader_field_offset(loader, f);
    w->offsets = self->base.offsets;
    self->base.out_descrs = PySequence_Tuple(descrs);
    self->base.out_shapes = PySequence_Tuple(shapes);
    return self->base.out_descrs != NULL && self->base.out_shapes != NULL ? 0 : -1;
}

/* The per-worker and per-slot arrays and the failure lock. Returns 0, or -1 with MemoryError. */
static int make_parts(ThreadLoaderObject *self, int workers, int slots) {
    if (workers < 1 || workers > 1024 || slots < 3) {
        fl_raisef(NULL, FL_EXC_VALUE, "'workers' must be 1 to 1024 (got %d) and 'prefetch' >= 1", workers);
        return -1;
    }
    self->workers = workers, self->slots = slots;
    self->per_worker = PyMem_Calloc((size_t)workers, sizeof *self->per_worker);
    self->slot_objects = PyMem_Calloc((size_t)slots, sizeof *self->slot_objects);
    if (self->per_worker == NULL || self->slot_objects == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    pthread_mutex_init(&self->failure_lock, NULL);
    return 0;
}

static PyObject *thread_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache thread_args = FL_ARG_CACHE("_ThreadLoader");
    PyObject *fields_obj, *setup, *on_failure, *pipeline_obj = Py_None, *metrics_obj = Py_None;
    unsigned long long n, seed = 0;
    Py_ssize_t batch_size;
    int shuffle = 0, rank = 0, world_size = 1, drop_last = 0, workers = 1, prefetch = 2, raw_allowed = 1;
    if (fl_parse_args_dict(&thread_args, args, kwargs, FL_ARG("fields", OBJECT, &fields_obj),
                           FL_ARG("worker_setup", OBJECT, &setup), FL_ARG("on_failure", OBJECT, &on_failure),
                           FL_ARG("n", UINT64, &n), FL_ARG("batch_size", SSIZE, &batch_size),
                           FL_ARG("|shuffle", BOOL, &shuffle), FL_ARG("seed", UINT64, &seed),
                           FL_ARG("rank", INT, &rank), FL_ARG("world_size", INT, &world_size),
                           FL_ARG("drop_last", BOOL, &drop_last), FL_ARG("workers", INT, &workers),
                           FL_ARG("prefetch", INT, &prefetch), FL_ARG("pipeline", OBJECT, &pipeline_obj),
                           FL_ARG("metrics", OBJECT, &metrics_obj), FL_ARG("raw_allowed", BOOL, &raw_allowed)) < 0)
        return NULL;
    if (prefetch < 1 || (workers > 0 && prefetch > (INT_MAX - 2) / workers))
        return fl_raisef(NULL, FL_EXC_VALUE, "'prefetch' must be >= 1 and workers x prefetch fit an int");
    ThreadLoaderObject *self = (ThreadLoaderObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->base.type = &thread_type; /* first: gc may visit it from here on */
    fl_sample_writer *w = &self->writer;
    w->state = fl_state_from_type(type);
    w->raw_allowed = raw_allowed;
    self->worker_setup = Py_NewRef(setup);
    self->on_failure = Py_NewRef(on_failure);
    self->base.keep_alive = PyList_New(0);
    PyObject *descrs = PyList_New(0), *shapes = PyList_New(0), *fields = PySequence_Tuple(fields_obj);
    if (fields == NULL || descrs == NULL || shapes == NULL || self->base.keep_alive == NULL ||
        make_parts(self, workers, workers * prefetch + 2) < 0 ||
        fl_sample_writer_fields(w, fields, descrs, shapes, &self->in_descrs, &self->in_shapes) < 0)
        goto fail;
    self->base.n_fields = w->n_fields;
    fl_metrics *metrics;
    if (fl_source_borrow(&self->base, pipeline_obj, metrics_obj, &w->pipeline, &metrics) < 0 ||
        (w->pipeline != NULL && fl_sample_writer_plan(w, pipeline_obj, descrs, shapes) < 0))
        goto fail;
    w->raw_allowed &= w->pipeline == NULL;
    self->filler = (fl_loader_filler){worker_start, worker_end, worker_fill, self};
    fl_loader_config config = {
        .sampler = {.n = n, .shuffle = shuffle, .seed = seed, .rank = rank, .world_size = world_size,
                    .batch_size = batch_size > 0 ? (size_t)batch_size : 1, .drop_last = drop_last},
        .workers = workers, .slots = self->slots, .ahead = workers * prefetch, .metrics = metrics,
        .filler = &self->filler,
    };
    if (build_source(self, &config, descrs, shapes) < 0)
        goto fail;
    Py_DECREF(fields), Py_DECREF(descrs), Py_DECREF(shapes);
    return (PyObject *)self;
fail:
    Py_XDECREF(fields), Py_XDECREF(descrs), Py_XDECREF(shapes);
    Py_DECREF(self);
    return NULL;
}

/* gc support: a dataset that refers back to its Loader (dataset -> Loader -> _ThreadLoader ->
 * a worker's fetch -> dataset) is a cycle only the collector can free, and with it the
 * workers. */
static int thread_traverse(PyObject *self_obj, visitproc visit, void *arg) {
    ThreadLoaderObject *self = (ThreadLoaderObject *)self_obj;
    Py_VISIT(self->worker_setup);
    Py_VISIT(self->on_failure);
    Py_VISIT(self->in_descrs);
    Py_VISIT(self->in_shapes);
    Py_VISIT(self->failure);
    for (int w = 0; self->per_worker != NULL && w < self->workers; w++) {
        Py_VISIT(self->per_worker[w].fetch);
        Py_VISIT(self->per_worker[w].finish);
    }
    for (int s = 0; self->slot_objects != NULL && s < self->slots; s++)
        Py_VISIT(self->slot_objects[s]);
    return 0;
}

/* Drops what can lead back to user objects, once the workers have ended. */
static void thread_clear(fl_source_object *base) {
    ThreadLoaderObject *self = (ThreadLoaderObject *)base;
    for (int w = 0; self->per_worker != NULL && w < self->workers; w++) {
        Py_CLEAR(self->per_worker[w].fetch);
        Py_CLEAR(self->per_worker[w].finish);
    }
    for (int s = 0; self->slot_objects != NULL && s < self->slots; s++)
        Py_CLEAR(self->slot_objects[s]);
    if (self->per_worker != NULL) /* made with the lock */
        forget_failure(base);
    Py_CLEAR(self->worker_setup);
    Py_CLEAR(self->on_failure);
}

static void thread_free(fl_source_object *base) {
    ThreadLoaderObject *self = (ThreadLoaderObject *)base;
    for (int w = 0; self->per_worker != NULL && w < self->workers; w++)
        fl_sample_scratch_free(&self->per_worker[w].scratch);
    if (self->per_worker != NULL)
        pthread_mutex_destroy(&self->failure_lock);
    PyMem_Free(self->per_worker);
    PyMem_Free(self->slot_objects);
    self->per_worker = NULL, self->slot_objects = NULL;
    self->writer.in_descrs = self->writer.in_shapes = NULL;
    Py_CLEAR(self->in_descrs);
    Py_CLEAR(self->in_shapes);
}

static PyGetSetDef thread_getset[] = {
    FL_SOURCE_GETSET,
    {"batch_ends", NULL, thread_set_batch_ends,
     "Where each batch ends in the epoch's order (a batch sampler's uneven batches), or None for batch_size "
     "samples each; set between epochs (write-only).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static const fl_source_type thread_type = {
    .name = "fastloop._core._ThreadLoader",
    .doc = "The C half of fastloop.Loader in threads mode over Python code: worker threads run it.",
    .basicsize = sizeof(ThreadLoaderObject), .new = thread_new, .getset = thread_getset,
    .timeout_format = "no batch from the worker threads within %g s",
    .raise_error = raise_failure, .batch_extra = thread_batch_extra, .epoch_starting = forget_failure,
    .workers_run_python = 1,
    .traverse = thread_traverse, .clear = thread_clear, .free = thread_free,
};

int fl_thread_loader_module_init(PyObject *module, fl_module_state *state) {
    (void)state;
    PyTypeObject *type = fl_source_add_type(module, &thread_type);
    Py_XDECREF(type);
    return type != NULL ? 0 : -1;
}
