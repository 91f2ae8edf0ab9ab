/* py_procloader.c - fastloop._core._ProcLoader, processes mode of fastloop.Loader: worker
 * processes forked by fl_procpool run the Python `fetch` (py_fork_child.c, the runtime of a
 * forked worker) and write each sample straight into a shared-memory slot. Here: the parent's
 * side, which holds the Python objects the workers run (with their gc traverse/clear), turns
 * a worker's failure into the exception `on_failure` builds, lists the workers' pids, hands
 * each batch's object bytes to Python after its arrays, and takes a batch sampler's uneven
 * batches. next/start_epoch/stop and the shared getters are py_batch_source.c's. */
#include "fl_module.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "data/fl_procpool.h"
#include "py_batch.h"
#include "py_batch_source.h"
#include "py_fork_child.h"
#include "py_pipeline.h"

typedef struct {
    fl_source_object base;  /* source: the fl_procpool; keep_alive: pipeline, metrics */
    fl_fork_child child;    /* what the workers run; its references are the ones below */
    PyObject *fetch;        /* (index[, epoch seed]) -> sample (a tuple of fields, or one field) */
    PyObject *worker_setup; /* worker_id -> None, run in each child; or None */
    PyObject *on_failure;   /* (kind, worker, pid, signal, index, text) -> exception */
    PyObject *finish;       /* raw -> the batch's object bytes, run in each child; or None */
    PyObject *in_descrs, *in_shapes; /* per field, as fetched */
    int workers;
} ProcLoaderObject;

static fl_procpool *core_pool(PyObject *self) { return ((ProcLoaderObject *)self)->base.source.impl; }

/* The exception on_failure builds from the pool's recorded failure (kind, worker, pid,
 * signal, index, text), raised; or on_failure's own exception. Other codes: the table. */
static PyObject *raise_worker_failure(fl_source_object *base, int rc) {
    ProcLoaderObject *self = (ProcLoaderObject *)base;
    fl_module_state *state = fl_state_from_type(Py_TYPE(self));
    if (rc != FL_EWORKER)
        return fl_raise(state, rc, "Loader");
    const fl_proc_error *e = fl_procpool_error(base->source.impl);
    PyObject *failure = PyObject_CallFunction(self->on_failure, "siiiLs", e->kind == FL_PROC_DIED ? "died" : "failed",
                                              e->worker, (int)e->pid, e->signal, (long long)e->index, e->text);
    if (failure == NULL)
        return NULL;
    fl_raise_with(state, rc, &(fl_raise_opts){.instance = failure});
    Py_DECREF(failure);
    return NULL;
}

static const fl_source_type proc_type;

/* next() appends to each batch the bytes of its object area, or of the slot's extra bytes,
 * as a bytearray (arrays decoded from it may be written to), or None when there are none. */
static PyObject *proc_batch_extra(fl_source_object *base, int slot) {
    ProcLoaderObject *self = (ProcLoaderObject *)base;
    if (self->child.finish == NULL)
        Py_RETURN_NONE;
    const unsigned char *area = (unsigned char *)fl_procpool_slot(core_pool((PyObject *)self), slot) +
                                self->child.objects_offset;
    uint64_t len;
    memcpy(&len, area, sizeof len);
    if (len == 0)
        Py_RETURN_NONE;
    if (len == FL_OBJECTS_AFTER) {
        size_t n;
        const void *data = fl_procpool_extra(core_pool((PyObject *)self), slot, &n);
        if (data != NULL)
            return PyByteArray_FromStringAndSize(data, (Py_ssize_t)n);
    } else if (len <= self->child.objects_capacity) {
        return PyByteArray_FromStringAndSize((const char *)area + sizeof len, (Py_ssize_t)len);
    }
    return fl_raisef(NULL, FL_EXC_RUNTIME, "a worker's sample data is corrupt (object area length %llu)",
                     (unsigned long long)len);
}

/* batch_ends: a batch sampler's uneven batches (fl_source_set_batch_ends), set between epochs. */
static int set_batches(void *impl, const uint64_t *ends, uint64_t n) {
    return fl_procpool_set_batches(impl, ends, n);
}

static int proc_set_batch_ends(PyObject *self, PyObject *value, void *closure) {
    (void)closure;
    return fl_source_set_batch_ends(self, value, set_batches);
}

