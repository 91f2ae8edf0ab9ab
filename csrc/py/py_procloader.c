/* py_procloader.c - fastloop._core._ProcLoader, processes mode of fastloop.Loader: worker
 * processes forked by fl_procpool run the Python `fetch(index[, epoch_seed])` (a dataset's
 * __getitem__ and Python transforms; given the seed with a batch's first sample, it seeds
 * the random generators for the batch) and write each sample straight into a shared-memory slot; field 0 may
 * then go through a C pipeline in the worker. The parent hands slots out like _Loader.
 *
 * Forking: the hooks call PyOS_BeforeFork / PyOS_AfterFork_Parent / PyOS_AfterFork_Child
 * with the GIL held, as os.fork() does; the child then runs worker_setup(worker_id) (seeds,
 * worker_init_fn) and serves commands with the GIL it inherited (it has no other thread). */
#include "fl_module.h"
#include "fl_numpy.h"

#include <unistd.h>

#include "base/fl_error.h"
#include "data/fl_procpool.h"
#include "py_batch.h"
#include "py_metrics.h"
#include "py_pipeline.h"

enum { MAX_FIELDS = 64 };

typedef struct {
    PyObject_HEAD
    fl_procpool *pool;
    PyObject *fetch;        /* (index[, epoch seed]) -> sample (a tuple of fields, or one field) */
    PyObject *worker_setup; /* worker_id -> None, run in each child; or None */
    PyObject *on_failure;   /* (kind, worker, pid, signal, index, text) -> exception */
    PyObject *in_descrs, *in_shapes;   /* per field, as fetched */
    PyObject *out_descrs, *out_shapes; /* per field, as delivered */
    PyObject *keep_alive;   /* pipeline, metrics */
    int froze;              /* this fork froze gc's generations (see before_fork) */
    const fl_pipeline *pipeline;
    fl_images image;        /* field 0 geometry for the pipeline */
    fl_dtype image_dtype;
    size_t n_fields, batch_size;
    int workers;
    size_t in_bytes[MAX_FIELDS], out_bytes[MAX_FIELDS], offsets[MAX_FIELDS]; /* per sample; in a slot */
    unsigned char *scratch_input, *scratch_pipeline; /* one image's, per child, made on first use */
    size_t scratch_per_image;
} ProcLoaderObject;

static fl_module_state *proc_state(PyObject *self) { return fl_state_from_type(Py_TYPE(self)); }

/* True, with fastloop.Closed set, once the collector cleared this loader (proc_clear). */
static int proc_cleared(PyObject *self) {
    if (((ProcLoaderObject *)self)->fetch != NULL)
        return 0;
    fl_raise_with(proc_state(self), FL_ECLOSED,
                  &(fl_raise_opts){.what = "Loader", .message = "cleared by the garbage collector"});
    return 1;
}

/* ---- in the worker process ---- */

/* "module.qualname\x1emessage\x1etraceback" of the pending exception into error; clears it. */
static void describe_exception(char *error, size_t len) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *module = type ? PyObject_GetAttrString(type, "__module__") : NULL;
    PyObject *qualname = type ? PyObject_GetAttrString(type, "__qualname__") : NULL;
    PyObject *message = value ? PyObject_Str(value) : NULL;
    PyObject *traceback = PyImport_ImportModule("traceback");
    PyObject *lines = traceback && type ? PyObject_CallMethod(traceback, "format_exception", "OOO", type,
                                                              value ? value : Py_None, tb ? tb : Py_None)
                                        : NULL;
    PyObject *empty = PyUnicode_FromString("");
    PyObject *text = lines && empty ? PyUnicode_Join(empty, lines) : NULL;
    PyErr_Clear();
    snprintf(error, len, "%s.%s\x1e%s\x1e%s", module ? PyUnicode_AsUTF8(module) : "builtins",
             qualname ? PyUnicode_AsUTF8(qualname) : "Exception", message ? PyUnicode_AsUTF8(message) : "",
             text ? PyUnicode_AsUTF8(text) : "");
    PyErr_Clear();
    Py_XDECREF(module), Py_XDECREF(qualname), Py_XDECREF(message), Py_XDECREF(traceback);
    Py_XDECREF(lines), Py_XDECREF(empty), Py_XDECREF(text);
    Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
}

