/* py_nn.c - fastloop._core._Model and _Optimizer (the binding of fl_nn.h), and the BLAS
 * loader functions. fastloop.nn wraps them; the checks that make friendly messages (shapes,
 * dtypes, devices) live there, and the ones that keep C in bounds live here. */
#include "fl_module.h"
#include "fl_numpy.h"

#include "nn/fl_blas.h"
#include "base/fl_error.h"
#include "nn/fl_nn.h"
#include "nn/fl_nn_cpu.h"

typedef struct {
    PyObject_HEAD
    fl_nn_model *model;
    PyObject *backend_owner; /* keeps the extension that owns a foreign backend alive */
} ModelObject;

typedef struct {
    PyObject_HEAD
    fl_nn_optimizer *opt;
    ModelObject *model;
} OptimizerObject;

static fl_module_state *nn_state(PyObject *self) { return fl_state_from_type(Py_TYPE(self)); }

/* ---- arrays: NumPy (host) or __cuda_array_interface__ (device) ---- */

/* Reads a CUDA array interface dict into pointer, typestr and shape. Returns 0 or -1. */
static int read_cuda_interface(PyObject *iface, const char *arg, void **data, const char **typestr,
                               Py_ssize_t *shape, int *ndim, PyObject **stream) {
    PyObject *data_obj = PyDict_Check(iface) ? PyDict_GetItemString(iface, "data") : NULL;
    PyObject *shape_obj = PyDict_Check(iface) ? PyDict_GetItemString(iface, "shape") : NULL;
    PyObject *type_obj = PyDict_Check(iface) ? PyDict_GetItemString(iface, "typestr") : NULL;
    PyObject *strides = PyDict_Check(iface) ? PyDict_GetItemString(iface, "strides") : NULL;
    if (data_obj == NULL || !PyTuple_Check(data_obj) || PyTuple_GET_SIZE(data_obj) < 1 ||
        shape_obj == NULL || !PyTuple_Check(shape_obj) || PyTuple_GET_SIZE(shape_obj) > 2 ||
        type_obj == NULL || (*typestr = PyUnicode_AsUTF8(type_obj)) == NULL) {
        PyErr_Clear();
        fl_raisef(NULL, FL_EXC_TYPE, "%s: malformed __cuda_array_interface__", arg);
        return -1;
    }
    if (strides != NULL && strides != Py_None) {
        fl_raisef(NULL, FL_EXC_VALUE, "%s: a CUDA array must be C-contiguous (strides None)", arg);
        return -1;
    }
    *data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data_obj, 0));
    *ndim = (int)PyTuple_GET_SIZE(shape_obj);
    for (int i = 0; i < *ndim; i++)
        if ((shape[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape_obj, i))) < 0)
            return -1;
    *stream = PyDict_GetItemString(iface, "stream");
    return PyErr_Occurred() ? -1 : 0;
}

/* Resolves argument `arg` to an fl_nn_array of `typestr` ("f4", "f8", "i8") and shape
 * (rows[, cols]) (cols < 0: one dimension). A CUDA array makes the model wait for its stream. */
