/* py_loader.c - fastloop._core._Loader (threads mode of fastloop.Loader) and _SlotLease.
 *
 * next() hands out each batch through fl_batch_from_slot() (py_batch.c): views into a
 * loader-owned slot that return it when released, or copies when the workers would starve. */
#include "fl_module.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "data/fl_loader.h"
#include "py_metrics.h"
#include "py_ops.h"
#include "py_batch.h"
#include "py_pipeline.h"
#include "py_image.h"

typedef struct {
    PyObject_HEAD
    fl_loader *loader;
    PyObject *keep_alive;   /* arrays, path bytes, pipeline, metrics the C loader borrows */
    PyObject *out_descrs;   /* per field: the output dtype */
    PyObject *out_shapes;   /* per field: the output shape of one sample */
    const char **paths_storage; /* char* arrays for file fields (point into keep_alive) */
    fl_image_geometry *geometries; /* per field: the geometry of an encoded-image field */
    size_t n_fields;
} LoaderObject;

static fl_module_state *loader_state(PyObject *self) { return fl_state_from_type(Py_TYPE(self)); }

/* True, with fastloop.Closed set, once the collector cleared this loader (loader_clear). */
static int loader_cleared(PyObject *self) {
    if (((LoaderObject *)self)->keep_alive != NULL)
        return 0;
    fl_raise_with(loader_state(self), FL_ECLOSED,
                  &(fl_raise_opts){.what = "Loader", .message = "cleared by the garbage collector"});
    return 1;
}

static void release_slot(void *core, int slot) { fl_loader_release(core, slot); }

/* The batch in `slot` as a tuple of arrays: views under a lease, or copies when lending it
 * would leave the workers no slot to fill. */
static PyObject *batch_from_slot(LoaderObject *self, int slot, size_t count) {
    size_t offsets[64];
    for (size_t f = 0; f < self->n_fields && f < 64; f++)
        offsets[f] = fl_loader_field_offset(self->loader, f);
    fl_slot_batch batch = {
        .owner = (PyObject *)self, .core = self->loader, .release = release_slot, .slot = slot,
        .data = fl_loader_slot(self->loader, slot), .offsets = offsets, .count = count,
        .descrs = self->out_descrs, .shapes = self->out_shapes,
        .copy_out = fl_copy_out(fl_loader_lent(self->loader), fl_loader_slots(self->loader)),
    };
    return fl_batch_from_slot(loader_state((PyObject *)self), &batch);
}

typedef struct {
    fl_loader *loader;
    int slot;
    size_t count;
} next_call;

static int attempt_next(void *ctx, double timeout_s) {
    next_call *call = ctx;
    return fl_loader_next(call->loader, timeout_s, &call->slot, &call->count);
}

/* A loader's override of the error table: OSError for I/O, ValueError for bad data. */
#define LOADER_DATA(text)                                                                      \
    (&(fl_raise_opts){.message = (text),                                                       \
                      .overrides = {{FL_ESYS, FL_EXC_OS}, {FL_ENOMEM, FL_EXC_MEMORY},         \
                                    {FL_EUNAVAILABLE, FL_EXC_UNAVAILABLE}},                   \
                      .otherwise = FL_EXC_VALUE})

static PyObject *loader_next(PyObject *self_obj, PyObject *args) {
    LoaderObject *self = (LoaderObject *)self_obj;
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (!PyArg_ParseTuple(args, "|O:next", &timeout_obj) || fl_parse_timeout(timeout_obj, 1, &timeout) < 0 ||
        loader_cleared(self_obj))
        return NULL;
    next_call call = {self->loader, -1, 0};
    int rc = fl_wait_interruptibly(attempt_next, &call, timeout);
    if (rc == FL_OK)
        return batch_from_slot(self, call.slot, call.count);
    if (rc == FL_EEND)
        Py_RETURN_NONE;
    if (rc == FL_EINTR)
        return NULL;
    if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
        char message[96]; /* PyErr_Format has no %g */
        snprintf(message, sizeof message, "no batch within the timeout of %g s", timeout);
        return fl_raise_with(loader_state(self_obj), FL_ETIMEDOUT, &(fl_raise_opts){.message = message});
    }
    return fl_raise_with(loader_state(self_obj), rc, LOADER_DATA(fl_loader_error(self->loader)));
}

