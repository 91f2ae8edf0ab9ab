/* py_sample_writer.c - a Python sample written straight into a batch slot (see
 * py_sample_writer.h): shared by the worker processes and the worker threads. */
#include "py_sample_writer.h"
#include "fl_numpy.h"

#include "base/fl_error.h"
#include "py_batch.h"
#include "py_pipeline.h"

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

/* A value that NumPy cannot make into the field's dtype: 1 (it travels whole, the error
 * cleared) when the batch can go raw, else -1 with the error. */
static int unconvertible(const fl_sample_writer *self) {
    if (self->raw_allowed && (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError) ||
                              PyErr_ExceptionMatches(PyExc_OverflowError))) {
        PyErr_Clear();
        return 1;
    }
    return -1;
}

/* The dtype NumPy gives the value on its own (a new reference: an array's or a NumPy
 * scalar's; bool, int, float and complex as np.asarray makes them), or NULL for a value of
 * no dtype (a list, a string), with no error set. */
static PyArray_Descr *value_descr(PyObject *value) {
    if (PyArray_Check(value)) {
        PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)value);
        Py_INCREF(descr);
        return descr;
    }
    if (PyArray_IsScalar(value, Generic)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(value);
        if (descr == NULL)
            PyErr_Clear();
        return descr;
    }
    int type = PyBool_Check(value) ? NPY_BOOL : PyLong_Check(value) ? NPY_INT64 : PyFloat_Check(value) ? NPY_DOUBLE
             : PyComplex_Check(value) ? NPY_CDOUBLE : -1;
    return type >= 0 ? PyArray_DescrFromType(type) : NULL;
}

/* A value of another dtype than field f's slot: 1 when the batch can go raw (collated from
 * its samples, promoted as default_collate does), 0 when it casts safely (the slot then
 * holds the same values: a Pipeline or device batch keeps the first sample's dtypes), else
 * -1 with a TypeError naming the field and both dtypes (next() adds the sample). */
static int other_dtype(const fl_sample_writer *self, size_t f, PyObject *value, PyArray_Descr *have,
                       PyArray_Descr *want) {
    if (self->raw_allowed)
        return 1;
    if (have != NULL && PyArray_CanCastTypeTo(have, want, NPY_SAFE_CASTING))
        return 0;
    PyObject *got = have != NULL ? (PyObject *)have : (PyObject *)Py_TYPE(value);
    fl_raisef(NULL, FL_EXC_TYPE, "field %zu is %S, but the batch slots hold %S (the first sample's dtype), "
                                 "which it does not cast to without changing values: with a Pipeline transform "
                                 "or a device every sample needs the first sample's dtype (or one that casts "
                                 "to it safely); cast it in the dataset or a transform", f, got, (PyObject *)want);
    return -1;
}

/* Copies field f of one sample into dst, checking dtype and shape. Returns 0, 1 when the
 * value does not fit the field and the batch can go raw (another dtype or shape, a value
 * NumPy cannot make an array of), or -1 with an error. Nothing is ever wrapped or rounded:
 * a value of the slot's dtype is copied as it is (a dtype comparison per value), any other
 * makes its batch raw, or (no raw batches) is cast only where NumPy's "safe" rule allows. */