static int resolve_array(ModelObject *self, PyObject *obj, const char *arg, fl_dtype dtype,
                         Py_ssize_t rows, Py_ssize_t cols, int writable, fl_nn_array *out) {
    int ndim = cols < 0 ? 1 : 2;
    Py_ssize_t want[2] = {rows, cols};
    if (PyArray_Check(obj)) {
        PyArrayObject *array = (PyArrayObject *)fl_check_array(obj, arg);
        fl_dtype got;
        if (array == NULL || fl_dtype_of(obj, arg, &got) < 0)
            return -1;
        if (got != dtype) {
            fl_raisef(NULL, FL_EXC_TYPE, "%s has dtype %s, expected %s", arg, fl_dtype_name(got), fl_dtype_name(dtype));
            return -1;
        }
        if (PyArray_NDIM(array) != ndim || PyArray_DIM(array, 0) != rows || (ndim == 2 && PyArray_DIM(array, 1) != cols)) {
            fl_raisef(NULL, FL_EXC_VALUE, "%s has the wrong shape for this model", arg);
            return -1;
        }
        if (writable && !PyArray_ISWRITEABLE(array)) {
            fl_raisef(NULL, FL_EXC_VALUE, "%s is read-only", arg);
            return -1;
        }
        *out = (fl_nn_array){.data = PyArray_DATA(array), .on_device = 0};
        return 0;
    }
    PyObject *iface = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (iface == NULL) {
        PyErr_Clear();
        fl_raisef(NULL, FL_EXC_TYPE, "%s must be a NumPy array or a CUDA array, not %.200s", arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (fl_nn_on_host(self->model)) {
        Py_DECREF(iface);
        fl_raisef(NULL, FL_EXC_TYPE, "%s is a CUDA array but the model is on the CPU", arg);
        return -1;
    }
    void *data = NULL;
    const char *typestr;
    Py_ssize_t shape[2];
    int got_ndim;
    PyObject *stream;
    int rc = read_cuda_interface(iface, arg, &data, &typestr, shape, &got_ndim, &stream);
    const char *want_type = dtype == FL_FLOAT32 ? "f4" : dtype == FL_FLOAT64 ? "f8" : "i8";
    if (rc == 0 && (strlen(typestr) != 3 || strcmp(typestr + 1, want_type) != 0 || typestr[0] == '>')) {
        fl_raisef(NULL, FL_EXC_TYPE, "%s has typestr %s, expected <%s (%s)", arg, typestr, want_type, fl_dtype_name(dtype));
        rc = -1;
    }
    if (rc == 0 && (got_ndim != ndim || shape[0] != want[0] || (ndim == 2 && shape[1] != want[1]))) {
        fl_raisef(NULL, FL_EXC_VALUE, "%s has the wrong shape for this model", arg);
        rc = -1;
    }
    uintptr_t handle = 0;
    if (rc == 0 && stream != NULL && stream != Py_None) {
        handle = (uintptr_t)PyLong_AsUnsignedLongLong(stream);
        rc = PyErr_Occurred() ? -1 : 0;
    }
    Py_DECREF(iface);
    if (rc == 0 && handle != 0) {
        Py_BEGIN_ALLOW_THREADS
            rc = fl_nn_wait_stream(self->model, handle);
        Py_END_ALLOW_THREADS
        if (rc != FL_OK) {
            fl_raise(nn_state((PyObject *)self), rc, arg);
            return -1;
        }
    }
    *out = (fl_nn_array){.data = data, .on_device = 1};
    return rc;
}

/* ---- _Model ---- */

/* _Model(layers, dtype, backend=None, device=0): layers is a sequence of
 * ("linear", in, out, bias) or ("relu",) tuples; backend a capsule (None: the CPU). */
static PyObject *model_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache model_args = FL_ARG_CACHE("_Model");
    PyObject *layers_obj, *dtype_obj, *backend_obj = Py_None;
    int device = 0;
    if (fl_parse_args_dict(&model_args, args, kwargs, FL_ARG("layers", OBJECT, &layers_obj),
                           FL_ARG("dtype", OBJECT, &dtype_obj),
                           FL_ARG("|backend", OBJECT, &backend_obj),
                           FL_ARG("device", INT, &device)) < 0)
        return NULL;
    fl_dtype dtype;
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(dtype_obj, &descr))
        return NULL;
    int bad = fl_dtype_from_descr((PyObject *)descr, "dtype", &dtype);
    Py_DECREF(descr);
    if (bad < 0)
        return NULL;
    const fl_nn_backend *backend = fl_nn_cpu_backend();
    if (backend_obj != Py_None && (backend = PyCapsule_GetPointer(backend_obj, FL_NN_BACKEND_CAPSULE)) == NULL)
        return NULL;
    if (backend == fl_nn_cpu_backend() && !fl_blas_loaded()) {
        fl_raisef(NULL, FL_EXC_RUNTIME, "no BLAS is loaded (fastloop.nn loads one on import)");
        return NULL;
    }
    PyObject *listed = PySequence_Fast(layers_obj, "layers must be a sequence");
    PyObject *seq = listed != NULL ? PySequence_Tuple(listed) : NULL; /* a snapshot: another thread may change a list */
    Py_XDECREF(listed);
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    fl_nn_layer_spec *specs = PyMem_Calloc((size_t)count + 1, sizeof *specs);
    if (specs == NULL || count > INT32_MAX) {
        Py_DECREF(seq);
        PyMem_Free(specs);
        return PyErr_NoMemory();
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        const char *kind;
        long long in = 0, out = 0;
        int bias = 0;
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyArg_ParseTuple(item, "s|LLp:layer", &kind, &in, &out, &bias)) {
            failed = 1;
        } else if (strcmp(kind, "linear") == 0) {
            specs[i] = (fl_nn_layer_spec){.kind = FL_NN_LINEAR, .in_features = in, .out_features = out, .bias = bias};
        } else if (strcmp(kind, "relu") == 0) {
            specs[i] = (fl_nn_layer_spec){.kind = FL_NN_RELU};
        } else {
            fl_raisef(NULL, FL_EXC_VALUE, "layer %zd: unknown kind %s", i, kind);
            failed = 1;
        }
    }
    Py_DECREF(seq);
    ModelObject *self = failed ? NULL : (ModelObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        int rc;
        Py_BEGIN_ALLOW_THREADS /* a CUDA backend's open() starts a context: slow */
            rc = fl_nn_model_new(backend, device, dtype, specs, (int)count, &self->model);
        Py_END_ALLOW_THREADS
        if (rc != FL_OK) {
            Py_CLEAR(self);
            fl_raise(fl_state_from_type(type), rc, "model");
        } else if (backend_obj != Py_None) {
            self->backend_owner = Py_NewRef(backend_obj);
        }
    }
    PyMem_Free(specs);
    return (PyObject *)self;
}

