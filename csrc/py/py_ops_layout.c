/* py_ops_layout.c - fastloop.ops.crop, hflip and stack: the argument checks around
 * fl_crop(), fl_hflip() and fl_stack(). These move elements without reading them as
 * numbers, so any fixed-size dtype works. */
#include "py_ops.h"

#include "base/fl_error.h"
#include "fl_numpy.h"

/* Parses `size`: an int (square) or an (h, w) pair. */
static int parse_crop_size(PyObject *size, size_t *out_h, size_t *out_w) {
    Py_ssize_t h = -1, w = -1;
    if (PyLong_Check(size))
        h = w = PyLong_AsSsize_t(size);
    else
        (void)PyArg_ParseTuple(size, "nn;'size' must be an int or an (h, w) pair", &h, &w);
    if (PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            fl_raisef(NULL, FL_EXC_OVERFLOW, "crop 'size' %R is too large", size);
        }
        return -1;
    }
    if (h <= 0 || w <= 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'size' must be positive, not (%zd, %zd)", h, w);
        return -1;
    }
    *out_h = (size_t)h;
    *out_w = (size_t)w;
    return 0;
}

/* Fills tops/lefts from `offsets`: "random", "center", a (top, left) pair for every image,
 * or an (N, 2) integer array with one pair per image. */
static int crop_offsets(PyObject *offsets, uint64_t seed, fl_images dims, size_t out_h,
                        size_t out_w, int64_t *tops, int64_t *lefts) {
    if (offsets == Py_None)
        offsets = NULL;
    if (offsets == NULL || PyUnicode_Check(offsets)) {
        if (offsets == NULL || PyUnicode_CompareWithASCIIString(offsets, "random") == 0) {
            fl_crop_offsets_random(seed, NULL, dims.n, dims.h, dims.w, out_h, out_w, tops, lefts);
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(offsets, "center") == 0) {
            fl_crop_offsets_center(dims.n, dims.h, dims.w, out_h, out_w, tops, lefts);
            return 0;
        }
        fl_raisef(NULL, FL_EXC_VALUE,
                  "'offsets' must be 'random', 'center', (top, left) or an (N, 2) array, "
                  "not %R",
                  offsets);
        return -1;
    }
    PyObject *array = PyArray_FROM_O(offsets);
    if (array == NULL)
        return -1;
    PyArrayObject *a = (PyArrayObject *)array;
    int ok =
        PyArray_ISINTEGER(a) &&
        ((PyArray_NDIM(a) == 1 && PyArray_DIM(a, 0) == 2) ||
         (PyArray_NDIM(a) == 2 && (size_t)PyArray_DIM(a, 0) == dims.n && PyArray_DIM(a, 1) == 2));
    if (!ok) {
        fl_raisef(NULL, FL_EXC_VALUE,
                  "'offsets' must be integers shaped (2,) for (top, left) or (%zu, 2) for "
                  "one pair per image",
                  dims.n);
        Py_DECREF(array);
        return -1;
    }
    PyObject *pairs = PyArray_FROMANY(array, NPY_INT64, 1, 2, NPY_ARRAY_CARRAY);
    Py_DECREF(array);
    if (pairs == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) { /* uint64 past int64's range */
        PyErr_Clear();
        fl_raisef(NULL, FL_EXC_VALUE, "'offsets' must be integers within int64's range");
    }
    if (pairs == NULL)
        return -1;
    const int64_t *values = PyArray_DATA((PyArrayObject *)pairs);
    int per_image = PyArray_NDIM((PyArrayObject *)pairs) == 2;
    for (size_t i = 0; i < dims.n; i++) {
        tops[i] = values[per_image ? 2 * i : 0];
        lefts[i] = values[per_image ? 2 * i + 1 : 1];
    }
    Py_DECREF(pairs);
    return 0;
}

