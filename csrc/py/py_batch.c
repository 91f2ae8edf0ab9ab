/* py_batch.c - slot leases and the views (or copies) handed out as batches. */
#include "py_batch.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "base/fl_size.h"
#include "data/fl_batch_source.h"

typedef struct {
    PyObject_HEAD
    PyObject *owner;
    void *core;
    fl_slot_release_fn release;
    int slot;
} LeaseObject;

static void lease_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    LeaseObject *lease = (LeaseObject *)self;
    lease->release(lease->core, lease->slot);
    Py_DECREF(lease->owner);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyType_Slot lease_slots[] = {
    {Py_tp_doc, "Keeps one loader slot lent while batch views of it exist."},
    {Py_tp_dealloc, lease_dealloc},
    {0, NULL},
};

static PyType_Spec lease_spec = {
    .name = "fastloop._core._SlotLease",
    .basicsize = sizeof(LeaseObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = lease_slots,
};

static Py_ssize_t sample_too_large(PyObject *descr, PyObject *shape) {
    fl_error_clear();
    fl_raisef(NULL, FL_EXC_OVERFLOW, "a sample of shape %R and dtype %R is too large: more bytes than a size holds",
              shape, descr);
    return -1;
}

Py_ssize_t fl_sample_nbytes(PyObject *descr, PyObject *shape) {
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim >= NPY_MAXDIMS) { /* a batch adds a dimension */
        fl_raisef(NULL, FL_EXC_VALUE, "a sample of shape %R has %zd dimensions: a batch of them would have %zd, "
                  "more than NumPy's %d", shape, ndim, ndim + 1, NPY_MAXDIMS);
        return -1;
    }
    size_t n = (size_t)PyDataType_ELSIZE((PyArray_Descr *)descr);
    int empty = 0;
    for (Py_ssize_t d = 0; d < ndim; d++) {
        Py_ssize_t dim = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (dim == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            return sample_too_large(descr, shape);
        }
        if (dim < 0) {
            fl_raisef(NULL, FL_EXC_VALUE, "a sample of shape %R has a negative dimension", shape);
            return -1;
        }
        empty |= dim == 0; /* NumPy's rule: the other dimensions must still fit */
        if (dim > 0 && fl_size_mul(n, (size_t)dim, "sample bytes", &n) != FL_OK)
            return sample_too_large(descr, shape);
    }
    return empty ? 0 : (Py_ssize_t)n;
}

int fl_slot_layout(const size_t *sample_bytes, size_t n_fields, size_t batch_size, size_t *offsets,
                   size_t *slot_bytes) {
    int rc = fl_batch_layout(sample_bytes, n_fields, batch_size, offsets, slot_bytes);
    if (rc != FL_OK)
        fl_raise_with(NULL, rc, &(fl_raise_opts){.what = "Loader"});
    return rc == FL_OK ? 0 : -1;
}

/* A view of field f (or a copy, with lease NULL). */
static PyObject *field_array(const fl_slot_batch *b, size_t f, PyObject *lease) {
    PyObject *sample_shape = PyTuple_GET_ITEM(b->shapes, (Py_ssize_t)f);
    Py_ssize_t ndim = PyTuple_GET_SIZE(sample_shape) + 1;
    npy_intp dims[NPY_MAXDIMS];
    if (ndim > NPY_MAXDIMS) /* refused when the loader was made (fl_sample_nbytes) */
        return fl_raisef(NULL, FL_EXC_VALUE, "field %zu: a batch of %zd dimensions", f, ndim);
    dims[0] = (npy_intp)b->count;
    size_t span = b->count; /* NumPy's size check (non-zero dimensions): the sample's passed it, the batch's may not */
    for (Py_ssize_t d = 1; d < ndim; d++) {
        dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(sample_shape, d - 1));
        if (dims[d] > 0 && fl_size_mul(span ? span : 1, (size_t)dims[d], "a batch", &span) != FL_OK) {
            fl_error_clear();
            return fl_raisef(NULL, FL_EXC_VALUE, "field %zu: a batch of %zu samples of shape %R is larger than NumPy "
                             "allows", f, b->count, sample_shape);
        }
    }
    PyArray_Descr *descr = (PyArray_Descr *)PyTuple_GET_ITEM(b->descrs, (Py_ssize_t)f);
    Py_INCREF(descr);
    PyObject *view = PyArray_NewFromDescr(&PyArray_Type, descr, (int)ndim, dims, NULL,
                                          b->data + b->offsets[f], NPY_ARRAY_CARRAY, NULL);
    if (view == NULL)
        return NULL;
    if (lease == NULL) {
        PyObject *copy = PyArray_NewCopy((PyArrayObject *)view, NPY_CORDER);
        Py_DECREF(view);
        return copy;
    }
    Py_INCREF(lease);
    if (PyArray_SetBaseObject((PyArrayObject *)view, lease) < 0) { /* steals the reference */
        Py_DECREF(view);
        return NULL;
    }
    return view;
}

PyObject *fl_batch_from_slot(fl_module_state *state, const fl_slot_batch *b) {
    PyObject *lease = NULL;
    if (!b->copy_out) {
        lease = (PyObject *)PyObject_New(LeaseObject, state->lease_type);
        if (lease == NULL) {
            b->release(b->core, b->slot);
            return NULL;
        }
        LeaseObject *l = (LeaseObject *)lease;
        l->owner = Py_NewRef(b->owner);
        l->core = b->core;
        l->release = b->release;
        l->slot = b->slot;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(b->descrs);
    PyObject *batch = PyTuple_New(n);
    for (Py_ssize_t f = 0; batch != NULL && f < n; f++) {
        PyObject *array = field_array(b, (size_t)f, lease);
        if (array == NULL)
            Py_CLEAR(batch);
        else
            PyTuple_SET_ITEM(batch, f, array);
    }
    if (lease != NULL)
        Py_DECREF(lease); /* the views hold it now; with none left the slot goes back */
    else
        b->release(b->core, b->slot);
    return batch;
}

int fl_batch_module_init(PyObject *module, fl_module_state *state) {
    state->lease_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &lease_spec, NULL);
    if (state->lease_type == NULL)
        return -1;
    FL_DISALLOW_INSTANTIATION(state->lease_type);
    return PyModule_AddType(module, state->lease_type); /* for isinstance checks on batch.base */
}