static void model_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    ModelObject *m = (ModelObject *)self;
    fl_nn_model *model = m->model;
    Py_BEGIN_ALLOW_THREADS /* a CUDA model waits for its stream and frees device memory */
        fl_nn_model_free(model); /* before the capsule: its backend code must stay loaded */
    Py_END_ALLOW_THREADS
    Py_XDECREF(m->backend_owner);
    type->tp_free(self);
    Py_DECREF(type);
}

static int parse_index(ModelObject *self, PyObject *arg, fl_nn_param_info *info) {
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return -1;
    int index = value < INT32_MIN || value > INT32_MAX ? -1 : (int)value;
    if (fl_nn_param_info_get(self->model, index, info) != FL_OK) {
        fl_error_clear();
        fl_raisef(NULL, FL_EXC_INDEX, "parameter index %d is outside [0, %d)", index, fl_nn_param_count(self->model));
        return -1;
    }
    return index;
}

/* A new host array shaped like parameter `info`. */
static PyObject *param_array(ModelObject *self, const fl_nn_param_info *info) {
    npy_intp dims[2] = {(npy_intp)info->rows, (npy_intp)info->cols};
    return PyArray_SimpleNew(info->is_bias ? 1 : 2, dims, fl_dtype_to_numpy(fl_nn_dtype(self->model)));
}

static PyObject *model_param_info(PyObject *self, PyObject *unused) {
    (void)unused;
    fl_nn_model *model = ((ModelObject *)self)->model;
    PyObject *result = PyList_New(fl_nn_param_count(model));
    for (int i = 0; result != NULL && i < fl_nn_param_count(model); i++) {
        fl_nn_param_info info;
        fl_nn_param_info_get(model, i, &info);
        PyObject *item = info.is_bias ? Py_BuildValue("(ii(L))", info.layer, 1, (long long)info.rows)
                                      : Py_BuildValue("(ii(LL))", info.layer, 0, (long long)info.rows, (long long)info.cols);
        if (item == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, i, item);
    }
    return result;
}

typedef int (*param_get_fn)(fl_nn_model *, int, void *);
typedef int (*param_set_fn)(fl_nn_model *, int, const void *);

static PyObject *get_tensor(PyObject *self, PyObject *arg, param_get_fn get) {
    fl_nn_param_info info;
    int index = parse_index((ModelObject *)self, arg, &info);
    if (index < 0)
        return NULL;
    PyObject *array = param_array((ModelObject *)self, &info);
    if (array == NULL)
        return NULL;
    int rc;
    void *data = PyArray_DATA((PyArrayObject *)array);
    Py_BEGIN_ALLOW_THREADS
        rc = get(((ModelObject *)self)->model, index, data);
    Py_END_ALLOW_THREADS
    return fl_result_or_raise(nn_state(self), rc, array, "reading a parameter");
}