PyObject *fl_py_crop(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache crop_args = FL_ARG_CACHE("crop");
    PyObject *x, *size, *offsets = NULL, *seed_obj = Py_None, *out_obj = Py_None;
    const char *layout_text = "HWC";
    int threads = 1;
    fl_layout layout;
    fl_images dims;
    size_t out_h, out_w;
    uint64_t seed;
    if (fl_parse_args_dict(&crop_args, args, kwargs, FL_ARG("x", OBJECT, &x),
                           FL_ARG("size", OBJECT, &size), FL_ARG("|offsets", OBJECT, &offsets),
                           FL_ARG("seed", OBJECT, &seed_obj), FL_ARG("layout", STR, &layout_text),
                           FL_ARG("out", OBJECT, &out_obj),
                           FL_ARG("num_threads", INT, &threads)) < 0)
        return NULL;
    if (fl_check_threads(threads) < 0 || fl_parse_layout(layout_text, "layout", &layout) < 0 ||
        fl_check_array(x, "x") == NULL || fl_image_dims(x, layout, &dims) < 0 ||
        parse_crop_size(size, &out_h, &out_w) < 0 || fl_parse_seed(seed_obj, &seed) < 0)
        return NULL;
    if (out_h > dims.h || out_w > dims.w) {
        fl_raisef(NULL, FL_EXC_VALUE, "crop 'size' (%zu, %zu) is larger than the %zux%zu images",
                  out_h, out_w, dims.h, dims.w);
        return NULL;
    }
    int64_t *tops = PyMem_Malloc(2 * (dims.n ? dims.n : 1) * sizeof *tops);
    if (tops == NULL)
        return PyErr_NoMemory();
    int64_t *lefts = tops + dims.n;
    PyObject *out = NULL;
    if (crop_offsets(offsets, seed, dims, out_h, out_w, tops, lefts) < 0)
        goto done;
    fl_images out_dims = {dims.n, out_h, out_w, dims.c};
    Py_ssize_t shape[4];
    fl_image_shape(x, layout, out_dims, shape);
    PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)x);
    Py_INCREF(descr);
    out =
        fl_output_array(out_obj, PyArray_NDIM((PyArrayObject *)x), shape, (PyObject *)descr, x, 0);
    if (out == NULL)
        goto done;
    FL_RUN_KERNEL(module, threads, PyArray_NBYTES((PyArrayObject *)out), "crop", out,
                  fl_crop(exec, PyArray_DATA((PyArrayObject *)x),
                          PyArray_DATA((PyArrayObject *)out),
                          (size_t)PyArray_ITEMSIZE((PyArrayObject *)x), layout, dims, out_h, out_w,
                          tops, lefts));
done:
    PyMem_Free(tops);
    return out;
}

/* Fills flip[] from an explicit per-image sequence of booleans. */
static int explicit_flips(PyObject *flip_obj, size_t n, uint8_t *flip) {
    PyObject *flags =
        PyArray_FROMANY(flip_obj, NPY_BOOL, 1, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
    if (flags == NULL)
        return -1;
    int rc = 0;
    if ((size_t)PyArray_SIZE((PyArrayObject *)flags) != n) {
        fl_raisef(NULL, FL_EXC_VALUE, "'flip' has %zd values but there are %zu images",
                  (Py_ssize_t)PyArray_SIZE((PyArrayObject *)flags), n);
        rc = -1;
    } else {
        memcpy(flip, PyArray_DATA((PyArrayObject *)flags), n);
    }
    Py_DECREF(flags);
    return rc;
}

PyObject *fl_py_hflip(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache hflip_args = FL_ARG_CACHE("hflip");
    PyObject *x, *seed_obj = Py_None, *flip_obj = Py_None, *out_obj = Py_None;
    const char *layout_text = "HWC";
    double p = 0.5;
    int threads = 1;
    fl_layout layout;
    fl_images dims;
    uint64_t seed;
    if (fl_parse_args_dict(&hflip_args, args, kwargs, FL_ARG("x", OBJECT, &x),
                           FL_ARG("|p", DOUBLE, &p), FL_ARG("seed", OBJECT, &seed_obj),
                           FL_ARG("flip", OBJECT, &flip_obj), FL_ARG("layout", STR, &layout_text),
                           FL_ARG("out", OBJECT, &out_obj),
                           FL_ARG("num_threads", INT, &threads)) < 0)
        return NULL;
    if (!(p >= 0.0 && p <= 1.0)) {
        char message[80]; /* PyErr_Format has no %g: 3.12+ raise SystemError for it */
        snprintf(message, sizeof message, "'p' must be a probability in [0, 1], not %g", p);
        fl_raisef(NULL, FL_EXC_VALUE, "%s", message);
        return NULL;
    }
    if (fl_check_threads(threads) < 0 || fl_parse_layout(layout_text, "layout", &layout) < 0 ||
        fl_check_array(x, "x") == NULL || fl_image_dims(x, layout, &dims) < 0 ||
        fl_parse_seed(seed_obj, &seed) < 0)
        return NULL;
    uint8_t *flip = PyMem_Malloc(dims.n ? dims.n : 1);
    if (flip == NULL)
        return PyErr_NoMemory();
    PyObject *out = NULL;
    if (flip_obj != Py_None) {
        if (explicit_flips(flip_obj, dims.n, flip) < 0)
            goto done;
    } else {
        fl_hflip_draw(seed, NULL, p, dims.n, flip);
    }
    PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)x);
    Py_INCREF(descr);
    out = fl_output_array(out_obj, PyArray_NDIM((PyArrayObject *)x),
                          PyArray_DIMS((PyArrayObject *)x), (PyObject *)descr, x, 1);
    if (out == NULL)
        goto done;
    FL_RUN_KERNEL(
        module, threads, PyArray_NBYTES((PyArrayObject *)x), "hflip", out,
        (fl_hflip(exec, PyArray_DATA((PyArrayObject *)x), PyArray_DATA((PyArrayObject *)out),
                  (size_t)PyArray_ITEMSIZE((PyArrayObject *)x), layout, dims, flip),
         FL_OK));
