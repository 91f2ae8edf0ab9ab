/* py_arrays.c - checking array arguments once, at the boundary, with messages that name
 * the argument, and making or checking `out=` arrays. */
#include <sys/random.h>

#include "fl_module.h"
#include "fl_numpy.h"

PyObject *fl_check_array(PyObject *obj, const char *arg) {
    if (!PyArray_Check(obj)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'%s' must be a numpy.ndarray, not %.200s", arg,
                  Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *array = (PyArrayObject *)obj;
    PyArray_Descr *descr = PyArray_DESCR(array);
    if (PyDataType_FLAGCHK(descr, NPY_ITEM_REFCOUNT)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'%s' must hold numbers, not Python objects (dtype %R)", arg,
                  (PyObject *)descr);
        return NULL;
    }
    if (!PyArray_ISNOTSWAPPED(array)) {
        fl_raisef(NULL, FL_EXC_TYPE,
                  "'%s' has non-native byte order (dtype %R); convert it with "
                  "x.astype(x.dtype.newbyteorder('='))",
                  arg, (PyObject *)descr);
        return NULL;
    }
    if (!PyArray_IS_C_CONTIGUOUS(array)) {
        fl_raisef(NULL, FL_EXC_VALUE,
                  "'%s' must be C-contiguous (a transposed or sliced view is not); "
                  "pass numpy.ascontiguousarray(%s)",
                  arg, arg);
        return NULL;
    }
    if (!PyArray_ISALIGNED(array)) {
        fl_raisef(NULL, FL_EXC_VALUE, "'%s' must be aligned to its dtype", arg);
        return NULL;
    }
    return obj;
}

int fl_dtype_from_descr(PyObject *descr_obj, const char *arg, fl_dtype *out) {
    PyArray_Descr *descr = (PyArray_Descr *)descr_obj;
    /* by kind and size, so aliases (numpy.longlong next to numpy.int64) map alike */
    const char kind = descr->kind;
    const npy_intp size = PyDataType_ELSIZE(descr);
    for (int dtype = 0; dtype < FL_DTYPE_COUNT; dtype++) {
        if (PyDataType_ISNOTSWAPPED(descr) && kind == fl_dtype_kind((fl_dtype)dtype) &&
            (size_t)size == fl_dtype_size((fl_dtype)dtype)) {
            *out = (fl_dtype)dtype;
            return 0;
        }
    }
    fl_raisef(NULL, FL_EXC_TYPE,
              "'%s' has dtype %R; supported: uint8, int8, uint16, int16, uint32, int32, "
              "uint64, int64, float32, float64 (native byte order)",
              arg, descr_obj);
    return -1;
}

int fl_dtype_of(PyObject *array, const char *arg, fl_dtype *out) {
    return fl_dtype_from_descr((PyObject *)PyArray_DESCR((PyArrayObject *)array), arg, out);
}

int fl_dtype_to_numpy(fl_dtype dtype) {
    static const int numpy_types[FL_DTYPE_COUNT] = {
        [FL_UINT8] = NPY_UINT8,     [FL_INT8] = NPY_INT8,     [FL_UINT16] = NPY_UINT16,
        [FL_INT16] = NPY_INT16,     [FL_UINT32] = NPY_UINT32, [FL_INT32] = NPY_INT32,
        [FL_UINT64] = NPY_UINT64,   [FL_INT64] = NPY_INT64,   [FL_FLOAT32] = NPY_FLOAT32,
        [FL_FLOAT64] = NPY_FLOAT64,
    };
    return numpy_types[dtype];
}

PyObject *fl_shape_repr(PyObject *array) {
    PyObject *shape = PyObject_GetAttrString(array, "shape");
    if (shape == NULL)
        return NULL;
    PyObject *text = PyObject_Repr(shape);
    Py_DECREF(shape);
    return text;
}