static PyObject *set_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames, fl_arg_cache *cache, param_set_fn set,
                            const char *name) {
    PyObject *index_obj, *value;
    if (fl_parse_args(cache, args, nargs, kwnames, FL_ARG("index", OBJECT, &index_obj),
                      FL_ARG(name, OBJECT, &value)) < 0)
        return NULL;
    ModelObject *m = (ModelObject *)self;
    fl_nn_param_info info;
    int index = parse_index(m, index_obj, &info);
    if (index < 0)
        return NULL;
    fl_nn_array array;
    if (!PyArray_Check(value)) {
        fl_raisef(NULL, FL_EXC_TYPE, "%s must be a NumPy array", name);
        return NULL;
    }
    if (resolve_array(m, value, name, fl_nn_dtype(m->model), (Py_ssize_t)info.rows, info.is_bias ? -1 : (Py_ssize_t)info.cols, 0, &array) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = set(m->model, index, array.data);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK)
        return fl_raise(nn_state(self), rc, "writing a parameter");
    Py_RETURN_NONE;
}

/* get_all(grad) -> [host copies of every parameter or gradient], taken under one lock. */
static PyObject *model_get_all(PyObject *self, PyObject *arg) {
    int grad = PyObject_IsTrue(arg);
    if (grad < 0)
        return NULL;
    ModelObject *m = (ModelObject *)self;
    int count = fl_nn_param_count(m->model);
    PyObject *result = PyList_New(count);
    void **dsts = PyMem_Calloc((size_t)count + 1, sizeof(void *));
    for (int i = 0; result != NULL && dsts != NULL && i < count; i++) {
        fl_nn_param_info info;
        fl_nn_param_info_get(m->model, i, &info);
        PyObject *array = param_array(m, &info);
        if (array == NULL) {
            Py_CLEAR(result);
            break;
        }
        dsts[i] = PyArray_DATA((PyArrayObject *)array);
        PyList_SET_ITEM(result, i, array);
    }
    if (result != NULL && dsts != NULL) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
            rc = fl_nn_get_all(m->model, grad, dsts);
        Py_END_ALLOW_THREADS
        if (rc != FL_OK) {
            Py_CLEAR(result);
            fl_raise(nn_state(self), rc, "reading the parameters");
        }
    } else if (dsts == NULL) {
        Py_CLEAR(result);
        PyErr_NoMemory();
    }
    PyMem_Free(dsts);
    return result;
}

static PyObject *model_get_param(PyObject *self, PyObject *arg) { return get_tensor(self, arg, fl_nn_get_param); }
static PyObject *model_get_grad(PyObject *self, PyObject *arg) { return get_tensor(self, arg, fl_nn_get_grad); }
static PyObject *model_set_param(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
    static fl_arg_cache set_param_args = FL_ARG_CACHE("set_param");
    return set_tensor(self, args, nargs, kwnames, &set_param_args, fl_nn_set_param, "value");
}

static PyObject *model_set_grad(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    static fl_arg_cache set_grad_args = FL_ARG_CACHE("set_grad");
    return set_tensor(self, args, nargs, kwnames, &set_grad_args, fl_nn_set_grad, "grad");
}

/* forward(x, out, rows): out = model(x); x (rows, in), out (rows, out). */
static PyObject *model_forward(PyObject *self, PyObject *args) {
    static fl_arg_cache forward_args = FL_ARG_CACHE("forward"); /* positional only */
    PyObject *x_obj, *out_obj;
    Py_ssize_t rows;
    if (fl_parse_args_dict(&forward_args, args, NULL, FL_ARG("x", OBJECT, &x_obj),
                           FL_ARG("out", OBJECT, &out_obj), FL_ARG("rows", SSIZE, &rows)) < 0)
        return NULL;
    ModelObject *m = (ModelObject *)self;
    fl_dtype dtype = fl_nn_dtype(m->model);
    fl_nn_array x, out;
    if (rows < 0)
        return fl_raisef(NULL, FL_EXC_VALUE, "rows must be >= 0, not %zd", rows);
    if (resolve_array(m, x_obj, "x", dtype, rows, (Py_ssize_t)fl_nn_in_features(m->model), 0, &x) < 0 ||
        resolve_array(m, out_obj, "out", dtype, rows, (Py_ssize_t)fl_nn_out_features(m->model), 1, &out) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_nn_forward(m->model, x, rows, out);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK)
        return fl_raise(nn_state(self), rc, "forward");
    return Py_NewRef(out_obj);
}