/* Whether array's shape is `want`, a tuple of ints. */
static int same_shape(PyArrayObject *array, PyObject *want) {
    int ndim = PyArray_NDIM(array);
    if (PyTuple_GET_SIZE(want) != ndim)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (PyLong_AsSsize_t(PyTuple_GET_ITEM(want, d)) != PyArray_DIM(array, d))
            return 0;
    return 1;
}

/* Copies field f of one sample into dst, checking dtype (cast if needed) and shape. */
static int store_field(ProcLoaderObject *self, size_t f, PyObject *value, unsigned char *dst) {
    PyArray_Descr *descr = (PyArray_Descr *)PyTuple_GET_ITEM(self->in_descrs, (Py_ssize_t)f);
    Py_INCREF(descr);
    PyObject *array = PyArray_FromAny(value, descr, 0, 0, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST, NULL);
    if (array == NULL)
        return -1;
    PyObject *want = PyTuple_GET_ITEM(self->in_shapes, (Py_ssize_t)f);
    if (!same_shape((PyArrayObject *)array, want)) { /* per sample: no shape tuple made unless it differs */
        PyObject *got = PyObject_GetAttrString(array, "shape");
        if (got != NULL)
            PyErr_Format(PyExc_ValueError, "field %zu has shape %R, but the first sample's is %R: every "
                                           "sample must have the same shape to form batches", f, got, want);
        Py_XDECREF(got);
        Py_DECREF(array);
        return -1;
    }
    memcpy(dst, PyArray_DATA((PyArrayObject *)array), self->in_bytes[f]);
    Py_DECREF(array);
    return 0;
}

/* Runs the pipeline on the sample in scratch_input into dst; a Python error if it fails. */
static int pipe_sample(ProcLoaderObject *self, int64_t index, uint64_t seed, unsigned char *dst) {
    fl_images one = self->image;
    one.n = 1;
    int rc = fl_pipeline_run(self->pipeline, (fl_exec){NULL, 1}, self->scratch_input, one, self->image_dtype,
                             dst, self->scratch_pipeline, seed, &index);
    if (rc == FL_OK)
        return 0;
    fl_raise_with(proc_state((PyObject *)self), rc, &(fl_raise_opts){.what = "Pipeline", .otherwise = FL_EXC_VALUE});
    return -1;
}

/* Fetches one sample and stores its fields at position i of the batch, field 0 through the
 * pipeline if there is one (one image at a time: a small, cache-resident scratch). */
static int store_sample(ProcLoaderObject *self, int64_t index, uint64_t seed, size_t i, unsigned char *slot) {
    /* with a batch's first sample, the epoch seed: fetch seeds the generators once per batch */
    PyObject *sample = i == 0 ? PyObject_CallFunction(self->fetch, "LK", (long long)index, (unsigned long long)seed)
                              : PyObject_CallFunction(self->fetch, "L", (long long)index);
    if (sample == NULL)
        return -1;
    PyObject *fields = PyTuple_Check(sample) || PyList_Check(sample) ? PySequence_Tuple(sample)
                                                                      : PyTuple_Pack(1, sample);
    Py_DECREF(sample);
    if (fields == NULL)
        return -1;
    int rc = 0;
    if ((size_t)PyTuple_GET_SIZE(fields) != self->n_fields) {
        PyErr_Format(PyExc_ValueError, "the sample has %zd fields, the first sample had %zu",
                     PyTuple_GET_SIZE(fields), self->n_fields);
        rc = -1;
    }
    for (size_t f = 0; rc == 0 && f < self->n_fields; f++) {
        unsigned char *dst = slot + self->offsets[f] + i * self->out_bytes[f];
        PyObject *value = PyTuple_GET_ITEM(fields, (Py_ssize_t)f);
        if (f == 0 && self->pipeline != NULL)
            rc = store_field(self, f, value, self->scratch_input) < 0 ? -1 : pipe_sample(self, index, seed, dst);
        else
            rc = store_field(self, f, value, dst);
    }
    Py_DECREF(fields);
    return rc;
}

