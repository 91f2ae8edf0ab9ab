/* py_preprocess.c - fastloop.cuda.preprocess(): checks every argument (naming it) before
 * anything touches the GPU, then queues the copy and the kernel of fl_cuda_preprocess()
 * on the stream and returns the output DeviceArray without waiting. */
#include "py_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cuda_preprocess.h"

/* The parsed arguments, and the arrays that own their memory (new references). */
typedef struct preprocess_args {
    fl_cuda_preprocess_job job;
    PyArrayObject *batch, *mean, *std, *flips;
    int32_t *offsets; /* malloc'd */
    float *coefficients; /* malloc'd: a then b */
} preprocess_args;

static void args_free(preprocess_args *a) {
    Py_XDECREF(a->batch);
    Py_XDECREF(a->mean);
    Py_XDECREF(a->std);
    Py_XDECREF(a->flips);
    free(a->offsets);
    free(a->coefficients);
}

static int parse_layout(const char *layout, int *src_chw, int *dst_chw) {
    static const struct {
        const char *name;
        int src_chw, dst_chw;
    } layouts[] = {{"HWC->CHW", 0, 1}, {"CHW", 1, 1}, {"HWC", 0, 0}, {"CHW->HWC", 1, 0}};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (strcmp(layout, layouts[i].name) == 0) {
            *src_chw = layouts[i].src_chw;
            *dst_chw = layouts[i].dst_chw;
            return 0;
        }
    fl_raisef(NULL, FL_EXC_VALUE, "'layout' must be 'HWC->CHW', 'CHW', 'HWC' or 'CHW->HWC', not '%s'", layout);
    return -1;
}

static int parse_batch(preprocess_args *a, PyObject *obj) {
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != NPY_UINT8) {
        fl_raisef(NULL, FL_EXC_TYPE, "'batch' must be a uint8 NumPy array, not %R",
                  PyArray_Check(obj) ? (PyObject *)PyArray_DESCR((PyArrayObject *)obj) : (PyObject *)Py_TYPE(obj));
        return -1;
    }
    PyArrayObject *batch = (PyArrayObject *)obj;
    if (PyArray_NDIM(batch) != 4 || !PyArray_IS_C_CONTIGUOUS(batch)) {
        fl_raisef(NULL, FL_EXC_VALUE, "'batch' must be a C-contiguous 4-D array (N, H, W, C) or (N, C, H, W), not %d-D%s",
                  PyArray_NDIM(batch), PyArray_IS_C_CONTIGUOUS(batch) ? "" : " non-contiguous");
        return -1;
    }
    fl_cuda_preprocess_job *j = &a->job;
    j->n = (size_t)PyArray_DIM(batch, 0);
    j->c = (size_t)PyArray_DIM(batch, j->src_chw ? 1 : 3);
    j->h = (size_t)PyArray_DIM(batch, j->src_chw ? 2 : 1);
    j->w = (size_t)PyArray_DIM(batch, j->src_chw ? 3 : 2);
    if (j->c == 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'batch' images have no channels");
        return -1;
    }
    a->batch = (PyArrayObject *)Py_NewRef(obj);
    j->host_src = PyArray_DATA(batch);
    return 0;
}