static int store_field(const fl_sample_writer *self, size_t f, PyObject *value, unsigned char *dst) {
    PyArray_Descr *descr = (PyArray_Descr *)PyTuple_GET_ITEM(self->in_descrs, (Py_ssize_t)f);
    PyArray_Descr *have = value_descr(value);
    if (have != descr && (have == NULL || !PyArray_EquivTypes(have, descr))) {
        int rc = other_dtype(self, f, value, have, descr);
        Py_XDECREF(have);
        if (rc != 0)
            return rc;
    } else {
        Py_DECREF(have);
    }
    Py_INCREF(descr);
    PyObject *array = PyArray_FromAny(value, descr, 0, 0, NPY_ARRAY_CARRAY, NULL);
    if (array == NULL)
        return unconvertible(self);
    PyObject *want = PyTuple_GET_ITEM(self->in_shapes, (Py_ssize_t)f);
    if (!same_shape((PyArrayObject *)array, want)) { /* per sample: no shape tuple made unless it differs */
        PyObject *got = self->raw_allowed ? NULL : PyObject_GetAttrString(array, "shape");
        Py_DECREF(array);
        if (self->raw_allowed)
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

/* Runs the pipeline on the sample in the scratch's input into dst; a Python error if it fails. */
static int pipe_sample(const fl_sample_writer *self, fl_sample_scratch *scratch, int64_t index, uint64_t seed,
                       unsigned char *dst) {
    fl_images one = self->image;
    one.n = 1;
    int rc = fl_pipeline_run(self->pipeline, (fl_exec){NULL, 1}, scratch->input, one, self->image_dtype, dst,
                             scratch->pipeline, seed, &index);
    if (rc == FL_OK)
        return 0;
    fl_raise_with(self->state, rc, &(fl_raise_opts){.what = "Pipeline", .in = FL_IN_DATA});
    return -1;
}

/* Stores the fields of a fetched sample at position i of the batch (see fl_sample_store). */
static int store_fields(const fl_sample_writer *self, fl_sample_scratch *scratch, PyObject *fields, int64_t index,
                        uint64_t seed, size_t i, unsigned char *slot) {
    if ((size_t)PyTuple_GET_SIZE(fields) != self->n_fields) {
        if (self->raw_allowed)
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
            rc = store_field(self, f, value, scratch->input);
            rc = rc != 0 ? rc : pipe_sample(self, scratch, index, seed, dst);
        } else {
            rc = store_field(self, f, value, dst);
        }
    }
    return rc;
}

int fl_sample_store(const fl_sample_writer *writer, fl_sample_scratch *scratch, PyObject *fetch, int64_t index,
                    uint64_t seed, size_t i, unsigned char *slot, int raw) {
    /* with a batch's first sample, the epoch seed: a batch starts */
    PyObject *sample = i == 0 ? PyObject_CallFunction(fetch, "LK", (long long)index, (unsigned long long)seed)
                              : PyObject_CallFunction(fetch, "L", (long long)index);
    if (sample == NULL)
        return -1;
    if (raw || sample == Py_None) { /* fetch keeps the sample for finish(); None: it has another layout */
        int fits = raw || writer->raw_allowed;
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
    int rc = store_fields(writer, scratch, fields, index, seed, i, slot);
    Py_DECREF(fields);
    return rc;
}

int fl_sample_scratch_ready(const fl_sample_writer *writer, fl_sample_scratch *scratch) {
    if (writer->pipeline == NULL || scratch->input != NULL)
        return 0;
    scratch->input = PyMem_RawMalloc(writer->in_bytes[0] + 1);
    scratch->pipeline = PyMem_RawMalloc(writer->scratch_per_image + 1);
    if (scratch->input != NULL && scratch->pipeline != NULL)
        return 0;
    fl_sample_scratch_free(scratch);
    PyErr_SetString(PyExc_MemoryError, "no memory for the pipeline's scratch");
    return -1;
}

void fl_sample_scratch_free(fl_sample_scratch *scratch) {
    PyMem_RawFree(scratch->input);
    PyMem_RawFree(scratch->pipeline);
    scratch->input = scratch->pipeline = NULL;
}

/* ---- construction ---- */

int fl_sample_writer_plan(fl_sample_writer *writer, PyObject *pipeline_obj, PyObject *out_descrs,
                          PyObject *out_shapes) {
    if (fl_pipeline_input_of(pipeline_obj, PyTuple_GET_ITEM(writer->in_descrs, 0),
                             PyTuple_GET_ITEM(writer->in_shapes, 0), "sample[0]", &writer->image,
                             &writer->image_dtype) < 0)
        return -1;
    fl_images out;
    fl_dtype dtype;
    fl_layout layout;
    if (fl_pipeline_plan(writer->pipeline, writer->image, writer->image_dtype, &out, &dtype, &layout,
                         &writer->scratch_per_image) != FL_OK) {
        fl_raise_with(writer->state, FL_EINVAL, &(fl_raise_opts){.what = "Pipeline", .in = FL_IN_DATA});
        return -1;
    }
    return fl_pipeline_set_output(out, dtype, layout, out_descrs, out_shapes);
}

int fl_sample_writer_fields(fl_sample_writer *writer, PyObject *fields, PyObject *descrs, PyObject *shapes,
                            PyObject **descrs_out, PyObject **shapes_out) {
    *descrs_out = *shapes_out = NULL;
    writer->n_fields = (size_t)PyTuple_GET_SIZE(fields);
    if ((writer->n_fields == 0 && !writer->raw_allowed) || writer->n_fields > FL_SOURCE_MAX_FIELDS) {
        fl_raisef(NULL, FL_EXC_VALUE, "a sample has 1 to 64 fields (0 with finish)");
        return -1;
    }
    for (size_t f = 0; f < writer->n_fields; f++) {
        PyObject *descr_obj, *shape;
        PyArray_Descr *descr = NULL;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, (Py_ssize_t)f), "OO!", &descr_obj, &PyTuple_Type, &shape) ||
            !PyArray_DescrConverter(descr_obj, &descr))
            return -1;
        int appended = PyList_Append(descrs, (PyObject *)descr) == 0 && PyList_Append(shapes, shape) == 0;
        Py_ssize_t nbytes = appended ? fl_sample_nbytes((PyObject *)descr, shape) : -1;
        Py_DECREF(descr);
        if (nbytes < 0)
            return -1;
        writer->in_bytes[f] = (size_t)nbytes;
    }
    writer->in_descrs = *descrs_out = PySequence_Tuple(descrs);
    writer->in_shapes = *shapes_out = PySequence_Tuple(shapes);
    return *descrs_out != NULL && *shapes_out != NULL ? 0 : -1;
}

int fl_sample_writer_outputs(fl_sample_writer *writer, PyObject *descrs, PyObject *shapes) {
    for (size_t f = 0; f < writer->n_fields; f++) {
        Py_ssize_t nbytes = fl_sample_nbytes(PyList_GET_ITEM(descrs, (Py_ssize_t)f), PyList_GET_ITEM(shapes, (Py_ssize_t)f));
        if (nbytes < 0)
            return -1;
        writer->out_bytes[f] = (size_t)nbytes;
    }
    return 0;
}