static PyObject *proc_get_pids(PyObject *self, void *closure) {
    (void)closure;
    ProcLoaderObject *p = (ProcLoaderObject *)self;
    PyObject *pids = PyList_New(0);
    for (int w = 0; pids != NULL && w < p->workers; w++) {
        pid_t pid = fl_procpool_pid(core_pool(self), w);
        if (pid > 0) {
            PyObject *value = PyLong_FromLong(pid);
            if (value == NULL || PyList_Append(pids, value) < 0)
                Py_CLEAR(pids);
            Py_XDECREF(value);
        }
    }
    return pids;
}

/* ---- construction ---- */

/* (dtype, sample shape) per field as fetched into the writer, and into the lists
 * `descrs`/`shapes` (which become the output's). */
static int parse_fields(ProcLoaderObject *self, PyObject *fields, PyObject *descrs, PyObject *shapes) {
    if (fl_sample_writer_fields(&self->child.writer, fields, descrs, shapes, &self->in_descrs, &self->in_shapes) < 0)
        return -1;
    self->base.n_fields = self->child.writer.n_fields;
    return 0;
}

/* Lays the slot out for the output fields (then the object area, with `finish`) and makes the
 * pool, as the shared binding's source. */
static int build_source(ProcLoaderObject *self, fl_procpool_config *config, PyObject *descrs, PyObject *shapes,
                        size_t objects_bytes) {
    fl_fork_child *child = &self->child;
    if (fl_sample_writer_outputs(&child->writer, descrs, shapes) < 0 ||
        fl_slot_layout(child->writer.out_bytes, child->writer.n_fields, fl_sampler_batch_capacity(&config->sampler),
                       self->base.offsets, &config->slot_bytes) < 0)
        return -1;
    child->writer.offsets = self->base.offsets;
    if (child->finish != NULL) { /* the area: a u64 length, then objects_bytes */
        child->objects_offset = config->slot_bytes;
        child->objects_capacity = objects_bytes;
        if (__builtin_add_overflow(config->slot_bytes, sizeof(uint64_t) + objects_bytes, &config->slot_bytes)) {
            fl_raisef(NULL, FL_EXC_OVERFLOW, "a batch slot of %zu bytes and %zu of sample data is too large",
                      config->slot_bytes, objects_bytes);
            return -1;
        }
    }
    self->base.out_descrs = PySequence_Tuple(descrs);
    self->base.out_shapes = PySequence_Tuple(shapes);
    if (self->base.out_descrs == NULL || self->base.out_shapes == NULL)
        return -1;
    fl_procpool *pool;
    int rc = fl_procpool_new(config, &pool);
    if (rc != FL_OK) {
        fl_raise(child->writer.state, rc, "Loader");
        return -1;
    }
    self->base.source = fl_procpool_source(pool);
    return 0;
}

