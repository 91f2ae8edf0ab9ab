/* py_loader.c - fastloop._core._Loader, threads mode of fastloop.Loader: parsing the
 * source's fields (arrays, files, encoded images) into an fl_loader, and its `skipped`
 * samples. next/start_epoch/stop and the other getters are py_batch_source.c's. */
#include "fl_module.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "data/fl_loader.h"
#include "py_ops.h"
#include "py_batch.h"
#include "py_batch_source.h"
#include "py_pipeline.h"
#include "py_image.h"

typedef struct {
    fl_source_object base;         /* source: the fl_loader; keep_alive: arrays, path bytes,
                                    * pipeline, metrics the C loader borrows */
    const char **paths_storage;    /* char* arrays for file fields (point into keep_alive) */
    fl_image_geometry *geometries; /* per field: the geometry of an encoded-image field */
} LoaderObject;

static fl_module_state *loader_state(PyObject *self) { return fl_state_from_type(Py_TYPE(self)); }

static fl_loader *core_loader(PyObject *self) { return ((LoaderObject *)self)->base.source.impl; }

/* A loader's data error: OSError for I/O, ValueError for bad data (FL_IN_DATA). */
#define LOADER_DATA(text) (&(fl_raise_opts){.message = (text), .in = FL_IN_DATA})

/* A worker's error (an unreadable file, a bad image) as next() raises it. */
static PyObject *raise_worker_error(fl_source_object *self, int rc) {
    return fl_raise_with(loader_state((PyObject *)self), rc, LOADER_DATA(fl_loader_error(self->source.impl)));
}

static const fl_source_type loader_type;

static PyObject *loader_get_skipped(PyObject *self, void *closure) {
    (void)closure;
    char text[1024];
    uint64_t skipped = fl_loader_skipped(core_loader(self), text, sizeof text);
    return Py_BuildValue("(Ks)", (unsigned long long)skipped, text);
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
        fl_raisef(NULL, FL_EXC_VALUE, "_encoded_spec: '%s' must be a contiguous 1-d %s array of one entry per sample",
                  name, type == NPY_INT32 ? "int32" : "int64");
        return NULL;
    }
    return (PyArrayObject *)obj;
}

/* ("encoded", [bytes paths], file_index int32, offsets int64, lengths int64, geometry[,
 * gpu_capacity]): gpu_capacity > 0 stages field 0 for a GPU decoder (fl_gpu_stage.h), each
 * sample an entry of fl_gpu_entry_bytes(out_h, out_w, gpu_capacity) uint8. */
static int parse_encoded(LoaderObject *self, PyObject *spec, fl_field *field, size_t index, uint64_t *n_samples,
                         PyObject *descrs, PyObject *shapes, PyObject *keep) {
    const char *kind;
    PyObject *paths, *file_index, *offsets, *lengths, *geometry;
    Py_ssize_t gpu_capacity = 0;
    if (!PyArg_ParseTuple(spec, "sOOOOO|n", &kind, &paths, &file_index, &offsets, &lengths, &geometry,
                          &gpu_capacity) ||
        fl_parse_geometry(geometry, &self->geometries[index]) < 0)
        return -1;
    const fl_image_geometry *g = &self->geometries[index];
    size_t entry_bytes = gpu_capacity > 0 ? fl_gpu_entry_bytes(g->out_h, g->out_w, (size_t)gpu_capacity) : 0;
    if (gpu_capacity < 0 || (gpu_capacity > 0 && (index != 0 || entry_bytes == 0))) {
        fl_raisef(NULL, FL_EXC_VALUE, "source[%zu]: a GPU staging capacity of %zd bytes is not possible here "
                  "(field 0 only, > 0, not overflowing)", index, gpu_capacity);
        return -1;
    }
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
    const int64_t *lens = PyArray_DATA((PyArrayObject *)lengths);
    for (Py_ssize_t i = 0; i < n; i++)
        if (files[i] < 0 || files[i] >= n_paths || offs[i] < 0 || lens[i] < -1) { /* -1: to the end of the file */
            fl_raisef(NULL, FL_EXC_VALUE, "_encoded_spec: sample %zd names file %d of %zd at offset %lld, %lld bytes",
                      i, (int)files[i], n_paths, (long long)offs[i], (long long)lens[i]);
            return -1;
        }
    *field = (fl_field){.paths = list, .sample_bytes = g->out_h * g->out_w * 3, .geometry = g,
                        .file_index = files, .offsets = offs, .lengths = lens, .gpu_entry_bytes = entry_bytes};
    *n_samples = (uint64_t)n;
    PyObject *shape = entry_bytes ? Py_BuildValue("(n)", (Py_ssize_t)entry_bytes)
                                  : Py_BuildValue("(nni)", (Py_ssize_t)g->out_h, (Py_ssize_t)g->out_w, 3);
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
        fl_raisef(NULL, FL_EXC_TYPE, "a loader field is a (kind, ...) tuple");
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
            fl_raisef(NULL, FL_EXC_VALUE, "'%s' must have a sample axis (got a 0-d array)", name);
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
        if (!PyArg_ParseTuple(spec, "sOpnO!O!O", &kind, &paths, &raw, &sample_bytes, &PyArrayDescr_Type, &descr,
                              &PyTuple_Type, &sample_shape, &header_path))
            return -1;
        Py_ssize_t checked = fl_sample_nbytes(descr, sample_shape); /* also refuses too many dimensions */
        if (checked != sample_bytes) {
            if (checked >= 0)
                fl_raisef(NULL, FL_EXC_VALUE, "source[%zu]: %zd bytes per sample, but its shape %R makes %zd",
                          index, sample_bytes, sample_shape, checked);
            return -1;
        }
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
    fl_raisef(NULL, FL_EXC_VALUE, "unknown field kind '%s'", kind);
    return -1;
}

