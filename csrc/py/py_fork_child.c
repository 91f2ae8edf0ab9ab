/* py_fork_child.c - what a forked worker of _ProcLoader runs: Python fetches into shared
 * memory, and the fork hooks (see py_fork_child.h). */
#include "py_fork_child.h"
#include "fl_numpy.h"

#include <unistd.h>

#include "base/fl_error.h"

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

/* Whether a sample that does not fit the slots' fields can travel whole instead (see
 * py_fork_child.h): not with a pipeline, which needs field 0 in the slot. */
static int raw_allowed(const fl_fork_child *self) { return self->finish != NULL && self->pipeline == NULL; }

/* A value that NumPy cannot make into the field's dtype: 1 (it travels whole, the error
 * cleared) when the batch can go raw, else -1 with the error. */
static int unconvertible(const fl_fork_child *self) {
    if (raw_allowed(self) && (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError) ||
                              PyErr_ExceptionMatches(PyExc_OverflowError))) {
        PyErr_Clear();
        return 1;
    }
    return -1;
}

/* Where a dtype kind stands among bool < int < float < complex; -1 for the others. */
static int kind_rank(char kind) {
    switch (kind) {
    case 'b': return 0;
    case 'i': case 'u': return 1;
    case 'f': return 2;
    case 'c': return 3;
    default: return -1;
    }
}

/* The dtype kind of a value NumPy would make an array of ('\0': another object). */
static char value_kind(PyObject *value) {
    if (PyArray_Check(value))
        return PyArray_DESCR((PyArrayObject *)value)->kind;
    if (PyArray_IsScalar(value, Generic)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(value);
        char kind = descr != NULL ? descr->kind : '\0';
        Py_XDECREF(descr);
        return kind;
    }
    if (PyBool_Check(value))
        return 'b';
    if (PyLong_Check(value))
        return 'i';
    return PyFloat_Check(value) ? 'f' : PyComplex_Check(value) ? 'c' : '\0';
}

/* Copies field f of one sample into dst, checking dtype (cast if needed) and shape. Returns
 * 0, 1 when the value does not fit the field and the batch can go raw (another shape, a
 * value NumPy cannot cast, or one whose cast would drop a fraction or an imaginary part), or
 * -1 with an error. */
static int store_field(fl_fork_child *self, size_t f, PyObject *value, unsigned char *dst) {
    PyArray_Descr *descr = (PyArray_Descr *)PyTuple_GET_ITEM(self->in_descrs, (Py_ssize_t)f);
    if (raw_allowed(self) && kind_rank(value_kind(value)) > kind_rank(descr->kind))
        return 1; /* a float where the first sample had an int: collated, as default_collate would */
    Py_INCREF(descr);
    PyObject *array = PyArray_FromAny(value, descr, 0, 0, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST, NULL);
    if (array == NULL)
        return unconvertible(self);
    PyObject *want = PyTuple_GET_ITEM(self->in_shapes, (Py_ssize_t)f);
    if (!same_shape((PyArrayObject *)array, want)) { /* per sample: no shape tuple made unless it differs */
        PyObject *got = raw_allowed(self) ? NULL : PyObject_GetAttrString(array, "shape");
        Py_DECREF(array);
        if (raw_allowed(self))
            return 1;
        if (got != NULL)
            fl_raisef(NULL, FL_EXC_VALUE, "field %zu has shape %R, but the first sample's is %R: every "
                                           "sample must have the same shape to form batches", f, got, want);
        Py_XDECREF(got);
        return -1;
    }
    memcpy(dst, PyArray_DATA((PyArrayObject *)array), self->in_bytes[f]);
    Py_DECREF(array);
    return 0;
}

/* Runs the pipeline on the sample in scratch_input into dst; a Python error if it fails. */
static int pipe_sample(fl_fork_child *self, int64_t index, uint64_t seed, unsigned char *dst) {
    fl_images one = self->image;
    one.n = 1;
    int rc = fl_pipeline_run(self->pipeline, (fl_exec){NULL, 1}, self->scratch_input, one, self->image_dtype,
                             dst, self->scratch_pipeline, seed, &index);
    if (rc == FL_OK)
        return 0;
    fl_raise_with(self->state, rc, &(fl_raise_opts){.what = "Pipeline", .in = FL_IN_DATA});
    return -1;
}

/* Stores the fields of a fetched sample at position i of the batch (see store_sample). */
static int store_fields(fl_fork_child *self, PyObject *fields, int64_t index, uint64_t seed, size_t i,
                        unsigned char *slot) {
    if ((size_t)PyTuple_GET_SIZE(fields) != self->n_fields) {
        if (raw_allowed(self))
            return 1;
        fl_raisef(NULL, FL_EXC_VALUE, "the sample has %zd fields, the first sample had %zu",
                  PyTuple_GET_SIZE(fields), self->n_fields);
        return -1;
    }
    int rc = 0;
    for (size_t f = 0; rc == 0 && f < self->n_fields; f++) {
        unsigned char *dst = slot + self->offsets[f] + i * self->out_bytes[f];
        PyObject *value = PyTuple_GET_ITEM(fields, (Py_ssize_t)f);
        if (f == 0 && self->pipeline != NULL) {
            rc = store_field(self, f, value, self->scratch_input);
            rc = rc != 0 ? rc : pipe_sample(self, index, seed, dst);
        } else {
            rc = store_field(self, f, value, dst);
        }
    }
    return rc;
}