static int arrays_overlap(PyArrayObject *a, PyArrayObject *b) {
    const char *a_begin = PyArray_BYTES(a), *b_begin = PyArray_BYTES(b);
    const char *a_end = a_begin + PyArray_NBYTES(a), *b_end = b_begin + PyArray_NBYTES(b);
    return PyArray_NBYTES(a) > 0 && PyArray_NBYTES(b) > 0 && a_begin < b_end && b_begin < a_end;
}

int fl_arrays_overlap(PyObject *a, PyObject *b) {
    return arrays_overlap((PyArrayObject *)a, (PyArrayObject *)b);
}

static int shape_matches(PyArrayObject *array, int ndim, const Py_ssize_t *shape) {
    if (PyArray_NDIM(array) != ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (PyArray_DIM(array, i) != shape[i])
            return 0;
    return 1;
}

static PyObject *shape_tuple(int ndim, const Py_ssize_t *shape) {
    PyObject *tuple = PyTuple_New(ndim);
    for (int i = 0; tuple != NULL && i < ndim; i++) {
        PyObject *dim = PyLong_FromSsize_t(shape[i]);
        if (dim == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, i, dim);
    }
    return tuple;
}

/* Checks a caller-supplied `out`; returns 0 or -1 with an exception naming 'out'. */
static int check_out(PyObject *out_obj, int ndim, const Py_ssize_t *shape, PyArray_Descr *descr,
                     PyObject *input, int may_alias) {
    if (fl_check_array(out_obj, "out") == NULL)
        return -1;
    PyArrayObject *out = (PyArrayObject *)out_obj;
    if (!PyArray_EquivTypes(PyArray_DESCR(out), descr)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'out' must have dtype %R, not %R", (PyObject *)descr,
                  (PyObject *)PyArray_DESCR(out));
        return -1;
    }
    if (!shape_matches(out, ndim, shape)) {
        PyObject *want = shape_tuple(ndim, shape), *got = fl_shape_repr(out_obj);
        if (want != NULL && got != NULL)
            fl_raisef(NULL, FL_EXC_VALUE, "'out' must have shape %R, not %U", want, got);
        Py_XDECREF(want);
        Py_XDECREF(got);
        return -1;
    }
    if (!PyArray_ISWRITEABLE(out)) {
        fl_raisef(NULL, FL_EXC_VALUE, "'out' is read-only");
        return -1;
    }
    if (input != NULL && arrays_overlap(out, (PyArrayObject *)input) &&
        !(may_alias && PyArray_BYTES(out) == PyArray_BYTES((PyArrayObject *)input))) {
        fl_raisef(NULL, FL_EXC_VALUE, "%s", may_alias
                                              ? "'out' must be the input itself or not overlap it"
                                              : "'out' must not overlap the input");
        return -1;
    }
    return 0;
}

PyObject *fl_output_array(PyObject *out_obj, int ndim, const Py_ssize_t *shape, PyObject *descr_obj,
                          PyObject *input, int may_alias) {
    PyArray_Descr *descr = (PyArray_Descr *)descr_obj;
    if (out_obj == NULL || out_obj == Py_None)
        return PyArray_Empty(ndim, (npy_intp *)shape, descr, 0); /* steals descr */
    int rc = check_out(out_obj, ndim, shape, descr, input, may_alias);
    Py_DECREF(descr);
    if (rc < 0)
        return NULL;
    return Py_NewRef(out_obj);
}

int fl_check_threads(int threads) {
    if (threads >= 1)
        return 0;
    fl_raisef(NULL, FL_EXC_VALUE, "'num_threads' must be >= 1, not %d", threads);
    return -1;
}

int fl_parse_seed(PyObject *seed, uint64_t *out) {
    if (seed == NULL || seed == Py_None) {
        if (getrandom(out, sizeof *out, 0) != (ssize_t)sizeof *out) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        return 0;
    }
    if (!PyLong_Check(seed)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'seed' must be an int or None, not %.200s",
                  Py_TYPE(seed)->tp_name);
        return -1;
    }
    *out = (uint64_t)PyLong_AsUnsignedLongLongMask(seed);
    return PyErr_Occurred() ? -1 : 0;
}