static int fill(void *ctx, int worker, uint64_t seed, const int64_t *ids, size_t count,
                unsigned char *slot, int64_t *index, char *error, size_t error_len) {
    ProcLoaderObject *self = ctx;
    (void)worker;
    if (self->pipeline != NULL && self->scratch_input == NULL) { /* once per worker */
        self->scratch_input = PyMem_RawMalloc(self->in_bytes[0] + 1);
        self->scratch_pipeline = PyMem_RawMalloc(self->scratch_per_image + 1);
        if (self->scratch_input == NULL || self->scratch_pipeline == NULL) {
            snprintf(error, error_len, "builtins.MemoryError\x1eno memory for the pipeline's scratch\x1e");
            return 1;
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (store_sample(self, ids[i], seed, i, slot) < 0) {
            *index = ids[i];
            describe_exception(error, error_len);
            return 1;
        }
    }
    return 0;
}

/* Calls gc.<name>() (gc.freeze / gc.unfreeze / gc.get_freeze_count); -1 if that fails. */
static Py_ssize_t call_gc(const char *name) {
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *result = gc != NULL ? PyObject_CallMethod(gc, name, NULL) : NULL;
    Py_ssize_t value = result == NULL ? -1 : result == Py_None ? 0 : PyLong_AsSsize_t(result);
    Py_XDECREF(result);
    Py_XDECREF(gc);
    if (PyErr_Occurred()) { /* only a memory optimisation: never fail a fork for it */
        PyErr_Clear();
        return -1;
    }
    return value;
}

/* Before forking, the parent's objects are moved to gc's permanent generation, as CPython's
 * gc.freeze() documentation advises: a collection in a worker would otherwise write to every
 * inherited object's header and copy every page of the parent's heap. Skipped if the
 * program freezes objects itself. */
static void before_fork(void *ctx) {
    ProcLoaderObject *self = ctx;
    self->froze = call_gc("get_freeze_count") == 0 && call_gc("freeze") == 0;
    PyOS_BeforeFork();
}

static void after_fork_parent(void *ctx) {
    ProcLoaderObject *self = ctx;
    PyOS_AfterFork_Parent();
    if (self->froze) /* the parent collects its objects as before; the workers keep them frozen */
        call_gc("unfreeze");
    self->froze = 0;
}

static void after_fork_child(void *ctx, int worker) {
    ProcLoaderObject *self = ctx;
    PyOS_AfterFork_Child();
    if (self->worker_setup != Py_None) {
        PyObject *result = PyObject_CallFunction(self->worker_setup, "i", worker);
        if (result == NULL) { /* the parent sees this worker exit with status 3 */
            PyErr_Print();
            _exit(3);
        }
        Py_DECREF(result);
    }
}

/* ---- in the parent ---- */

/* Called with the GIL (a batch's last view dropped): the release hands the slot to a worker
 * at once, a write that can wait for a busy worker to read, so without the GIL. */
static void release_slot(void *core, int slot) {
    Py_BEGIN_ALLOW_THREADS
    fl_procpool_release(core, slot);
    Py_END_ALLOW_THREADS
}

typedef struct {
    fl_procpool *pool;
    int slot;
    size_t count;
} next_call;

static int attempt_next(void *ctx, double timeout_s) {
    next_call *call = ctx;
    return fl_procpool_next(call->pool, timeout_s, &call->slot, &call->count);
}

/* The exception on_failure builds from the pool's recorded failure (kind, worker, pid,
 * signal, index, text), or NULL with on_failure's own exception set. */
static PyObject *worker_failure(ProcLoaderObject *self) {
    const fl_proc_error *e = fl_procpool_error(self->pool);
    return PyObject_CallFunction(self->on_failure, "siiiLs", e->kind == FL_PROC_DIED ? "died" : "failed",
                                 e->worker, (int)e->pid, e->signal, (long long)e->index, e->text);
}

static PyObject *proc_next(PyObject *self_obj, PyObject *args) {
    ProcLoaderObject *self = (ProcLoaderObject *)self_obj;
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (!PyArg_ParseTuple(args, "|O:next", &timeout_obj) || fl_parse_timeout(timeout_obj, 1, &timeout) < 0 ||
        proc_cleared(self_obj))
        return NULL;
    next_call call = {self->pool, -1, 0};
    int rc = fl_wait_interruptibly(attempt_next, &call, timeout);
    if (rc == FL_OK) {
        fl_slot_batch batch = {
            .owner = self_obj, .core = self->pool, .release = release_slot, .slot = call.slot,
            .data = fl_procpool_slot(self->pool, call.slot), .offsets = self->offsets, .count = call.count,
            .descrs = self->out_descrs, .shapes = self->out_shapes,
            .copy_out = fl_copy_out(fl_procpool_lent(self->pool), fl_procpool_slots(self->pool)),
        };
        return fl_batch_from_slot(proc_state(self_obj), &batch);
    }
    if (rc == FL_EEND)
        Py_RETURN_NONE;
    if (rc == FL_EINTR)
        return NULL;
    if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
        char message[96]; /* PyErr_Format has no %g */
        snprintf(message, sizeof message, "no batch from the worker processes within %g s", timeout);
        return fl_raise_with(proc_state(self_obj), FL_ETIMEDOUT, &(fl_raise_opts){.message = message});
    }
    if (rc == FL_EWORKER) {
        PyObject *failure = worker_failure(self);
        if (failure == NULL)
            return NULL;
        fl_raise_with(proc_state(self_obj), rc, &(fl_raise_opts){.instance = failure});
        Py_DECREF(failure);
        return NULL;
    }
    return fl_raise(proc_state(self_obj), rc, "Loader");
}