done:
    PyMem_Free(flip);
    return out;
}

/* Checks that arrays[i] is usable and matches arrays[0]; fills srcs[i]. */
static int check_stack_item(PyObject *item, Py_ssize_t i, PyArrayObject *first, const void **srcs) {
    char name[48];
    snprintf(name, sizeof name, "arrays[%zd]", i);
    if (fl_check_array(item, name) == NULL)
        return -1;
    PyArrayObject *array = (PyArrayObject *)item;
    if (first != NULL && !PyArray_EquivTypes(PyArray_DESCR(array), PyArray_DESCR(first))) {
        fl_raisef(NULL, FL_EXC_TYPE, "'%s' has dtype %R but arrays[0] has %R", name,
                  (PyObject *)PyArray_DESCR(array), (PyObject *)PyArray_DESCR(first));
        return -1;
    }
    if (first != NULL && !PyArray_SAMESHAPE(array, first)) {
        PyObject *got = fl_shape_repr(item), *want = fl_shape_repr((PyObject *)first);
        if (got != NULL && want != NULL)
            fl_raisef(NULL, FL_EXC_VALUE, "'%s' has shape %U but arrays[0] has %U", name, got,
                      want);
        Py_XDECREF(got);
        Py_XDECREF(want);
        return -1;
    }
    srcs[i] = PyArray_DATA(array);
    return 0;
}

PyObject *fl_py_stack(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache stack_args = FL_ARG_CACHE("stack");
    PyObject *arrays_obj, *out_obj = Py_None;
    int threads = 1;
    if (fl_parse_args_dict(&stack_args, args, kwargs, FL_ARG("arrays", OBJECT, &arrays_obj),
                           FL_ARG("|out", OBJECT, &out_obj),
                           FL_ARG("num_threads", INT, &threads)) < 0 ||
        fl_check_threads(threads) < 0)
        return NULL;
    /* A tuple of our own keeps every array alive while the GIL is released, even if the
     * caller's list is changed by another thread meanwhile. */
    PyObject *arrays = PySequence_Check(arrays_obj) ? PySequence_Tuple(arrays_obj) : NULL;
    if (arrays == NULL) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            fl_raisef(NULL, FL_EXC_TYPE, "'arrays' must be a sequence of arrays, not %.200s",
                      Py_TYPE(arrays_obj)->tp_name);
        }
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(arrays);
    PyObject **items = PySequence_Fast_ITEMS(arrays);
    PyObject *out = NULL;
    const void **srcs = NULL;
    if (count == 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'arrays' is empty: need at least one array");
        goto done;
    }
    srcs = PyMem_Malloc((size_t)count * sizeof *srcs);
    if (srcs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (check_stack_item(items[i], i, i ? (PyArrayObject *)items[0] : NULL, srcs) < 0)
            goto done;
    PyArrayObject *first = (PyArrayObject *)items[0];
    Py_ssize_t shape[NPY_MAXDIMS + 1];
    int ndim = PyArray_NDIM(first) + 1;
    if (ndim > NPY_MAXDIMS) {
        fl_raisef(NULL, FL_EXC_VALUE, "stacking would exceed NumPy's dimension limit");
        goto done;
    }
    shape[0] = count;
    for (int d = 1; d < ndim; d++)
        shape[d] = PyArray_DIM(first, d - 1);
    Py_INCREF(PyArray_DESCR(first));
    out = fl_output_array(out_obj, ndim, shape, (PyObject *)PyArray_DESCR(first), NULL, 0);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        if (fl_arrays_overlap(out, items[i])) {
            fl_raisef(NULL, FL_EXC_VALUE, "'out' overlaps arrays[%zd]", i);
            Py_CLEAR(out);
        }
    }
    if (out == NULL)
        goto done;
    size_t nbytes = (size_t)PyArray_NBYTES(first);
    FL_RUN_KERNEL(
        module, threads, nbytes * (size_t)count, "stack", out,
        (fl_stack(exec, srcs, (size_t)count, nbytes, PyArray_DATA((PyArrayObject *)out)), FL_OK));
done:
    PyMem_Free(srcs);
    Py_DECREF(arrays);
    return out;
}