static PyObject *loader_start_epoch(PyObject *self, PyObject *args) {
    unsigned long long epoch, first_batch = 0;
    if (!PyArg_ParseTuple(args, "K|K:start_epoch", &epoch, &first_batch) || loader_cleared(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS /* may join the workers of an abandoned epoch */
    rc = fl_loader_start_epoch_at(((LoaderObject *)self)->loader, epoch, first_batch);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK)
        return fl_raise(loader_state(self), rc, "start_epoch");
    Py_RETURN_NONE;
}

static PyObject *loader_stop(PyObject *self, PyObject *unused) {
    (void)unused;
    Py_BEGIN_ALLOW_THREADS /* joins workers: each finishes the batch in hand */
    fl_loader_stop(((LoaderObject *)self)->loader);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *loader_get_batches(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(fl_loader_batches(((LoaderObject *)self)->loader));
}

static PyObject *loader_get_lent(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(fl_loader_lent(((LoaderObject *)self)->loader));
}

static PyObject *loader_get_ahead(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(fl_loader_ahead(((LoaderObject *)self)->loader));
}

static PyObject *loader_get_skipped(PyObject *self, void *closure) {
    (void)closure;
    char text[1024];
    uint64_t skipped = fl_loader_skipped(((LoaderObject *)self)->loader, text, sizeof text);
    return Py_BuildValue("(Ks)", (unsigned long long)skipped, text);
}

static PyObject *loader_get_output(PyObject *self, void *closure) {
    (void)closure;
    LoaderObject *loader = (LoaderObject *)self;
    return PyTuple_Pack(2, loader->out_descrs, loader->out_shapes);
}

/* ---- construction ---- */

/* A list of bytes paths as a PyMem array of char* into it (kept alive by `keep`); NULL with
 * an exception set. */
static const char **path_array(PyObject *paths, PyObject *keep, Py_ssize_t *count) {
    PyObject *bytes_list = PySequence_List(paths);
    if (bytes_list == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(bytes_list);
    const char **list = PyMem_Calloc((size_t)(n ? n : 1), sizeof *list);
    for (Py_ssize_t i = 0; list != NULL && i < n; i++)
        if ((list[i] = PyBytes_AsString(PyList_GET_ITEM(bytes_list, i))) == NULL)
            break;
    if (list == NULL || PyErr_Occurred() || PyList_Append(keep, bytes_list) < 0) {
        PyMem_Free(list);
        Py_DECREF(bytes_list);
        return NULL;
    }
    Py_DECREF(bytes_list);
    *count = n;
    return list;
}

/* A 1-d C-contiguous array of `type` with `n` items (argument `name`), or NULL. */
static PyArrayObject *index_array(PyObject *obj, int type, Py_ssize_t n, const char *name) {
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != type || PyArray_NDIM((PyArrayObject *)obj) != 1 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj) || (n >= 0 && PyArray_DIM((PyArrayObject *)obj, 0) != n)) {
        PyErr_Format(PyExc_ValueError, "_encoded_spec: '%s' must be a contiguous 1-d %s array of one entry per sample",
                     name, type == NPY_INT32 ? "int32" : "int64");
        return NULL;
    }
    return (PyArrayObject *)obj;
}

/* ("encoded", [bytes paths], file_index int32, offsets int64, lengths int64, geometry). */
static int parse_encoded(LoaderObject *self, PyObject *spec, fl_field *field, size_t index, uint64_t *n_samples,
                         PyObject *descrs, PyObject *shapes, PyObject *keep) {
    const char *kind;
    PyObject *paths, *file_index, *offsets, *lengths, *geometry;
    if (!PyArg_ParseTuple(spec, "sOOOOO", &kind, &paths, &file_index, &offsets, &lengths, &geometry) ||
        fl_parse_geometry(geometry, &self->geometries[index]) < 0)
        return -1;
    PyArrayObject *fi = index_array(file_index, NPY_INT32, -1, "file_index");
    Py_ssize_t n = fi ? PyArray_DIM(fi, 0) : 0, n_paths = 0;
    if (fi == NULL || index_array(offsets, NPY_INT64, n, "offsets") == NULL ||
        index_array(lengths, NPY_INT64, n, "lengths") == NULL)
        return -1;
    const char **list = path_array(paths, keep, &n_paths);
    if (list == NULL)
        return -1;
    self->paths_storage[index] = (const char *)list; /* freed in dealloc */
    const int32_t *files = PyArray_DATA(fi);
    const int64_t *offs = PyArray_DATA((PyArrayObject *)offsets);
    for (Py_ssize_t i = 0; i < n; i++)
        if (files[i] < 0 || files[i] >= n_paths || offs[i] < 0) {
            PyErr_Format(PyExc_ValueError, "_encoded_spec: sample %zd names file %d of %zd at offset %lld", i,
                         (int)files[i], n_paths, (long long)offs[i]);
            return -1;
        }
    const fl_image_geometry *g = &self->geometries[index];
    *field = (fl_field){.paths = list, .sample_bytes = g->out_h * g->out_w * 3, .geometry = g,
                        .file_index = files, .offsets = offs, .lengths = PyArray_DATA((PyArrayObject *)lengths)};
    *n_samples = (uint64_t)n;
    PyObject *shape = Py_BuildValue("(nni)", (Py_ssize_t)g->out_h, (Py_ssize_t)g->out_w, 3);
    PyObject *descr = (PyObject *)PyArray_DescrFromType(NPY_UINT8);
    int rc = shape && descr && PyList_Append(descrs, descr) == 0 && PyList_Append(shapes, shape) == 0 &&
             PyList_Append(keep, file_index) == 0 && PyList_Append(keep, offsets) == 0 &&
             PyList_Append(keep, lengths) == 0 ? 0 : -1;
    Py_XDECREF(shape);
    Py_XDECREF(descr);
    return rc;
}

/* Fills an fl_field from ("array", ndarray), ("files", [bytes paths], raw, sample_bytes,
 * header_source_path_or_None) or ("encoded", ...) (parse_encoded); records the field's
 * output dtype and sample shape. */
static int parse_field(LoaderObject *self, PyObject *spec, fl_field *field, size_t index,
                       uint64_t *n_samples, PyObject *descrs, PyObject *shapes, PyObject *keep) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
        PyErr_SetString(PyExc_TypeError, "a loader field is a (kind, ...) tuple");
        return -1;
    }
    const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    PyObject *target = PyTuple_GET_ITEM(spec, 1);
    memset(field, 0, sizeof *field);
    if (strcmp(kind, "array") == 0) {
        char name[32];
        snprintf(name, sizeof name, "source[%zu]", index);
        if (fl_check_array(target, name) == NULL)
            return -1;
        PyArrayObject *a = (PyArrayObject *)target;
        if (PyArray_NDIM(a) < 1) {
            PyErr_Format(PyExc_ValueError, "'%s' must have a sample axis (got a 0-d array)", name);
            return -1;
        }
        field->base = PyArray_DATA(a);
        field->sample_bytes = (size_t)PyArray_ITEMSIZE(a);
        for (int d = 1; d < PyArray_NDIM(a); d++)
            field->sample_bytes *= (size_t)PyArray_DIM(a, d);
        *n_samples = (uint64_t)PyArray_DIM(a, 0);
        PyObject *shape = PyObject_GetAttrString(target, "shape");
        PyObject *sample_shape = shape ? PyTuple_GetSlice(shape, 1, PyTuple_GET_SIZE(shape)) : NULL;
        Py_XDECREF(shape);
        if (sample_shape == NULL)
            return -1;
        PyList_Append(descrs, (PyObject *)PyArray_DESCR(a));
        PyList_Append(shapes, sample_shape);
        Py_DECREF(sample_shape);
        return PyList_Append(keep, target);
    }
    if (strcmp(kind, "files") == 0) {
        PyObject *paths, *descr, *sample_shape, *header_path;
        int raw;
        Py_ssize_t sample_bytes;
        if (!PyArg_ParseTuple(spec, "sOpnOOO", &kind, &paths, &raw, &sample_bytes, &descr, &sample_shape,
                              &header_path))
            return -1;
        PyObject *bytes_list = PySequence_List(paths);
        if (bytes_list == NULL)
            return -1;
        Py_ssize_t n = PyList_GET_SIZE(bytes_list);
        const char **list = PyMem_Calloc((size_t)(n ? n : 1), sizeof *list);
        for (Py_ssize_t i = 0; list != NULL && i < n; i++)
            if ((list[i] = PyBytes_AsString(PyList_GET_ITEM(bytes_list, i))) == NULL)
                break;
        if (list == NULL || PyErr_Occurred()) {
            PyMem_Free(list);
            Py_DECREF(bytes_list);
            return -1;
        }
        self->paths_storage[index] = (const char *)list; /* freed in dealloc */
        field->paths = list;
        field->raw = raw;
        field->sample_bytes = (size_t)sample_bytes;
        if (!raw) {
            fl_npy_map map;
            int rc = fl_npy_map_open(PyBytes_AS_STRING(header_path), &map);
            if (rc != FL_OK) {
                Py_DECREF(bytes_list);
                fl_raise_with(loader_state((PyObject *)self), rc, LOADER_DATA(NULL));
                return -1;
            }
            field->expect = map.header;
            fl_npy_map_close(&map);
        }
        *n_samples = (uint64_t)n;
        PyList_Append(descrs, descr);
        PyList_Append(shapes, sample_shape);
        int rc = PyList_Append(keep, bytes_list);
        Py_DECREF(bytes_list);
        return rc;
    }
    if (strcmp(kind, "encoded") == 0)
        return parse_encoded(self, spec, field, index, n_samples, descrs, shapes, keep);
    PyErr_Format(PyExc_ValueError, "unknown field kind '%s'", kind);
    return -1;
}