static PyObject *proc_stop(PyObject *self, PyObject *unused) {
    (void)unused;
    Py_BEGIN_ALLOW_THREADS /* up to a second for workers to exit */
    fl_procpool_stop(((ProcLoaderObject *)self)->pool);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *proc_start_epoch(PyObject *self_obj, PyObject *args) {
    ProcLoaderObject *self = (ProcLoaderObject *)self_obj;
    unsigned long long epoch, first_batch = 0;
    if (!PyArg_ParseTuple(args, "K|K:start_epoch", &epoch, &first_batch) || proc_cleared(self_obj))
        return NULL;
    /* forking needs the GIL held (PyOS_BeforeFork); stopping an abandoned epoch's workers
     * can take a second, so that happens first, without it */
    if (fl_procpool_needs_stop(self->pool) && proc_stop(self_obj, NULL) == NULL)
        return NULL;
    int rc = fl_procpool_start_epoch_at(self->pool, epoch, first_batch);
    if (rc != FL_OK)
        return fl_raise(proc_state(self_obj), rc, "start_epoch");
    Py_RETURN_NONE;
}

static PyObject *proc_get_pids(PyObject *self, void *closure) {
    (void)closure;
    ProcLoaderObject *p = (ProcLoaderObject *)self;
    PyObject *pids = PyList_New(0);
    for (int w = 0; pids != NULL && w < p->workers; w++) {
        pid_t pid = fl_procpool_pid(p->pool, w);
        if (pid > 0) {
            PyObject *value = PyLong_FromLong(pid);
            if (value == NULL || PyList_Append(pids, value) < 0)
                Py_CLEAR(pids);
            Py_XDECREF(value);
        }
    }
    return pids;
}

static PyObject *proc_get_batches(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(fl_procpool_batches(((ProcLoaderObject *)self)->pool));
}

static PyObject *proc_get_output(PyObject *self, void *closure) {
    (void)closure;
    ProcLoaderObject *p = (ProcLoaderObject *)self;
    return PyTuple_Pack(2, p->out_descrs, p->out_shapes);
}

/* ---- construction ---- */

/* Field 0 through the pipeline: its geometry in, and dtype and shape out. */
static int plan_pipeline(ProcLoaderObject *self, PyObject *pipeline_obj, PyObject *out_descrs, PyObject *out_shapes) {
    PyObject *shape = PyTuple_GET_ITEM(self->in_shapes, 0);
    if (PyTuple_GET_SIZE(shape) != 3) {
        PyErr_Format(PyExc_ValueError, "a Pipeline needs image samples (3 dimensions), not shape %R", shape);
        return -1;
    }
    if (fl_dtype_from_descr(PyTuple_GET_ITEM(self->in_descrs, 0), "sample[0]", &self->image_dtype) < 0)
        return -1;
    fl_layout layout = fl_pipeline_layout_of(pipeline_obj);
    Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 0)), b = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 1)),
               c = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 2));
    self->image = layout == FL_HWC ? (fl_images){1, (size_t)a, (size_t)b, (size_t)c}
                                   : (fl_images){1, (size_t)b, (size_t)c, (size_t)a};
    fl_images out;
    fl_dtype dtype;
    fl_layout out_layout;
    if (fl_pipeline_plan(self->pipeline, self->image, self->image_dtype, &out, &dtype, &out_layout,
                         &self->scratch_per_image) != FL_OK) {
        fl_raise_with(proc_state((PyObject *)self), FL_EINVAL, &(fl_raise_opts){.what = "Pipeline", .otherwise = FL_EXC_VALUE});
        return -1;
    }
    PyObject *out_shape = out_layout == FL_HWC ? Py_BuildValue("(nnn)", (Py_ssize_t)out.h, (Py_ssize_t)out.w, (Py_ssize_t)out.c)
                                               : Py_BuildValue("(nnn)", (Py_ssize_t)out.c, (Py_ssize_t)out.h, (Py_ssize_t)out.w);
    PyObject *out_descr = (PyObject *)PyArray_DescrFromType(fl_dtype_to_numpy(dtype));
    if (out_shape == NULL || out_descr == NULL)
        return -1;
    PyList_SetItem(out_shapes, 0, out_shape);
    PyList_SetItem(out_descrs, 0, out_descr);
    return 0;
}