/* Makes the C loader from the parsed fields and hands it to the shared binding as its
 * source, with the output dtypes and shapes (lists, made tuples here) and field offsets. */
static int build_source(LoaderObject *self, const fl_loader_config *config, PyObject *descrs, PyObject *shapes) {
    fl_loader *loader;
    int rc = fl_loader_new(config, &loader);
    if (rc != FL_OK) {
        fl_raise(loader_state((PyObject *)self), rc, "Loader");
        return -1;
    }
    self->base.source = fl_loader_source(loader);
    for (size_t f = 0; f < config->n_fields; f++)
        self->base.offsets[f] = fl_loader_field_offset(loader, f);
    if (config->pipeline != NULL && config->fields[0].gpu_entry_bytes == 0) { /* field 0 as the pipeline makes it */
        fl_images out;
        fl_dtype dtype;
        fl_layout layout;
        fl_loader_output_image(loader, &out, &dtype, &layout);
        if (fl_pipeline_set_output(out, dtype, layout, descrs, shapes) < 0)
            return -1;
    }
    self->base.out_descrs = PySequence_Tuple(descrs);
    self->base.out_shapes = PySequence_Tuple(shapes);
    return self->base.out_descrs != NULL && self->base.out_shapes != NULL ? 0 : -1;
}

/* The images the pipeline gets: field 0's output, or for a field staged for a GPU decoder
 * the decoded images the CPU route makes (out_h x out_w x 3 uint8). */
static int pipeline_input(fl_loader_config *config, PyObject *pipeline_obj, PyObject *descrs, PyObject *shapes) {
    const fl_field *f = &config->fields[0];
    if (f->gpu_entry_bytes == 0)
        return fl_pipeline_input_of(pipeline_obj, PyList_GET_ITEM(descrs, 0), PyList_GET_ITEM(shapes, 0), "source[0]",
                                    &config->image, &config->image_dtype);
    PyObject *shape = Py_BuildValue("(nni)", (Py_ssize_t)f->geometry->out_h, (Py_ssize_t)f->geometry->out_w, 3);
    if (shape == NULL)
        return -1;
    int rc = fl_pipeline_input_of(pipeline_obj, PyList_GET_ITEM(descrs, 0), shape, "source[0]", &config->image,
                                  &config->image_dtype);
    Py_DECREF(shape);
    return rc;
}