/* With a pipeline, field 0 must be images in its layout; fills geometry and output info. */
static int plan_pipeline(PyObject *pipeline_obj, fl_loader_config *config, PyObject *descrs, PyObject *shapes) {
    PyObject *shape = PyList_GET_ITEM(shapes, 0);
    PyArray_Descr *descr = (PyArray_Descr *)PyList_GET_ITEM(descrs, 0);
    if (PyTuple_GET_SIZE(shape) != 3) {
        PyErr_Format(PyExc_ValueError, "a Pipeline needs image samples (3 dimensions), not shape %R", shape);
        return -1;
    }
    if (fl_dtype_from_descr((PyObject *)descr, "source[0]", &config->image_dtype) < 0)
        return -1;
    fl_layout layout = fl_pipeline_layout_of(pipeline_obj);
    Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 0)), b = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 1)),
               c = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 2));
    config->image = layout == FL_HWC ? (fl_images){1, (size_t)a, (size_t)b, (size_t)c}
                                     : (fl_images){1, (size_t)b, (size_t)c, (size_t)a};
    return 0;
}

/* Replaces field 0's output dtype and shape by what the pipeline produces. */
static int record_pipeline_output(LoaderObject *self) {
    fl_images out;
    fl_dtype dtype;
    fl_layout layout;
    fl_loader_output_image(self->loader, &out, &dtype, &layout);
    PyObject *shape = layout == FL_HWC ? Py_BuildValue("(nnn)", (Py_ssize_t)out.h, (Py_ssize_t)out.w, (Py_ssize_t)out.c)
                                       : Py_BuildValue("(nnn)", (Py_ssize_t)out.c, (Py_ssize_t)out.h, (Py_ssize_t)out.w);
    PyObject *descr = (PyObject *)PyArray_DescrFromType(fl_dtype_to_numpy(dtype));
    if (shape == NULL || descr == NULL || PyList_SetItem(self->out_shapes, 0, shape) < 0 ||
        PyList_SetItem(self->out_descrs, 0, descr) < 0)
        return -1;
    return 0;
}