static PyObject *proc_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"fields", "fetch", "on_failure", "n", "batch_size", "shuffle", "seed", "rank",
                               "world_size", "drop_last", "workers", "prefetch", "pipeline", "worker_setup",
                               "metrics", NULL};
    PyObject *fields_obj, *fetch, *on_failure, *pipeline_obj = Py_None, *setup = Py_None, *metrics_obj = Py_None;
    unsigned long long n, seed = 0;
    Py_ssize_t batch_size;
    int shuffle = 0, rank = 0, world_size = 1, drop_last = 0, workers = 1, prefetch = 2;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOKn|pKiipiiOOO:_ProcLoader", keywords, &fields_obj, &fetch,
                                     &on_failure, &n, &batch_size, &shuffle, &seed, &rank, &world_size, &drop_last,
                                     &workers, &prefetch, &pipeline_obj, &setup, &metrics_obj))
        return NULL;
    fl_module_state *state = fl_state_from_type(type);
    ProcLoaderObject *self = (ProcLoaderObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->fetch = Py_NewRef(fetch);
    self->on_failure = Py_NewRef(on_failure);
    self->worker_setup = Py_NewRef(setup);
    self->keep_alive = PyList_New(0);
    PyObject *descrs = PyList_New(0), *shapes = PyList_New(0);
    PyObject *fields = PySequence_Tuple(fields_obj);
    if (fields == NULL || descrs == NULL || shapes == NULL || self->keep_alive == NULL)
        goto fail;
    self->n_fields = (size_t)PyTuple_GET_SIZE(fields);
    self->batch_size = batch_size > 0 ? (size_t)batch_size : 1;
    if (self->n_fields == 0 || self->n_fields > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "a sample has 1 to 64 fields");
        goto fail;
    }
    for (size_t f = 0; f < self->n_fields; f++) { /* (dtype, sample shape) per field */
        PyObject *descr_obj, *shape;
        PyArray_Descr *descr = NULL;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, (Py_ssize_t)f), "OO!", &descr_obj, &PyTuple_Type, &shape) ||
            !PyArray_DescrConverter(descr_obj, &descr))
            goto fail;
        PyList_Append(descrs, (PyObject *)descr);
        PyList_Append(shapes, shape);
        self->in_bytes[f] = (size_t)fl_sample_nbytes((PyObject *)descr, shape);
        Py_DECREF(descr);
    }
    self->in_descrs = PySequence_Tuple(descrs);
    self->in_shapes = PySequence_Tuple(shapes);
    if (self->in_descrs == NULL || self->in_shapes == NULL)
        goto fail;
    if (pipeline_obj != Py_None) {
        if ((self->pipeline = fl_pipeline_from_python(pipeline_obj, state)) == NULL ||
            plan_pipeline(self, pipeline_obj, descrs, shapes) < 0)
            goto fail;
        PyList_Append(self->keep_alive, pipeline_obj);
    }
    for (size_t f = 0; f < self->n_fields; f++)
        self->out_bytes[f] = (size_t)fl_sample_nbytes(PyList_GET_ITEM(descrs, (Py_ssize_t)f), PyList_GET_ITEM(shapes, (Py_ssize_t)f));
    size_t slot_bytes = fl_slot_layout(self->out_bytes, self->n_fields, self->batch_size, self->offsets);
    self->out_descrs = PySequence_Tuple(descrs);
    self->out_shapes = PySequence_Tuple(shapes);
    fl_metrics *metrics = NULL;
    if (metrics_obj != Py_None) {
        if ((metrics = fl_metrics_from_python(metrics_obj, state)) == NULL)
            goto fail;
        PyList_Append(self->keep_alive, metrics_obj);
    }
    fl_procpool_config config = {
        .sampler = {.n = n, .shuffle = shuffle, .seed = seed, .rank = rank, .world_size = world_size,
                    .batch_size = self->batch_size, .drop_last = drop_last},
        .workers = workers, .prefetch = prefetch, .slot_bytes = slot_bytes, .fill = fill, .fill_ctx = self,
        .hooks = {before_fork, after_fork_parent, after_fork_child, self}, .metrics = metrics,
    };
    self->workers = workers;
    int rc = fl_procpool_new(&config, &self->pool);
    if (rc != FL_OK) {
        fl_raise(state, rc, "Loader");
        goto fail;
    }
    Py_DECREF(fields), Py_DECREF(descrs), Py_DECREF(shapes);
    return (PyObject *)self;