/* Resolves x and y for backward/train_step. */
static int resolve_xy(ModelObject *m, PyObject *x_obj, PyObject *y_obj, Py_ssize_t rows, int kind, fl_nn_array *x, fl_nn_array *y) {
    if (kind != FL_NN_MSE && kind != FL_NN_CROSS_ENTROPY) {
        fl_raisef(NULL, FL_EXC_VALUE, "unknown loss %d", kind);
        return -1;
    }
    fl_dtype dtype = fl_nn_dtype(m->model);
    if (resolve_array(m, x_obj, "x", dtype, rows, (Py_ssize_t)fl_nn_in_features(m->model), 0, x) < 0)
        return -1;
    if (kind == FL_NN_MSE)
        return resolve_array(m, y_obj, "y", dtype, rows, (Py_ssize_t)fl_nn_out_features(m->model), 0, y);
    return resolve_array(m, y_obj, "y", FL_INT64, rows, -1, 0, y);
}

/* backward(x, y, rows, loss) -> loss value; the gradients replace the previous ones. */
static PyObject *model_backward(PyObject *self, PyObject *args) {
    static fl_arg_cache backward_args = FL_ARG_CACHE("backward"); /* positional only */
    PyObject *x_obj, *y_obj;
    Py_ssize_t rows;
    int kind;
    if (fl_parse_args_dict(&backward_args, args, NULL, FL_ARG("x", OBJECT, &x_obj),
                           FL_ARG("y", OBJECT, &y_obj), FL_ARG("rows", SSIZE, &rows),
                           FL_ARG("loss", INT, &kind)) < 0)
        return NULL;
    ModelObject *m = (ModelObject *)self;
    fl_nn_array x, y;
    if (resolve_xy(m, x_obj, y_obj, rows, kind, &x, &y) < 0)
        return NULL;
    double loss = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_nn_backward(m->model, x, y, rows, (fl_nn_loss)kind, &loss);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK)
        return fl_raise(nn_state(self), rc, "backward");
    return PyFloat_FromDouble(loss);
}

static PyObject *model_train_step(PyObject *self, PyObject *args) {
    static fl_arg_cache train_step_args = FL_ARG_CACHE("train_step"); /* positional only */
    PyObject *x_obj, *y_obj, *opt_obj;
    Py_ssize_t rows;
    int kind;
    if (fl_parse_args_dict(&train_step_args, args, NULL, FL_ARG("x", OBJECT, &x_obj),
                           FL_ARG("y", OBJECT, &y_obj), FL_ARG("rows", SSIZE, &rows),
                           FL_ARG("loss", INT, &kind), FL_ARG("opt", OBJECT, &opt_obj)) < 0)
        return NULL;
    ModelObject *m = (ModelObject *)self;
    fl_module_state *state = nn_state(self);
    if (!PyObject_TypeCheck(opt_obj, state->optimizer_type)) {
        fl_raisef(NULL, FL_EXC_TYPE, "opt must be an optimizer, not %.200s", Py_TYPE(opt_obj)->tp_name);
        return NULL;
    }
    OptimizerObject *opt = (OptimizerObject *)opt_obj;
    if (opt->model != m) {
        fl_raisef(NULL, FL_EXC_VALUE, "the optimizer was made for another model");
        return NULL;
    }
    fl_nn_array x, y;
    if (resolve_xy(m, x_obj, y_obj, rows, kind, &x, &y) < 0)
        return NULL;
    double loss = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_nn_train_step(m->model, opt->opt, x, y, rows, (fl_nn_loss)kind, &loss);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK)
        return fl_raise(nn_state(self), rc, "train_step");
    return PyFloat_FromDouble(loss);
}

static PyObject *model_get_backend(PyObject *self, void *unused) {
    (void)unused;
    return PyUnicode_FromString(fl_nn_backend_name(((ModelObject *)self)->model));
}