static PyObject *loader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache loader_args = FL_ARG_CACHE("_Loader");
    PyObject *fields_obj, *pipeline_obj = Py_None, *metrics_obj = Py_None;
    Py_ssize_t batch_size;
    unsigned long long seed = 0;
    int shuffle = 0, rank = 0, world_size = 1, drop_last = 0, workers = 0, slots = 2, skip_errors = 0, ahead = 0;
    if (fl_parse_args_dict(&loader_args, args, kwargs, FL_ARG("fields", OBJECT, &fields_obj),
                           FL_ARG("batch_size", SSIZE, &batch_size),
                           FL_ARG("|shuffle", BOOL, &shuffle), FL_ARG("seed", UINT64, &seed),
                           FL_ARG("rank", INT, &rank), FL_ARG("world_size", INT, &world_size),
                           FL_ARG("drop_last", BOOL, &drop_last), FL_ARG("workers", INT, &workers),
                           FL_ARG("slots", INT, &slots), FL_ARG("pipeline", OBJECT, &pipeline_obj),
                           FL_ARG("metrics", OBJECT, &metrics_obj),
                           FL_ARG("skip_errors", BOOL, &skip_errors),
                           FL_ARG("ahead", INT, &ahead)) < 0)
        return NULL;
    PyObject *fields = PySequence_Tuple(fields_obj);
    if (fields == NULL)
        return NULL;
    size_t n_fields = (size_t)PyTuple_GET_SIZE(fields);
    if (n_fields == 0 || n_fields > FL_SOURCE_MAX_FIELDS) {
        fl_raisef(NULL, FL_EXC_VALUE, "a source has 1 to 64 fields");
        Py_DECREF(fields);
        return NULL;
    }
    LoaderObject *self = (LoaderObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(fields);
        return NULL;
    }
    self->base.type = &loader_type; /* first: gc may visit it from here on */
    fl_field *specs = PyMem_Calloc(n_fields, sizeof *specs);
    PyObject *descrs = PyList_New(0), *shapes = PyList_New(0);
    if (specs == NULL || descrs == NULL || shapes == NULL)
        goto fail;
    self->base.n_fields = n_fields;
    self->base.keep_alive = PyList_New(0);
    self->paths_storage = PyMem_Calloc(n_fields, sizeof *self->paths_storage);
    self->geometries = PyMem_Calloc(n_fields, sizeof *self->geometries);
    if (!self->base.keep_alive || !self->paths_storage || !self->geometries)
        goto fail;
    fl_loader_config config = {
        .sampler = {.shuffle = shuffle, .seed = seed, .rank = rank, .world_size = world_size,
                    .batch_size = batch_size > 0 ? (size_t)batch_size : 0, .drop_last = drop_last},
        .workers = workers, .slots = slots, .ahead = ahead, .fields = specs, .n_fields = n_fields, .skip_errors = skip_errors,
    };
    for (size_t f = 0; f < n_fields; f++) {
        uint64_t n;
        if (parse_field(self, PyTuple_GET_ITEM(fields, (Py_ssize_t)f), &specs[f], f, &n, descrs, shapes,
                        self->base.keep_alive) < 0)
            goto fail;
        if (f > 0 && n != config.sampler.n) {
            fl_raisef(NULL, FL_EXC_VALUE, "source[%zu] has %llu samples but source[0] has %llu", f,
                      (unsigned long long)n, (unsigned long long)config.sampler.n);
            goto fail;
        }
        config.sampler.n = n;
    }
    if (fl_source_borrow(&self->base, pipeline_obj, metrics_obj, &config.pipeline, &config.metrics) < 0 ||
        (config.pipeline != NULL && pipeline_input(&config, pipeline_obj, descrs, shapes) < 0))
        goto fail;
    if (build_source(self, &config, descrs, shapes) < 0)
        goto fail;
    PyMem_Free(specs);
    Py_DECREF(fields), Py_DECREF(descrs), Py_DECREF(shapes);
    return (PyObject *)self;
fail:
    if (!PyErr_Occurred()) /* an allocation above failed */
        PyErr_NoMemory();
    PyMem_Free(specs);
    Py_DECREF(fields), Py_XDECREF(descrs), Py_XDECREF(shapes);
    Py_DECREF(self);
    return NULL;
}

/* What the workers borrowed, freed once they are joined. */
static void loader_free(fl_source_object *base) {
    LoaderObject *loader = (LoaderObject *)base;
    for (size_t f = 0; loader->paths_storage && f < base->n_fields; f++)
        PyMem_Free((void *)loader->paths_storage[f]);
    PyMem_Free(loader->paths_storage);
    PyMem_Free(loader->geometries);
}