fail:
    Py_XDECREF(fields), Py_XDECREF(descrs), Py_XDECREF(shapes);
    Py_DECREF(self);
    return NULL;
}

/* gc support: a dataset that refers back to its Loader (dataset -> Loader -> _ProcLoader ->
 * fetch -> dataset) is a cycle only the collector can free, and with it the workers. */
static int proc_traverse(PyObject *self_obj, visitproc visit, void *arg) {
    ProcLoaderObject *self = (ProcLoaderObject *)self_obj;
    Py_VISIT(Py_TYPE(self_obj));
    Py_VISIT(self->fetch);
    Py_VISIT(self->worker_setup);
    Py_VISIT(self->on_failure);
    Py_VISIT(self->in_descrs);
    Py_VISIT(self->in_shapes);
    Py_VISIT(self->out_descrs);
    Py_VISIT(self->out_shapes);
    Py_VISIT(self->keep_alive);
    return 0;
}

/* Ends the workers, then drops what can lead back to user objects; the loader refuses
 * further epochs (proc_cleared). The pool itself is freed by dealloc, where no lease is left. */
static int proc_clear(PyObject *self_obj) {
    ProcLoaderObject *self = (ProcLoaderObject *)self_obj;
    if (self->pool != NULL && self->fetch != NULL) {
        Py_BEGIN_ALLOW_THREADS /* up to a second for workers to exit */
        fl_procpool_stop(self->pool);
        Py_END_ALLOW_THREADS
    }
    Py_CLEAR(self->fetch);
    Py_CLEAR(self->worker_setup);
    Py_CLEAR(self->on_failure);
    Py_CLEAR(self->keep_alive);
    return 0;
}