/* Fetches one sample and, unless the batch is already raw, stores its fields at position i
 * of the batch, field 0 through the pipeline if there is one (one image at a time: a small,
 * cache-resident scratch). Returns 0, 1 when the sample does not fit the fields (the batch
 * goes raw), or -1 with a Python error. */
static int store_sample(fl_fork_child *self, int64_t index, uint64_t seed, size_t i, unsigned char *slot,
                        int raw) {
    /* with a batch's first sample, the epoch seed: fetch seeds the generators once per batch */
    PyObject *sample = i == 0 ? PyObject_CallFunction(self->fetch, "LK", (long long)index, (unsigned long long)seed)
                              : PyObject_CallFunction(self->fetch, "L", (long long)index);
    if (sample == NULL)
        return -1;
    if (raw || sample == Py_None) { /* fetch keeps the sample for finish(); None: it has another layout */
        int fits = raw || raw_allowed(self);
        Py_DECREF(sample);
        if (!fits)
            fl_raisef(NULL, FL_EXC_VALUE, "the sample is laid out unlike the first sample (other fields, keys "
                                              "or kinds of values): a Pipeline transform needs one layout");
        return fits ? (raw ? 0 : 1) : -1;
    }
    PyObject *fields = PyTuple_Check(sample) || PyList_Check(sample) ? PySequence_Tuple(sample)
                                                                      : PyTuple_Pack(1, sample);
    Py_DECREF(sample);
    if (fields == NULL)
        return -1;
    int rc = store_fields(self, fields, index, seed, i, slot);
    Py_DECREF(fields);
    return rc;
}

/* Lets go of the bytes the last batch sent after its result (they have been written). */
static void release_sending(fl_fork_child *self) {
    if (self->sending == NULL)
        return;
    PyBuffer_Release(&self->sending_view);
    Py_CLEAR(self->sending);
}

/* finish(raw)'s bytes into the slot's object area, or as the batch's extra bytes when they do
 * not fit (kept until the next fill). Returns 0, or -1 with a Python error. */
static int write_objects(fl_fork_child *self, int raw, unsigned char *slot, fl_proc_extra *extra) {
    PyObject *blob = PyObject_CallFunction(self->finish, "i", raw);
    if (blob == NULL)
        return -1;
    uint64_t len = 0;
    if (blob != Py_None) {
        if (PyObject_GetBuffer(blob, &self->sending_view, PyBUF_SIMPLE) < 0) {
            Py_DECREF(blob);
            return -1;
        }
        len = (uint64_t)self->sending_view.len;
        if (len <= self->objects_capacity) {
            memcpy(slot + self->objects_offset + sizeof len, self->sending_view.buf, (size_t)len);
            PyBuffer_Release(&self->sending_view);
        } else {
            self->sending = Py_NewRef(blob);
            *extra = (fl_proc_extra){self->sending_view.buf, (size_t)len};
            len = FL_OBJECTS_AFTER;
        }
    }
    Py_DECREF(blob);
    memcpy(slot + self->objects_offset, &len, sizeof len);
    return 0;
}

int fl_fork_child_fill(void *ctx, int worker, uint64_t seed, const int64_t *ids, size_t count,
                       unsigned char *slot, fl_proc_extra *extra, int64_t *index, char *error,
                       size_t error_len) {
    fl_fork_child *self = ctx;
    (void)worker;
    release_sending(self);
    if (self->pipeline != NULL && self->scratch_input == NULL) { /* once per worker */
        self->scratch_input = PyMem_RawMalloc(self->in_bytes[0] + 1);
        self->scratch_pipeline = PyMem_RawMalloc(self->scratch_per_image + 1);
        if (self->scratch_input == NULL || self->scratch_pipeline == NULL) {
            snprintf(error, error_len, "builtins.MemoryError\x1eno memory for the pipeline's scratch\x1e");
            return 1;
        }
    }
    int raw = 0;
    for (size_t i = 0; i < count; i++) {
        fl_procpool_exit_if_orphaned(); /* the main process died: end now, not after the batch */
        int rc = store_sample(self, ids[i], seed, i, slot, raw);
        if (rc < 0) {
            *index = ids[i];
            describe_exception(error, error_len);
            return 1;
        }
        raw |= rc;
    }
    if (self->finish != NULL && write_objects(self, raw, slot, extra) < 0) {
        *index = -1; /* the message names the sample */
        describe_exception(error, error_len);
        return 1;
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
    fl_fork_child *self = ctx;
    self->froze = call_gc("get_freeze_count") == 0 && call_gc("freeze") == 0;
    PyOS_BeforeFork();
}

static void after_fork_parent(void *ctx) {
    fl_fork_child *self = ctx;
    PyOS_AfterFork_Parent();
    if (self->froze) /* the parent collects its objects as before; the workers keep them frozen */
        call_gc("unfreeze");
    self->froze = 0;
}

static void after_fork_child(void *ctx, int worker) {
    fl_fork_child *self = ctx;
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

fl_proc_hooks fl_fork_child_hooks(fl_fork_child *child) {
    return (fl_proc_hooks){before_fork, after_fork_parent, after_fork_child, child};
}

void fl_fork_child_free(fl_fork_child *child) {
    release_sending(child);
    PyMem_RawFree(child->scratch_input);
    PyMem_RawFree(child->scratch_pipeline);
    child->scratch_input = child->scratch_pipeline = NULL;
}
