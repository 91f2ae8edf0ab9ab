/* py_ops_values.c - fastloop.ops.normalize, cast and divide_by_max: the argument checks
 * around fl_normalize(), fl_cast() and fl_divide_by_max(). */
#include "py_ops.h"

#include "base/fl_error.h"
#include "fl_numpy.h"

int fl_parse_layout(const char *text, const char *arg, fl_layout *out) {
    if (strcmp(text, "HWC") == 0 || strcmp(text, "CHW") == 0) {
        *out = text[0] == 'H' ? FL_HWC : FL_CHW;
        return 0;
    }
    fl_raisef(NULL, FL_EXC_VALUE, "'%s' must be 'HWC' or 'CHW', not '%s'", arg, text);
    return -1;
}

/* Parses normalize's "SRC->DST" or "SAME" layout. */
static int parse_layout_pair(const char *text, fl_layout *src, fl_layout *dst) {
    char source[4] = {0};
    const char *arrow = strstr(text, "->");
    if (arrow == NULL)
        return fl_parse_layout(text, "layout", src) < 0 ? -1 : (*dst = *src, 0);
    if (arrow - text == 3) {
        memcpy(source, text, 3);
        if ((strcmp(source, "HWC") == 0 || strcmp(source, "CHW") == 0) &&
            (strcmp(arrow + 2, "HWC") == 0 || strcmp(arrow + 2, "CHW") == 0)) {
            *src = source[0] == 'H' ? FL_HWC : FL_CHW;
            *dst = arrow[2] == 'H' ? FL_HWC : FL_CHW;
            return 0;
        }
    }
    fl_raisef(NULL, FL_EXC_VALUE,
              "'layout' must be 'HWC->CHW', 'CHW', 'HWC' or 'CHW->HWC', not '%s'", text);
    return -1;
}

int fl_image_dims(PyObject *x, fl_layout layout, fl_images *dims) {
    PyArrayObject *array = (PyArrayObject *)x;
    int ndim = PyArray_NDIM(array);
    if (ndim != 3 && ndim != 4) {
        PyObject *shape = fl_shape_repr(x);
        if (shape != NULL)
            fl_raisef(NULL, FL_EXC_VALUE, "'x' must be one image %s or a batch %s, not shape %U",
                      layout == FL_HWC ? "(H, W, C)" : "(C, H, W)",
                      layout == FL_HWC ? "(N, H, W, C)" : "(N, C, H, W)", shape);
        Py_XDECREF(shape);
        return -1;
    }
    const npy_intp *s = PyArray_DIMS(array) + (ndim - 3);
    dims->n = ndim == 4 ? (size_t)PyArray_DIM(array, 0) : 1;
    dims->h = (size_t)(layout == FL_HWC ? s[0] : s[1]);
    dims->w = (size_t)(layout == FL_HWC ? s[1] : s[2]);
    dims->c = (size_t)(layout == FL_HWC ? s[2] : s[0]);
    return 0;
}

void fl_image_shape(PyObject *x, fl_layout layout, fl_images dims, Py_ssize_t shape[4]) {
    int batched = PyArray_NDIM((PyArrayObject *)x) == 4;
    Py_ssize_t *s = shape + batched;
    shape[0] = (Py_ssize_t)dims.n;
    s[0] = (Py_ssize_t)(layout == FL_HWC ? dims.h : dims.c);
    s[1] = (Py_ssize_t)(layout == FL_HWC ? dims.w : dims.h);
    s[2] = (Py_ssize_t)(layout == FL_HWC ? dims.c : dims.w);
}

/* Converts mean or std to `channels` float32 values (one number is repeated). Returns a new
 * reference to a contiguous float32 array of that length, or NULL with ValueError. */