static void proc_dealloc(PyObject *self_obj) {
    PyTypeObject *type = Py_TYPE(self_obj);
    ProcLoaderObject *self = (ProcLoaderObject *)self_obj;
    PyObject_GC_UnTrack(self_obj);
    if (self->pool != NULL) {
        Py_BEGIN_ALLOW_THREADS /* stops and reaps the workers */
        fl_procpool_free(self->pool);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(self->scratch_input);
    PyMem_RawFree(self->scratch_pipeline);
    Py_XDECREF(self->fetch), Py_XDECREF(self->worker_setup), Py_XDECREF(self->on_failure);
    Py_XDECREF(self->in_descrs), Py_XDECREF(self->in_shapes), Py_XDECREF(self->out_descrs);
    Py_XDECREF(self->out_shapes), Py_XDECREF(self->keep_alive);
    type->tp_free(self_obj);
    Py_DECREF(type);
}

static PyMethodDef proc_methods[] = {
    {"next", proc_next, METH_VARARGS,
     "next($self, timeout=None, /)\n--\n\nThe next batch as a tuple of arrays; None after the last."},
    {"start_epoch", proc_start_epoch, METH_VARARGS,
     "start_epoch($self, epoch, first_batch=0, /)\n--\n\nBegin an epoch at batch first_batch; fork the workers if none run."},
    {"stop", proc_stop, METH_NOARGS, "stop($self, /)\n--\n\nAbandon the epoch; end and reap the workers."},
    {NULL, NULL, 0, NULL},
};

static PyObject *proc_get_ahead(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(fl_procpool_ahead(((ProcLoaderObject *)self)->pool));
}

static PyObject *proc_get_lent(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(fl_procpool_lent(((ProcLoaderObject *)self)->pool));
}

static PyGetSetDef proc_getset[] = {
    {"pids", proc_get_pids, NULL, "Pids of the running workers.", NULL},
    {"lent", proc_get_lent, NULL, "Slots lent out now.", NULL},
    {"ahead", proc_get_ahead, NULL, "Batches assigned to a worker or ready, not yet handed out.", NULL},
    {"batches", proc_get_batches, NULL, "Batches per epoch.", NULL},
    {"output", proc_get_output, NULL, "(dtypes, sample shapes) of the fields as delivered.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot proc_slots[] = {
    {Py_tp_doc, "The C half of fastloop.Loader in processes mode."},
    {Py_tp_new, proc_new},
    {Py_tp_dealloc, proc_dealloc},
    {Py_tp_traverse, proc_traverse},
    {Py_tp_clear, proc_clear},
    {Py_tp_methods, proc_methods},
    {Py_tp_getset, proc_getset},
    {0, NULL},
};

static PyType_Spec proc_spec = {
    .name = "fastloop._core._ProcLoader",
    .basicsize = sizeof(ProcLoaderObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = proc_slots,
};

int fl_procloader_module_init(PyObject *module, fl_module_state *state) {
    (void)state;
    PyTypeObject *type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &proc_spec, NULL);
    if (type == NULL)
        return -1;
    int rc = PyModule_AddType(module, type);
    Py_DECREF(type);
    return rc;
}