/* mean or std: a number or c numbers, as float32; *out a new reference. */
static int parse_channels(PyObject *obj, const char *arg, size_t c, PyArrayObject **out) {
    PyArrayObject *values = (PyArrayObject *)PyArray_FROMANY(obj, NPY_FLOAT32, 0, 1, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (values == NULL)
        return -1;
    npy_intp size = PyArray_SIZE(values);
    if (size != 1 && (size_t)size != c) {
        fl_raisef(NULL, FL_EXC_VALUE, "'%s' must hold 1 or %zu values (one per channel), not %zd", arg, c, (Py_ssize_t)size);
        Py_DECREF(values);
        return -1;
    }
    *out = values;
    return 0;
}

/* The per-channel coefficients from mean and std (std 0 is refused). */
static int make_coefficients(preprocess_args *a) {
    const size_t c = a->job.c;
    const float *mean = PyArray_DATA(a->mean), *std = PyArray_DATA(a->std);
    const int mean_step = PyArray_SIZE(a->mean) != 1, std_step = PyArray_SIZE(a->std) != 1;
    float *values = malloc(4 * c * sizeof(float));
    if (values == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    a->coefficients = values;
    float *m = values + 2 * c, *s = values + 3 * c;
    for (size_t ch = 0; ch < c; ch++) {
        m[ch] = mean[mean_step * ch];
        s[ch] = std[std_step * ch];
        if (s[ch] == 0.0f) {
            fl_raisef(NULL, FL_EXC_VALUE, "'std[%zu]' is 0", ch);
            return -1;
        }
    }
    fl_cuda_preprocess_coefficients(m, s, c, values, values + c);
    a->job.a = values;
    a->job.b = values + c;
    return 0;
}

static int parse_crop(preprocess_args *a, PyObject *obj) {
    fl_cuda_preprocess_job *j = &a->job;
    Py_ssize_t h, w;
    j->out_h = j->h, j->out_w = j->w;
    if (obj == Py_None)
        return 0;
    if (PyLong_Check(obj)) {
        h = w = PyLong_AsSsize_t(obj);
        if (h == -1 && PyErr_Occurred())
            return -1;
    } else if (!PyTuple_Check(obj) || !PyArg_ParseTuple(obj, "nn", &h, &w)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'crop' must be None, an int or an (h, w) tuple of ints, not %R", obj);
        return -1;
    }
    if (h < 1 || w < 1 || (size_t)h > j->h || (size_t)w > j->w) {
        fl_raisef(NULL, FL_EXC_VALUE, "'crop' (%zd, %zd) must fit the %zux%zu images", h, w, j->h, j->w);
        return -1;
    }
    j->out_h = (size_t)h, j->out_w = (size_t)w;
    j->top = (size_t)nearbyint((double)(j->h - j->out_h) / 2.0); /* torchvision's center: half to even */
    j->left = (size_t)nearbyint((double)(j->w - j->out_w) / 2.0);
    return 0;
}

/* offsets: None (centered) or an integer (N, 2) array of (top, left), each crop inside. */
static int parse_offsets(preprocess_args *a, PyObject *obj) {
    fl_cuda_preprocess_job *j = &a->job;
    if (obj == Py_None)
        return 0;
    if (!PyArray_Check(obj) || !PyArray_ISINTEGER((PyArrayObject *)obj)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'offsets' must be an integer NumPy array (N, 2), not %.200s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *values = (PyArrayObject *)PyArray_FROMANY(obj, NPY_INT64, 2, 2, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (values == NULL)
        return -1;
    int rc = -1;
    if (PyArray_DIM(values, 0) != (npy_intp)j->n || PyArray_DIM(values, 1) != 2) {
        fl_raisef(NULL, FL_EXC_VALUE, "'offsets' must have shape (%zu, 2)", j->n);
    } else if ((a->offsets = malloc(2 * j->n * sizeof(int32_t) + 1)) == NULL) {
        PyErr_NoMemory();
    } else {
        const int64_t *v = PyArray_DATA(values);
        rc = 0;
        for (size_t i = 0; rc == 0 && i < j->n; i++) {
            if (v[2 * i] < 0 || v[2 * i + 1] < 0 || (size_t)v[2 * i] > j->h - j->out_h ||
                (size_t)v[2 * i + 1] > j->w - j->out_w) {
                fl_raisef(NULL, FL_EXC_VALUE, "'offsets' row %zu (top %lld, left %lld) puts the %zux%zu crop outside the %zux%zu image",
                          i, (long long)v[2 * i], (long long)v[2 * i + 1], j->out_h, j->out_w, j->h, j->w);
                rc = -1;
            }
            a->offsets[2 * i] = (int32_t)v[2 * i];
            a->offsets[2 * i + 1] = (int32_t)v[2 * i + 1];
        }
        j->offsets = a->offsets;
    }
    Py_DECREF(values);
    return rc;
}

static int parse_flips(preprocess_args *a, PyObject *obj) {
    if (obj == Py_None)
        return 0;
    PyArrayObject *flips = (PyArrayObject *)obj;
    if (!PyArray_Check(obj) || (PyArray_TYPE(flips) != NPY_BOOL && PyArray_TYPE(flips) != NPY_UINT8)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'flips' must be a bool or uint8 NumPy array (N,), not %.200s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyArray_NDIM(flips) != 1 || PyArray_DIM(flips, 0) != (npy_intp)a->job.n) {
        fl_raisef(NULL, FL_EXC_VALUE, "'flips' must have shape (%zu,)", a->job.n);
        return -1;
    }
    a->flips = (PyArrayObject *)PyArray_FROMANY(obj, PyArray_TYPE(flips), 1, 1, NPY_ARRAY_IN_ARRAY);
    if (a->flips == NULL)
        return -1;
    a->job.flips = PyArray_DATA(a->flips);
    return 0;
}

static const struct {
    const char *name;
    fl_cuda_out_dtype dtype;
    int numpy_type; /* -1: NumPy has none (a DeviceArray cannot hold it) */
} out_dtypes[] = {
    {"float32", FL_CUDA_OUT_FLOAT32, NPY_FLOAT32},
    {"float16", FL_CUDA_OUT_FLOAT16, NPY_HALF},
    {"bfloat16", FL_CUDA_OUT_BFLOAT16, -1},
};

static int parse_out_dtype(const char *name, fl_cuda_out_dtype *dtype, int *numpy_type) {
    for (size_t i = 0; i < sizeof out_dtypes / sizeof out_dtypes[0]; i++)
        if (strcmp(name, out_dtypes[i].name) == 0) {
            *dtype = out_dtypes[i].dtype;
            *numpy_type = out_dtypes[i].numpy_type;
            return 0;
        }
    fl_raisef(NULL, FL_EXC_VALUE, "'dtype' must be 'float32', 'float16' or 'bfloat16', not '%s'", name);
    return -1;
}

/* The output's shape: (n, c, out_h, out_w) when dst_chw, else (n, out_h, out_w, c). */
static void output_shape(const fl_cuda_preprocess_job *j, Py_ssize_t shape[4]) {
    shape[0] = (Py_ssize_t)j->n;
    shape[1] = (Py_ssize_t)(j->dst_chw ? j->c : j->out_h);
    shape[2] = (Py_ssize_t)(j->dst_chw ? j->out_h : j->out_w);
    shape[3] = (Py_ssize_t)(j->dst_chw ? j->out_w : j->c);
}

/* `out` checked (the dtype, the output shape, the device), or a new one; a new reference. */
static DeviceArray *output(cuda_state *state, PyObject *obj, const fl_cuda_preprocess_job *j, int numpy_type,
                           int check_only) {
    Py_ssize_t shape[4];
    output_shape(j, shape);
    if (obj == Py_None && numpy_type < 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "dtype='bfloat16' has no NumPy dtype for a DeviceArray: pass a torch "
                                          "bfloat16 CUDA tensor as 'out' (fastloop.cuda.preprocess)");
        return NULL;
    }
    if (obj == Py_None)
        return check_only ? (DeviceArray *)Py_NewRef(Py_None)
                          : fl_py_device_array_new(state, j->device, 4, shape, PyArray_DescrFromType(numpy_type));
    DeviceArray *out = fl_py_device_array_check(state, obj, "out");
    if (out == NULL)
        return NULL;
    int fits = out->ndim == 4 && out->descr->type_num == numpy_type && out->device == j->device;
    for (int i = 0; fits && i < 4; i++)
        fits = out->shape[i] == shape[i];
    if (!fits) {
        fl_raisef(NULL, FL_EXC_VALUE, "'out' must be a %s DeviceArray of shape (%zd, %zd, %zd, %zd) on device %d",
                  numpy_type == NPY_HALF ? "float16" : "float32", shape[0], shape[1], shape[2], shape[3], j->device);
        return NULL;
    }
    return (DeviceArray *)Py_NewRef(obj);
}

/* _out_ptr/_out_nbytes: device memory the caller owns (a torch tensor's), checked to hold
 * exactly the output. */
static int check_out_pointer(const fl_cuda_preprocess_job *j, unsigned long long ptr, Py_ssize_t nbytes,
                             PyObject *out) {
    if (out != Py_None) {
        fl_raisef(NULL, FL_EXC_TYPE, "pass 'out' or '_out_ptr', not both");
        return -1;
    }
    size_t want = fl_cuda_out_dtype_size(j->dst_dtype);
    const size_t dims[4] = {j->n, j->c, j->out_h, j->out_w};
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(want, dims[i], &want)) {
            fl_raisef(NULL, FL_EXC_VALUE, "the output is too large");
            return -1;
        }
    if (ptr == 0 || nbytes < 0 || (size_t)nbytes != want) {
        fl_raisef(NULL, FL_EXC_VALUE, "'_out_ptr' must be non-zero, with '_out_nbytes' %zu (the output's size), "
                  "not %zd", want, nbytes);
        return -1;
    }
    return 0;
}

/* Parses and checks everything but `out` and `stream`, touching no GPU. */
static int parse(preprocess_args *a, PyObject *batch, PyObject *mean, PyObject *std, const char *layout,
                 PyObject *crop, PyObject *offsets, PyObject *flips) {
    if (mean == NULL || std == NULL) {
        fl_raisef(NULL, FL_EXC_TYPE, "preprocess() missing required keyword argument '%s'", mean ? "std" : "mean");
        return -1;
    }
    if (a->job.device < 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'device' must be >= 0, not %d", a->job.device);
        return -1;
    }
    if (parse_layout(layout, &a->job.src_chw, &a->job.dst_chw) < 0 || parse_batch(a, batch) < 0 ||
        parse_channels(mean, "mean", a->job.c, &a->mean) < 0 || parse_channels(std, "std", a->job.c, &a->std) < 0 ||
        make_coefficients(a) < 0 || parse_crop(a, crop) < 0 || parse_offsets(a, offsets) < 0 || parse_flips(a, flips) < 0)
        return -1;
    return 0;
}

/* Queues the job into caller-owned memory at `ptr`; returns None (the caller keeps the batch
 * unchanged until the stream passes this point). */
static PyObject *run_into(cuda_state *state, preprocess_args *a, unsigned long long ptr) {
    fl_cuda_preprocess_job *j = &a->job;
    if (fl_py_require_device(state, j->device) < 0)
        return NULL;
    j->dst = (void *)(uintptr_t)ptr;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_cuda_preprocess(j, NULL);
    Py_END_ALLOW_THREADS
    return rc != 0 ? fl_py_raise_cuda(state, rc, "preprocess") : Py_NewRef(Py_None);
}

static PyObject *run(cuda_state *state, preprocess_args *a, PyObject *out_obj, int numpy_type, PyObject *stream_ref) {
    fl_cuda_preprocess_job *j = &a->job;
    if (fl_py_require_device(state, j->device) < 0)
        return NULL;
    DeviceArray *out = output(state, out_obj, j, numpy_type, 0);
    if (out == NULL)
        return NULL;
    int rc = fl_py_device_array_wait_stream(out, j->stream); /* after out's pending write */
    j->dst = out->data;
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
            rc = fl_cuda_preprocess(j, NULL); /* out's event is recorded after it below */
        Py_END_ALLOW_THREADS
    }
    if (rc != 0) {
        Py_DECREF(out);
        return fl_py_raise_cuda(state, rc, "preprocess");
    }
    if (fl_py_device_array_queued(state, out, j->stream, stream_ref, (PyObject *)a->batch) < 0)
        Py_CLEAR(out);
    return (PyObject *)out;
}

static PyObject *preprocess(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache preprocess_decl = FL_ARG_CACHE("preprocess");
    PyObject *batch, *mean = NULL, *std = NULL, *crop = Py_None, *offsets = Py_None, *flips = Py_None;
    PyObject *out = Py_None, *stream = Py_None, *stream_ref = NULL, *result = NULL;
    const char *layout = "HWC->CHW", *dtype = "float32";
    unsigned long long out_ptr = 0;
    Py_ssize_t out_nbytes = -1;
    int numpy_type;
    cuda_state *state = fl_py_state(module);
    preprocess_args a;
    memset(&a, 0, sizeof a);
    if (fl_parse_args_dict(&preprocess_decl, args, kwargs, FL_ARG("batch", OBJECT, &batch),
                           FL_ARG("|$mean", OBJECT, &mean), FL_ARG("std", OBJECT, &std),
                           FL_ARG("layout", STR, &layout), FL_ARG("crop", OBJECT, &crop),
                           FL_ARG("offsets", OBJECT, &offsets), FL_ARG("flips", OBJECT, &flips),
                           FL_ARG("out", OBJECT, &out), FL_ARG("stream", OBJECT, &stream),
                           FL_ARG("device", INT, &a.job.device), FL_ARG("dtype", STR, &dtype),
                           FL_ARG("_out_ptr", UINT64, &out_ptr),
                           FL_ARG("_out_nbytes", SSIZE, &out_nbytes)) < 0)
        return NULL;
    DeviceArray *checked = NULL;
    if (parse(&a, batch, mean, std, layout, crop, offsets, flips) == 0 &&
        parse_out_dtype(dtype, &a.job.dst_dtype, &numpy_type) == 0 &&
        fl_py_parse_stream(state, stream, a.job.device, &a.job.stream, &stream_ref) == 0) {
        if (out_ptr != 0 || out_nbytes != -1) {
            if (check_out_pointer(&a.job, out_ptr, out_nbytes, out) == 0)
                result = run_into(state, &a, out_ptr);
        } else if ((checked = output(state, out, &a.job, numpy_type, 1)) != NULL) {
            result = run(state, &a, out, numpy_type, stream_ref);
        }
    }
    Py_XDECREF(checked);
    args_free(&a);
    return result;
}

static PyMethodDef preprocess_functions[] = {
    {"preprocess", (PyCFunction)(void (*)(void))preprocess, METH_VARARGS | METH_KEYWORDS,
     "preprocess(batch, *, mean, std, layout='HWC->CHW', crop=None, offsets=None, flips=None,\n"
     "           out=None, stream=None, device=0, dtype='float32')\n--\n\n"
     "Queue on `stream` the copy of a uint8 image batch (a host NumPy array, ideally pinned)\n"
     "to the device and one kernel that crops, mirrors and normalizes it to `dtype` (float32,\n"
     "float16) as fastloop.ops.normalize does; returns the output DeviceArray at once.\n"
     "_out_ptr/_out_nbytes (fastloop.cuda.preprocess with a torch tensor as out, bfloat16\n"
     "too): write into that device memory instead and return None. Its ready()\n"
     "turns True (synchronize() waits) once the copy and the kernel are done: only then may\n"
     "`batch` be overwritten. crop: (h, w) or an int, centered unless `offsets` gives each\n"
     "image's (top, left); flips: one bool per image (mirror left-right after the crop)."},
    {NULL, NULL, 0, NULL},
};

int fl_py_preprocess_init(PyObject *module) { return PyModule_AddFunctions(module, preprocess_functions); }