static PyObject *proc_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache proc_args = FL_ARG_CACHE("_ProcLoader");
    PyObject *fields_obj, *fetch, *on_failure, *pipeline_obj = Py_None, *setup = Py_None, *metrics_obj = Py_None;
    PyObject *finish = Py_None;
    unsigned long long n, seed = 0;
    Py_ssize_t batch_size, objects_bytes = 0;
    int shuffle = 0, rank = 0, world_size = 1, drop_last = 0, workers = 1, prefetch = 2;
    if (fl_parse_args_dict(&proc_args, args, kwargs, FL_ARG("fields", OBJECT, &fields_obj),
                           FL_ARG("fetch", OBJECT, &fetch),
                           FL_ARG("on_failure", OBJECT, &on_failure), FL_ARG("n", UINT64, &n),
                           FL_ARG("batch_size", SSIZE, &batch_size),
                           FL_ARG("|shuffle", BOOL, &shuffle), FL_ARG("seed", UINT64, &seed),
                           FL_ARG("rank", INT, &rank), FL_ARG("world_size", INT, &world_size),
                           FL_ARG("drop_last", BOOL, &drop_last), FL_ARG("workers", INT, &workers),
                           FL_ARG("prefetch", INT, &prefetch),
                           FL_ARG("pipeline", OBJECT, &pipeline_obj),
                           FL_ARG("worker_setup", OBJECT, &setup),
                           FL_ARG("metrics", OBJECT, &metrics_obj),
                           FL_ARG("finish", OBJECT, &finish),
                           FL_ARG("objects_bytes", SSIZE, &objects_bytes)) < 0)
        return NULL;
    if (objects_bytes < 0)
        return fl_raisef(NULL, FL_EXC_VALUE, "'objects_bytes' must be >= 0, not %zd", objects_bytes);
    fl_module_state *state = fl_state_from_type(type);
    ProcLoaderObject *self = (ProcLoaderObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->base.type = &proc_type; /* first: gc may visit it from here on */
    fl_fork_child *child = &self->child;
    child->writer.state = state;
    child->fetch = self->fetch = Py_NewRef(fetch);
    child->worker_setup = self->worker_setup = Py_NewRef(setup);
    self->on_failure = Py_NewRef(on_failure);
    self->finish = Py_NewRef(finish);
    child->finish = finish != Py_None ? finish : NULL;
    child->writer.raw_allowed = child->finish != NULL; /* and no pipeline: checked once it is known */
    self->workers = workers;
    self->base.keep_alive = PyList_New(0);
    PyObject *descrs = PyList_New(0), *shapes = PyList_New(0);
    PyObject *fields = PySequence_Tuple(fields_obj);
    if (fields == NULL || descrs == NULL || shapes == NULL || self->base.keep_alive == NULL ||
        parse_fields(self, fields, descrs, shapes) < 0)
        goto fail;
    fl_metrics *metrics;
    if (fl_source_borrow(&self->base, pipeline_obj, metrics_obj, &child->writer.pipeline, &metrics) < 0 ||
        (child->writer.pipeline != NULL && fl_sample_writer_plan(&child->writer, pipeline_obj, descrs, shapes) < 0))
        goto fail;
    child->writer.raw_allowed &= child->writer.pipeline == NULL;
    fl_procpool_config config = {
        .sampler = {.n = n, .shuffle = shuffle, .seed = seed, .rank = rank, .world_size = world_size,
                    .batch_size = batch_size > 0 ? (size_t)batch_size : 1, .drop_last = drop_last},
        .workers = workers, .prefetch = prefetch, .fill = fl_fork_child_fill, .fill_ctx = child,
        .hooks = fl_fork_child_hooks(child), .metrics = metrics,
    };
    if (build_source(self, &config, descrs, shapes, (size_t)objects_bytes) < 0)
        goto fail;
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
    Py_VISIT(self->fetch);
    Py_VISIT(self->worker_setup);
    Py_VISIT(self->on_failure);
    Py_VISIT(self->finish);
    Py_VISIT(self->in_descrs);
    Py_VISIT(self->in_shapes);
    return 0;
}

/* Drops what can lead back to user objects, once the workers have ended. */
static void proc_clear(fl_source_object *base) {
    ProcLoaderObject *self = (ProcLoaderObject *)base;
    self->child.fetch = self->child.worker_setup = self->child.finish = NULL;
    Py_CLEAR(self->fetch);
    Py_CLEAR(self->worker_setup);
    Py_CLEAR(self->on_failure);
    Py_CLEAR(self->finish);
}

static void proc_free(fl_source_object *base) {
    ProcLoaderObject *self = (ProcLoaderObject *)base;
    fl_fork_child_free(&self->child);
    self->child.writer.in_descrs = self->child.writer.in_shapes = NULL;
    Py_CLEAR(self->in_descrs);
    Py_CLEAR(self->in_shapes);
}

static PyGetSetDef proc_getset[] = {
    FL_SOURCE_GETSET,
    {"pids", proc_get_pids, NULL, "Pids of the running workers.", NULL},
    {"batch_ends", NULL, proc_set_batch_ends,
     "Where each batch ends in the epoch's order (a batch sampler's uneven batches), or None for batch_size "
     "samples each; set between epochs (write-only).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static const fl_source_type proc_type = {
    .name = "fastloop._core._ProcLoader", .doc = "The C half of fastloop.Loader in processes mode.",
    .basicsize = sizeof(ProcLoaderObject), .new = proc_new, .getset = proc_getset,
    .timeout_format = "no batch from the worker processes within %g s",
    .raise_error = raise_worker_failure, .batch_extra = proc_batch_extra,
    .traverse = proc_traverse, .clear = proc_clear, .free = proc_free,
};

int fl_procloader_module_init(PyObject *module, fl_module_state *state) {
    (void)state;
    PyTypeObject *type = fl_source_add_type(module, &proc_type);
    Py_XDECREF(type);
    return type != NULL ? 0 : -1;
}