static PyGetSetDef loader_getset[] = {
    FL_SOURCE_GETSET,
    {"skipped", loader_get_skipped, NULL, "(samples dropped, the first one's message).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static const fl_source_type loader_type = {
    .name = "fastloop._core._Loader", .doc = "The C half of fastloop.Loader in threads mode.",
    .basicsize = sizeof(LoaderObject), .new = loader_new, .getset = loader_getset,
    .timeout_format = "no batch within the timeout of %g s", .raise_error = raise_worker_error,
    .free = loader_free, /* its Python objects are all in keep_alive */
};

/* ---- the sampler, for the in-process path ---- */

static PyObject *epoch_order(PyObject *module, PyObject *args) {
    static fl_arg_cache epoch_order_args = FL_ARG_CACHE("_epoch_order"); /* positional only */
    unsigned long long n, seed, epoch;
    int shuffle, rank, world_size, drop_last = 0;
    if (fl_parse_args_dict(&epoch_order_args, args, NULL, FL_ARG("n", UINT64, &n),
                           FL_ARG("shuffle", BOOL, &shuffle), FL_ARG("seed", UINT64, &seed),
                           FL_ARG("epoch", UINT64, &epoch), FL_ARG("rank", INT, &rank),
                           FL_ARG("world_size", INT, &world_size),
                           FL_ARG("|drop_last", BOOL, &drop_last)) < 0)
        return NULL;
    fl_sampler s = {.n = n, .shuffle = shuffle, .seed = seed, .rank = rank, .world_size = world_size,
                    .batch_size = 1, .drop_last = drop_last};
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

/* The batches of an epoch on this rank: the rule both C loaders follow, for the in-process path. */
static PyObject *epoch_batches(PyObject *module, PyObject *args) {
    static fl_arg_cache epoch_batches_args = FL_ARG_CACHE("_epoch_batches"); /* positional only */
    unsigned long long n;
    int rank, world_size, drop_last;
    Py_ssize_t batch_size;
    if (fl_parse_args_dict(&epoch_batches_args, args, NULL, FL_ARG("n", UINT64, &n),
                           FL_ARG("rank", INT, &rank), FL_ARG("world_size", INT, &world_size),
                           FL_ARG("batch_size", SSIZE, &batch_size),
                           FL_ARG("drop_last", BOOL, &drop_last)) < 0)
        return NULL;
    fl_sampler s = {.n = n, .rank = rank, .world_size = world_size,
                    .batch_size = batch_size > 0 ? (size_t)batch_size : 0, .drop_last = drop_last};
    int rc = fl_sampler_check(&s);
    if (rc != FL_OK)
        return fl_raise_with(fl_state_from_module(module), rc, &(fl_raise_opts){0});
    return PyLong_FromUnsignedLongLong(fl_sampler_batches(&s));
}

static PyObject *epoch_seed(PyObject *module, PyObject *args) {
    static fl_arg_cache epoch_seed_args = FL_ARG_CACHE("_epoch_seed"); /* positional only */
    (void)module;
    unsigned long long seed, epoch;
    if (fl_parse_args_dict(&epoch_seed_args, args, NULL, FL_ARG("seed", UINT64, &seed),
                           FL_ARG("epoch", UINT64, &epoch)) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(fl_sampler_epoch_seed(seed, epoch));
}

static PyMethodDef sampler_functions[] = {
    {"_epoch_order", epoch_order, METH_VARARGS,
     "_epoch_order(n, shuffle, seed, epoch, rank, world_size, drop_last=False, /)\n--\n\n"
     "This shard's sample order (trimmed with drop_last, else padded, to the same length on every rank)."},
    {"_epoch_batches", epoch_batches, METH_VARARGS,
     "_epoch_batches(n, rank, world_size, batch_size, drop_last, /)\n--\n\nBatches per epoch on this rank."},
    {"_epoch_seed", epoch_seed, METH_VARARGS,
     "_epoch_seed(seed, epoch, /)\n--\n\nThe epoch's augmentation seed."},
    {NULL, NULL, 0, NULL},
};

int fl_loader_module_init(PyObject *module, fl_module_state *state) {
    if (PyModule_AddFunctions(module, sampler_functions) < 0)
        return -1;
    if ((state->loader_type = fl_source_add_type(module, &loader_type)) == NULL)
        return -1;
    return fl_batch_module_init(module, state);
}