static PyMethodDef model_methods[] = {
    {"param_info", model_param_info, METH_NOARGS, "[(layer, is_bias, shape)] in torch's order."},
    {"get_param", model_get_param, METH_O, "A host copy of parameter i."},
    {"get_all", model_get_all, METH_O, "get_all(grad): host copies of every parameter (or gradient), one lock."},
    {"set_param", (PyCFunction)(void (*)(void))model_set_param, METH_FASTCALL | METH_KEYWORDS,
     "set_param(index, value): overwrite parameter `index` from a host array."},
    {"get_grad", model_get_grad, METH_O, "A host copy of the gradient of parameter i."},
    {"set_grad", (PyCFunction)(void (*)(void))model_set_grad, METH_FASTCALL | METH_KEYWORDS,
     "set_grad(index, grad): overwrite the gradient of parameter `index`."},
    {"forward", model_forward, METH_VARARGS, "forward(x, out, rows): out = model(x)."},
    {"backward", model_backward, METH_VARARGS, "backward(x, y, rows, loss) -> loss value."},
    {"train_step", model_train_step, METH_VARARGS, "train_step(x, y, rows, loss, opt) -> loss."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"backend", model_get_backend, NULL, "The backend's name: 'cpu' or 'cuda'.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot model_slots[] = {
    {Py_tp_doc, "The C model behind fastloop.nn.Sequential (private)."},
    {Py_tp_new, model_new},
    {Py_tp_dealloc, model_dealloc},
    {Py_tp_methods, model_methods},
    {Py_tp_getset, model_getset},
    {0, NULL},
};

static PyType_Spec model_spec = {
    .name = "fastloop._core._Model",
    .basicsize = sizeof(ModelObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = model_slots,
};

/* ---- _Optimizer ---- */

static int parse_hyper(PyObject *dict, fl_nn_hyper *h) {
    static const char *names[] = {"lr", "momentum", "weight_decay", "beta1", "beta2", "eps"};
    double *fields[] = {&h->lr, &h->momentum, &h->weight_decay, &h->beta1, &h->beta2, &h->eps};
    for (size_t i = 0; i < 6; i++) { /* strong references: another thread may change the dict */
        PyObject *v;
        if (PyDict_GetItemStringRef(dict, names[i], &v) < 0)
            return -1;
        int bad = v != NULL && (*fields[i] = PyFloat_AsDouble(v)) == -1.0 && PyErr_Occurred();
        Py_XDECREF(v);
        if (bad)
            return -1;
    }
    static const char *flags[] = {"nesterov", "decoupled"};
    int *flag_fields[] = {&h->nesterov, &h->decoupled};
    for (size_t i = 0; i < 2; i++) {
        PyObject *v;
        if (PyDict_GetItemStringRef(dict, flags[i], &v) < 0)
            return -1;
        int bad = v != NULL && (*flag_fields[i] = PyObject_IsTrue(v)) < 0;
        Py_XDECREF(v);
        if (bad)
            return -1;
    }
    return 0;
}

/* _Optimizer(model, kind, hyper: dict) with kind 0 SGD, 1 Adam. */
static PyObject *optimizer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache optimizer_args = FL_ARG_CACHE("_Optimizer");
    PyObject *model_obj, *hyper_obj;
    int kind;
    fl_module_state *state = fl_state_from_type(type);
    if (fl_parse_args_dict(&optimizer_args, args, kwargs, FL_ARG("model", OBJECT, &model_obj),
                           FL_ARG("kind", INT, &kind), FL_ARG("hyper", OBJECT, &hyper_obj)) < 0)
        return NULL;
    if (!PyObject_TypeCheck(model_obj, state->model_type))
        return fl_raisef(NULL, FL_EXC_TYPE, "_Optimizer() argument 'model' must be a _Model");
    if (!PyDict_Check(hyper_obj))
        return fl_raisef(NULL, FL_EXC_TYPE, "_Optimizer() argument 'hyper' must be a dict");
    fl_nn_hyper hyper = {0};
    if (parse_hyper(hyper_obj, &hyper) < 0)
        return NULL;
    OptimizerObject *self = (OptimizerObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->model = (ModelObject *)Py_NewRef(model_obj);
    int rc = fl_nn_optimizer_new(self->model->model, (fl_nn_optimizer_kind)kind, &hyper, &self->opt);
    return fl_result_or_raise(state, rc, (PyObject *)self, "optimizer");
}

static void optimizer_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    OptimizerObject *o = (OptimizerObject *)self;
    fl_nn_optimizer_free(o->opt); /* before the model it points into */
    Py_XDECREF(o->model);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *optimizer_step(PyObject *self, PyObject *unused) {
    (void)unused;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_nn_optimizer_step(((OptimizerObject *)self)->opt);
    Py_END_ALLOW_THREADS
    return rc == FL_OK ? Py_NewRef(Py_None) : fl_raise(nn_state(self), rc, "step");
}

/* The optimizer's hyper-parameters and step count sit under the model's lock, which a
 * train_step on another thread holds for the whole step: wait for it without the GIL. */
static void get_hyper(fl_nn_optimizer *opt, fl_nn_hyper *h) {
    Py_BEGIN_ALLOW_THREADS
        fl_nn_optimizer_get_hyper(opt, h);
    Py_END_ALLOW_THREADS
}

static PyObject *optimizer_get_hyper(PyObject *self, PyObject *unused) {
    (void)unused;
    fl_nn_hyper h;
    get_hyper(((OptimizerObject *)self)->opt, &h);
    return Py_BuildValue("{s:d,s:d,s:d,s:d,s:d,s:d,s:O,s:O}", "lr", h.lr, "momentum", h.momentum,
                         "weight_decay", h.weight_decay, "beta1", h.beta1, "beta2", h.beta2, "eps", h.eps,
                         "nesterov", h.nesterov ? Py_True : Py_False, "decoupled", h.decoupled ? Py_True : Py_False);
}

static PyObject *optimizer_set_hyper(PyObject *self, PyObject *dict) {
    if (!PyDict_Check(dict)) {
        fl_raisef(NULL, FL_EXC_TYPE, "set_hyper takes a dict");
        return NULL;
    }
    fl_nn_hyper h;
    fl_nn_optimizer *opt = ((OptimizerObject *)self)->opt;
    get_hyper(opt, &h);
    if (parse_hyper(dict, &h) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
        fl_nn_optimizer_set_hyper(opt, &h);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *optimizer_get_steps(PyObject *self, void *unused) {
    (void)unused;
    int64_t steps;
    Py_BEGIN_ALLOW_THREADS
        steps = fl_nn_optimizer_steps(((OptimizerObject *)self)->opt);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(steps);
}

static int optimizer_set_steps(PyObject *self, PyObject *value, void *unused) {
    (void)unused;
    long long steps = value ? PyLong_AsLongLong(value) : -1;
    if (steps < 0) {
        if (!PyErr_Occurred())
            fl_raisef(NULL, FL_EXC_VALUE, "steps must be an int >= 0");
        return -1;
    }
    fl_nn_optimizer *opt = ((OptimizerObject *)self)->opt;
    Py_BEGIN_ALLOW_THREADS
        fl_nn_optimizer_set_steps(opt, steps);
    Py_END_ALLOW_THREADS
    return 0;
}

static PyObject *optimizer_get_buffers(PyObject *self, void *unused) {
    (void)unused;
    int buffers;
    Py_BEGIN_ALLOW_THREADS
        buffers = fl_nn_optimizer_buffers(((OptimizerObject *)self)->opt);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(buffers);
}

/* get_state(i, which) -> host copy of state buffer `which` of parameter i. */
static PyObject *optimizer_get_state(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames) {
    static fl_arg_cache get_state_args = FL_ARG_CACHE("get_state");
    PyObject *index_obj;
    int which;
    if (fl_parse_args(&get_state_args, args, nargs, kwnames, FL_ARG("index", OBJECT, &index_obj),
                      FL_ARG("which", INT, &which)) < 0)
        return NULL;
    OptimizerObject *o = (OptimizerObject *)self;
    fl_nn_param_info info;
    int index = parse_index(o->model, index_obj, &info);
    PyObject *array = index < 0 ? NULL : param_array(o->model, &info);
    if (array == NULL)
        return NULL;
    void *data = PyArray_DATA((PyArrayObject *)array);
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_nn_optimizer_get_state(o->opt, index, which, data);
    Py_END_ALLOW_THREADS
    return fl_result_or_raise(nn_state(self), rc, array, "optimizer state");
}

static PyObject *optimizer_set_state(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames) {
    static fl_arg_cache set_state_args = FL_ARG_CACHE("set_state");
    PyObject *index_obj, *value;
    int which;
    if (fl_parse_args(&set_state_args, args, nargs, kwnames, FL_ARG("index", OBJECT, &index_obj),
                      FL_ARG("which", INT, &which), FL_ARG("array", OBJECT, &value)) < 0)
        return NULL;
    OptimizerObject *o = (OptimizerObject *)self;
    fl_nn_param_info info;
    fl_nn_array array;
    int index = parse_index(o->model, index_obj, &info);
    if (index < 0)
        return NULL;
    if (!PyArray_Check(value))
        return fl_raisef(NULL, FL_EXC_TYPE, "optimizer state must be a NumPy array");
    if (resolve_array(o->model, value, "state", fl_nn_dtype(o->model->model), (Py_ssize_t)info.rows, info.is_bias ? -1 : (Py_ssize_t)info.cols, 0, &array) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_nn_optimizer_set_state(o->opt, index, which, array.data);
    Py_END_ALLOW_THREADS
    return rc == FL_OK ? Py_NewRef(Py_None) : fl_raise(nn_state(self), rc, "optimizer state");
}

static PyMethodDef optimizer_methods[] = {
    {"step", optimizer_step, METH_NOARGS, "Apply one update from the model's gradients."},
    {"get_hyper", optimizer_get_hyper, METH_NOARGS, "The hyper-parameters as a dict."},
    {"set_hyper", optimizer_set_hyper, METH_O, "Replace some hyper-parameters (a dict)."},
    {"get_state", (PyCFunction)(void (*)(void))optimizer_get_state, METH_FASTCALL | METH_KEYWORDS,
     "get_state(index, which): a state buffer."},
    {"set_state", (PyCFunction)(void (*)(void))optimizer_set_state, METH_FASTCALL | METH_KEYWORDS,
     "set_state(index, which, array)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef optimizer_getset[] = {
    {"steps", optimizer_get_steps, optimizer_set_steps, "Updates applied so far.", NULL},
    {"buffers", optimizer_get_buffers, NULL, "State buffers per parameter (0, 1 or 2).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot optimizer_slots[] = {
    {Py_tp_doc, "The C optimizer behind fastloop.nn.SGD and Adam (private)."},
    {Py_tp_new, optimizer_new},
    {Py_tp_dealloc, optimizer_dealloc},
    {Py_tp_methods, optimizer_methods},
    {Py_tp_getset, optimizer_getset},
    {0, NULL},
};

static PyType_Spec optimizer_spec = {
    .name = "fastloop._core._Optimizer",
    .basicsize = sizeof(OptimizerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = optimizer_slots,
};

/* ---- BLAS ---- */

static PyObject *blas_load(PyObject *module, PyObject *path_obj) {
    PyObject *bytes;
    if (!PyUnicode_FSConverter(path_obj, &bytes))
        return NULL;
    int rc;
    const char *path = PyBytes_AS_STRING(bytes);
    Py_BEGIN_ALLOW_THREADS
        rc = fl_blas_load(path);
    Py_END_ALLOW_THREADS
    Py_DECREF(bytes);
    if (rc != FL_OK)
        return fl_raise_with(fl_state_from_module(module), rc, &(fl_raise_opts){.in = FL_IN_LIBRARY});
    return PyUnicode_FromString(fl_blas_describe());
}

static PyObject *blas_info(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return fl_blas_loaded() ? PyUnicode_FromString(fl_blas_describe()) : Py_NewRef(Py_None);
}

static PyObject *blas_set_threads(PyObject *module, PyObject *arg) {
    long threads = PyLong_AsLong(arg);
    if (threads == -1 && PyErr_Occurred())
        return NULL;
    if (threads < 1 || threads > 4096)
        return fl_raisef(NULL, FL_EXC_VALUE, "threads must be in 1..4096, not %ld", threads);
    if (fl_blas_set_threads((int)threads) != FL_OK)
        return fl_raise(fl_state_from_module(module), FL_EINVAL, "blas_set_threads");
    Py_RETURN_NONE;
}

static PyMethodDef blas_functions[] = {
    {"_blas_load", blas_load, METH_O, "Load the BLAS at a path; returns its description."},
    {"_blas_info", blas_info, METH_NOARGS, "The loaded BLAS's description, or None."},
    {"_blas_set_threads", blas_set_threads, METH_O, "Set the BLAS's thread count."},
    {NULL, NULL, 0, NULL},
};

int fl_nn_module_init(PyObject *module, fl_module_state *state) {
    state->model_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &model_spec, NULL);
    if (state->model_type == NULL || PyModule_AddType(module, state->model_type) < 0)
        return -1;
    state->optimizer_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &optimizer_spec, NULL);
    if (state->optimizer_type == NULL || PyModule_AddType(module, state->optimizer_type) < 0)
        return -1;
    return PyModule_AddFunctions(module, blas_functions);
}