static PyObject *loader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"fields", "batch_size", "shuffle", "seed", "rank", "world_size", "drop_last",
                               "workers", "slots", "pipeline", "metrics", "skip_errors", "ahead", NULL};
    PyObject *fields_obj, *pipeline_obj = Py_None, *metrics_obj = Py_None;
    Py_ssize_t batch_size;
    unsigned long long seed = 0;
    int shuffle = 0, rank = 0, world_size = 1, drop_last = 0, workers = 0, slots = 2, skip_errors = 0, ahead = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On|pKiipiiOOpi:_Loader", keywords, &fields_obj, &batch_size,
                                     &shuffle, &seed, &rank, &world_size, &drop_last, &workers, &slots,
                                     &pipeline_obj, &metrics_obj, &skip_errors, &ahead))
        return NULL;
    fl_module_state *state = fl_state_from_type(type);
    PyObject *fields = PySequence_Tuple(fields_obj);
    if (fields == NULL)
        return NULL;
    size_t n_fields = (size_t)PyTuple_GET_SIZE(fields);
    if (n_fields == 0 || n_fields > 64) {
        PyErr_SetString(PyExc_ValueError, "a source has 1 to 64 fields");
        Py_DECREF(fields);
        return NULL;
    }
    LoaderObject *self = (LoaderObject *)type->tp_alloc(type, 0);
    fl_field *specs = PyMem_Calloc(n_fields ? n_fields : 1, sizeof *specs);
    if (self == NULL || specs == NULL)
        goto fail;
    self->n_fields = n_fields;
    self->keep_alive = PyList_New(0);
    self->out_descrs = PyList_New(0);
    self->out_shapes = PyList_New(0);
    self->paths_storage = PyMem_Calloc(n_fields ? n_fields : 1, sizeof *self->paths_storage);
    self->geometries = PyMem_Calloc(n_fields ? n_fields : 1, sizeof *self->geometries);
    if (!self->keep_alive || !self->out_descrs || !self->out_shapes || !self->paths_storage || !self->geometries)
        goto fail;
    fl_loader_config config = {
        .sampler = {.shuffle = shuffle, .seed = seed, .rank = rank, .world_size = world_size,
                    .batch_size = batch_size > 0 ? (size_t)batch_size : 0, .drop_last = drop_last},
        .workers = workers, .slots = slots, .ahead = ahead, .fields = specs, .n_fields = n_fields, .skip_errors = skip_errors,
    };
    for (size_t f = 0; f < n_fields; f++) {
        uint64_t n;
        if (parse_field(self, PyTuple_GET_ITEM(fields, (Py_ssize_t)f), &specs[f], f, &n, self->out_descrs,
                        self->out_shapes, self->keep_alive) < 0)
            goto fail;
        if (f > 0 && n != config.sampler.n) {
            PyErr_Format(PyExc_ValueError, "source[%zu] has %llu samples but source[0] has %llu", f,
                         (unsigned long long)n, (unsigned long long)config.sampler.n);
            goto fail;
        }
        config.sampler.n = n;
    }
    if (pipeline_obj != Py_None) {
        if ((config.pipeline = fl_pipeline_from_python(pipeline_obj, state)) == NULL ||
            plan_pipeline(pipeline_obj, &config, self->out_descrs, self->out_shapes) < 0)
            goto fail;
        PyList_Append(self->keep_alive, pipeline_obj);
    }
    if (metrics_obj != Py_None) {
        if ((config.metrics = fl_metrics_from_python(metrics_obj, state)) == NULL)
            goto fail;
        PyList_Append(self->keep_alive, metrics_obj);
    }
    int rc = fl_loader_new(&config, &self->loader);
    if (rc != FL_OK) {
        fl_raise(state, rc, "Loader");
        goto fail;
    }
    if (config.pipeline != NULL && record_pipeline_output(self) < 0)
        goto fail;
    Py_SETREF(self->out_descrs, PySequence_Tuple(self->out_descrs));
    Py_SETREF(self->out_shapes, PySequence_Tuple(self->out_shapes));
    PyMem_Free(specs);
    Py_DECREF(fields);
    if (self->out_descrs == NULL || self->out_shapes == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
fail:
    PyMem_Free(specs);
    Py_DECREF(fields);
    Py_XDECREF(self);
    return NULL;
}