static PyObject *channel_values(PyObject *obj, const char *arg, size_t channels) {
    PyObject *values =
        PyArray_FROMANY(obj, NPY_FLOAT32, 0, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
    if (values == NULL) {
        fl_raisef(NULL, FL_EXC_VALUE, "'%s' must be a number or a sequence of %zu numbers", arg,
                  channels);
        return NULL;
    }
    npy_intp size = PyArray_SIZE((PyArrayObject *)values);
    if (size == 1 && channels != 1) {
        PyObject *repeated = PyArray_Zeros(1, (npy_intp[]){(npy_intp)channels},
                                           PyArray_DescrFromType(NPY_FLOAT32), 0);
        if (repeated != NULL) {
            float value = *(float *)PyArray_DATA((PyArrayObject *)values);
            for (size_t i = 0; i < channels; i++)
                ((float *)PyArray_DATA((PyArrayObject *)repeated))[i] = value;
        }
        Py_DECREF(values);
        return repeated;
    }
    if ((size_t)size != channels) {
        fl_raisef(NULL, FL_EXC_VALUE, "'%s' has %zd values but the images have %zu channels", arg,
                  (Py_ssize_t)size, channels);
        Py_DECREF(values);
        return NULL;
    }
    return values;
}

PyObject *fl_py_normalize(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache normalize_args = FL_ARG_CACHE("normalize");
    PyObject *x, *mean_obj, *std_obj, *out_obj = Py_None;
    const char *layout_text = "HWC->CHW";
    int threads = 1;
    fl_layout src_layout, dst_layout;
    fl_images dims;
    fl_dtype dtype;
    if (fl_parse_args_dict(&normalize_args, args, kwargs, FL_ARG("x", OBJECT, &x),
                           FL_ARG("mean", OBJECT, &mean_obj), FL_ARG("std", OBJECT, &std_obj),
                           FL_ARG("|layout", STR, &layout_text), FL_ARG("out", OBJECT, &out_obj),
                           FL_ARG("num_threads", INT, &threads)) < 0)
        return NULL;
    if (fl_check_threads(threads) < 0 ||
        parse_layout_pair(layout_text, &src_layout, &dst_layout) < 0 ||
        fl_check_array(x, "x") == NULL || fl_dtype_of(x, "x", &dtype) < 0 ||
        fl_image_dims(x, src_layout, &dims) < 0)
        return NULL;
    if (dtype != FL_UINT8 && dtype != FL_FLOAT32 && dtype != FL_FLOAT64) {
        fl_raisef(NULL, FL_EXC_TYPE, "'x' must have dtype uint8, float32 or float64, not %s",
                  fl_dtype_name(dtype));
        return NULL;
    }
    PyObject *mean = channel_values(mean_obj, "mean", dims.c);
    PyObject *std = mean != NULL ? channel_values(std_obj, "std", dims.c) : NULL;
    Py_ssize_t shape[4];
    fl_image_shape(x, dst_layout, dims, shape);
    PyObject *out = std != NULL
                        ? fl_output_array(out_obj, PyArray_NDIM((PyArrayObject *)x), shape,
                                          (PyObject *)PyArray_DescrFromType(NPY_FLOAT32), x, 0)
                        : NULL;
    if (out == NULL)
        goto done;
    FL_RUN_KERNEL(module, threads, PyArray_NBYTES((PyArrayObject *)x), "normalize", out,
                  fl_normalize(exec, PyArray_DATA((PyArrayObject *)x), dtype, src_layout,
                               PyArray_DATA((PyArrayObject *)out), dst_layout, dims,
                               PyArray_DATA((PyArrayObject *)mean),
                               PyArray_DATA((PyArrayObject *)std)));
done:
    Py_XDECREF(mean);
    Py_XDECREF(std);
    return out;
}

PyObject *fl_py_cast(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache cast_args = FL_ARG_CACHE("cast");
    PyObject *x, *dtype_obj, *out_obj = Py_None;
    PyArray_Descr *descr = NULL;
    int threads = 1;
    fl_dtype src_dtype, dst_dtype;
    if (fl_parse_args_dict(&cast_args, args, kwargs, FL_ARG("x", OBJECT, &x),
                           FL_ARG("dtype", OBJECT, &dtype_obj), FL_ARG("|out", OBJECT, &out_obj),
                           FL_ARG("num_threads", INT, &threads)) < 0)
        return NULL;
    if (fl_check_threads(threads) < 0 || fl_check_array(x, "x") == NULL ||
        fl_dtype_of(x, "x", &src_dtype) < 0)
        return NULL;
    if (!PyArray_DescrConverter(dtype_obj, &descr))
        return NULL;
    if (fl_dtype_from_descr((PyObject *)descr, "dtype", &dst_dtype) < 0) {
        Py_DECREF(descr);
        return NULL;
    }
    PyArrayObject *input = (PyArrayObject *)x;
    PyObject *out =
        fl_output_array(out_obj, PyArray_NDIM(input), PyArray_DIMS(input), (PyObject *)descr, x, 0);
    if (out == NULL)
        return NULL;
    FL_RUN_KERNEL(module, threads, PyArray_NBYTES(input), "cast", out,
                  fl_cast(exec, PyArray_DATA(input), src_dtype, PyArray_DATA((PyArrayObject *)out),
                          dst_dtype, (size_t)PyArray_SIZE(input)));
    return out;
}

PyObject *fl_py_divide_by_max(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache divide_by_max_args = FL_ARG_CACHE("divide_by_max");
    PyObject *x, *out_obj = Py_None;
    int threads = 1;
    fl_dtype dtype;
    if (fl_parse_args_dict(&divide_by_max_args, args, kwargs, FL_ARG("x", OBJECT, &x),
                           FL_ARG("|out", OBJECT, &out_obj),
                           FL_ARG("num_threads", INT, &threads)) < 0)
        return NULL;
    if (fl_check_threads(threads) < 0 || fl_check_array(x, "x") == NULL ||
        fl_dtype_of(x, "x", &dtype) < 0)
        return NULL;
    PyArrayObject *input = (PyArrayObject *)x;
    if (PyArray_SIZE(input) == 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'x' is empty: the max of no values is undefined");
        return NULL;
    }
    int out_type = fl_dtype_to_numpy(fl_divide_by_max_dtype(dtype));
    PyObject *out = fl_output_array(out_obj, PyArray_NDIM(input), PyArray_DIMS(input),
                                    (PyObject *)PyArray_DescrFromType(out_type), x,
                                    out_type == PyArray_TYPE(input));
    if (out == NULL)
        return NULL;
    FL_RUN_KERNEL(module, threads, PyArray_NBYTES(input), "divide_by_max", out,
                  fl_divide_by_max(exec, PyArray_DATA(input), dtype,
                                   PyArray_DATA((PyArrayObject *)out),
                                   (size_t)PyArray_SIZE(input)));
    return out;
}