/* gc support: the source arrays the loader reads (keep_alive) may be a user's objects that
 * refer back to it (an ndarray subclass holding the Loader). */
static int loader_traverse(PyObject *self, visitproc visit, void *arg) {
    LoaderObject *loader = (LoaderObject *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(loader->keep_alive);
    Py_VISIT(loader->out_descrs);
    Py_VISIT(loader->out_shapes);
    return 0;
}

/* Joins the workers before dropping what they read; the loader then refuses further epochs
 * (loader_cleared). The core loader is freed by dealloc, where no lease is left. */
static int loader_clear(PyObject *self) {
    LoaderObject *loader = (LoaderObject *)self;
    if (loader->loader != NULL && loader->keep_alive != NULL) {
        Py_BEGIN_ALLOW_THREADS
        fl_loader_stop(loader->loader);
        Py_END_ALLOW_THREADS
    }
    Py_CLEAR(loader->keep_alive);
    return 0;
}

static void loader_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    LoaderObject *loader = (LoaderObject *)self;
    PyObject_GC_UnTrack(self);
    if (loader->loader != NULL) {
        Py_BEGIN_ALLOW_THREADS /* joins the workers */
        fl_loader_free(loader->loader);
        Py_END_ALLOW_THREADS
    }
    for (size_t f = 0; loader->paths_storage && f < loader->n_fields; f++)
        PyMem_Free((void *)loader->paths_storage[f]);
    PyMem_Free(loader->paths_storage);
    PyMem_Free(loader->geometries);
    Py_XDECREF(loader->keep_alive);
    Py_XDECREF(loader->out_descrs);
    Py_XDECREF(loader->out_shapes);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMethodDef loader_methods[] = {
    {"next", loader_next, METH_VARARGS,
     "next($self, timeout=None, /)\n--\n\nThe next batch as a tuple of arrays; None after the last."},
    {"start_epoch", loader_start_epoch, METH_VARARGS,
     "start_epoch($self, epoch, first_batch=0, /)\n--\n\nBegin an epoch (abandoning one in progress) at batch first_batch."},
    {"stop", loader_stop, METH_NOARGS, "stop($self, /)\n--\n\nAbandon the epoch; join the workers."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef loader_getset[] = {
    {"batches", loader_get_batches, NULL, "Batches per epoch.", NULL},
    {"lent", loader_get_lent, NULL, "Slots lent out now.", NULL},
    {"ahead", loader_get_ahead, NULL, "Batches filling or ready, not yet handed out.", NULL},
    {"skipped", loader_get_skipped, NULL, "(samples dropped, the first one's message).", NULL},
    {"output", loader_get_output, NULL, "(dtypes, sample shapes) of the fields as delivered.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot loader_slots[] = {
    {Py_tp_doc, "The C half of fastloop.Loader in threads mode."},
    {Py_tp_new, loader_new},
    {Py_tp_dealloc, loader_dealloc},
    {Py_tp_traverse, loader_traverse},
    {Py_tp_clear, loader_clear},
    {Py_tp_methods, loader_methods},
    {Py_tp_getset, loader_getset},
    {0, NULL},
};

static PyType_Spec loader_spec = {
    .name = "fastloop._core._Loader",
    .basicsize = sizeof(LoaderObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = loader_slots,
};

/* ---- the sampler, for the in-process path ---- */

static PyObject *epoch_order(PyObject *module, PyObject *args) {
    unsigned long long n, seed, epoch;
    int shuffle, rank, world_size;
    if (!PyArg_ParseTuple(args, "KpKKii:_epoch_order", &n, &shuffle, &seed, &epoch, &rank, &world_size))
        return NULL;
    fl_sampler s = {.n = n, .shuffle = shuffle, .seed = seed, .rank = rank, .world_size = world_size,
                    .batch_size = 1};
    int rc = fl_sampler_check(&s);
    if (rc != FL_OK)
        return fl_raise_with(fl_state_from_module(module), rc, &(fl_raise_opts){0});
    npy_intp size = (npy_intp)fl_sampler_shard_size(&s);
    PyObject *order = PyArray_SimpleNew(1, &size, NPY_INT64);
    if (order == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_sampler_epoch(&s, epoch, PyArray_DATA((PyArrayObject *)order));
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        Py_DECREF(order);
        return PyErr_NoMemory();
    }
    return order;
}

static PyObject *epoch_seed(PyObject *module, PyObject *args) {
    (void)module;
    unsigned long long seed, epoch;
    if (!PyArg_ParseTuple(args, "KK:_epoch_seed", &seed, &epoch))
        return NULL;
    return PyLong_FromUnsignedLongLong(fl_sampler_epoch_seed(seed, epoch));
}

static PyMethodDef sampler_functions[] = {
    {"_epoch_order", epoch_order, METH_VARARGS,
     "_epoch_order(n, shuffle, seed, epoch, rank, world_size, /)\n--\n\nThis shard's sample order."},
    {"_epoch_seed", epoch_seed, METH_VARARGS,
     "_epoch_seed(seed, epoch, /)\n--\n\nThe epoch's augmentation seed."},
    {NULL, NULL, 0, NULL},
};

int fl_loader_module_init(PyObject *module, fl_module_state *state) {
    if (PyModule_AddFunctions(module, sampler_functions) < 0)
        return -1;
    state->loader_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &loader_spec, NULL);
    if (state->loader_type == NULL || PyModule_AddType(module, state->loader_type) < 0)
        return -1;
    return fl_batch_module_init(module, state);
}
