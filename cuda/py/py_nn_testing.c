/* py_nn_testing.c - fastloop._cuda._NNContext: the CUDA nn backend's ops on DeviceArrays,
 * one method per op, for tests that compare them with NumPy. Each method checks shapes,
 * calls the op with the GIL released, then waits for the context's stream, so results
 * can be read with to_numpy() at once. Not a public API: fastloop.nn drives the backend
 * through its capsule.
 *
 * The backend takes one op at a time per context (fl_nn_backend.h; fastloop.nn's model
 * holds its lock): each method takes the context's mutex after checking its arguments,
 * and finish() (or the method) lets it go after reading the op's error message. */
#include "py_cuda.h"

#include <math.h>
#include <pthread.h>

#include "base/fl_error.h"
#include "fl_cuda.h"

typedef struct NNContext {
    PyObject_HEAD
    const fl_nn_backend *backend;
    void *ctx;
    pthread_mutex_t lock; /* held from an op to its result: the op, sync and error(ctx) */
} NNContext;

static cuda_state *state_of(NNContext *self) { return fl_py_state_of(Py_TYPE(self)); }

/* Takes the context's lock, waiting with the GIL released: its holder may take the GIL back
 * before letting go, so no thread may wait for it while holding the GIL (or, free-threaded,
 * attached, which would also stall a stop-the-world pause). */
static void ctx_lock(NNContext *self) {
    if (pthread_mutex_trylock(&self->lock) == 0)
        return;
    Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->lock);
    Py_END_ALLOW_THREADS
}

/* Raises for an op's error code through the table (FL_EINVAL ValueError, FL_ENOMEM MemoryError,
 * FL_ECUDA CudaError), with the backend's message. Returns NULL. */
static PyObject *raise_op(NNContext *self, int err) {
    const char *message = self->backend->error(self->ctx);
    PyObject *text = PyUnicode_FromString(message);
    fl_exc_raise(&state_of(self)->exc, fl_exc_for_code(err, FL_IN_CORE), text, (fl_exc_codes){.code = err});
    Py_XDECREF(text);
    return NULL;
}

/* The op's result, the lock held: on success, waits for the stream and returns None. Lets
 * the lock go. */
static PyObject *finish(NNContext *self, int err) {
    if (err == 0) {
        Py_BEGIN_ALLOW_THREADS
            err = self->backend->sync(self->ctx);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = err != 0 ? raise_op(self, err) : Py_NewRef(Py_None);
    pthread_mutex_unlock(&self->lock);
    return result;
}

static PyObject *nn_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache nncontext_args = FL_ARG_CACHE("_NNContext");
    int device = 0;
    if (fl_parse_args_dict(&nncontext_args, args, kwargs, FL_ARG("|device", INT, &device)) < 0)
        return NULL;
    cuda_state *state = fl_py_state_of(type);
    if (fl_py_require_device(state, device) < 0)
        return NULL;
    const fl_nn_backend *backend = fl_cuda_nn_backend();
    void *ctx;
    const char *why;
    int err;
    Py_BEGIN_ALLOW_THREADS
        err = backend->open(device, &ctx, &why);
    Py_END_ALLOW_THREADS
    if (err != 0)
        return fl_raisef(&state->exc, FL_EXC_CUDA_UNAVAILABLE, "CUDA is not available: %s", why);
    NNContext *self = (NNContext *)type->tp_alloc(type, 0);
    if (self == NULL) {
        backend->close(ctx);
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    self->backend = backend;
    self->ctx = ctx;
    return (PyObject *)self;
}

static void nn_dealloc(NNContext *self) {
    PyTypeObject *type = Py_TYPE(self);
    if (self->ctx != NULL) {
        Py_BEGIN_ALLOW_THREADS
            self->backend->close(self->ctx);
        Py_END_ALLOW_THREADS
    }
    pthread_mutex_destroy(&self->lock);
    type->tp_free(self);
    Py_DECREF(type);
}

/* Checks `count` DeviceArray arguments: all float32 or all float64 (*dtype). */
static int float_arrays(NNContext *self, int count, PyObject **objs, const char **names,
                        DeviceArray **arrays, fl_dtype *dtype) {
    for (int i = 0; i < count; i++) {
        if ((arrays[i] = fl_py_device_array_check(state_of(self), objs[i], names[i])) == NULL)
            return -1;
        int type = arrays[i]->descr->type_num;
        if ((type != NPY_FLOAT32 && type != NPY_FLOAT64) ||
            (i > 0 && type != arrays[0]->descr->type_num)) {
            fl_raisef(NULL, FL_EXC_TYPE, "'%s' must be float32 or float64 like '%s'", names[i], names[0]);
            return -1;
        }
    }
    *dtype = arrays[0]->descr->type_num == NPY_FLOAT32 ? FL_FLOAT32 : FL_FLOAT64;
    return 0;
}

static int64_t size_of(DeviceArray *a) {
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++)
        n *= a->shape[i];
    return n;
}

static PyObject *shape_error(const char *what) {
    return fl_raisef(NULL, FL_EXC_VALUE, "shapes do not fit: %s", what);
}

static PyObject *nn_gemm(NNContext *self, PyObject *args) {
    int ta, tb;
    double alpha, beta;
    PyObject *objs[3];
    DeviceArray *m[3];
    fl_dtype dtype;
    static const char *names[3] = {"a", "b", "c"};
    if (!PyArg_ParseTuple(args, "ppdOOdO:gemm", &ta, &tb, &alpha, &objs[0], &objs[1], &beta, &objs[2]) ||
        float_arrays(self, 3, objs, names, m, &dtype) < 0)
        return NULL;
    if (m[0]->ndim != 2 || m[1]->ndim != 2 || m[2]->ndim != 2)
        return shape_error("gemm takes 2-D arrays");
    const int64_t rows = m[2]->shape[0], cols = m[2]->shape[1];
    const int64_t k = ta ? m[0]->shape[0] : m[0]->shape[1];
    if ((ta ? m[0]->shape[1] : m[0]->shape[0]) != rows || (tb ? m[1]->shape[1] : m[1]->shape[0]) != k ||
        (tb ? m[1]->shape[0] : m[1]->shape[1]) != cols)
        return shape_error("op(a) @ op(b) must be c's shape");
    int err;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        err = self->backend->gemm(self->ctx, dtype, ta, tb, rows, cols, k, alpha, m[0]->data, m[0]->shape[1],
                                  m[1]->data, m[1]->shape[1], beta, m[2]->data, m[2]->shape[1]);
    Py_END_ALLOW_THREADS
    return finish(self, err);
}

static PyObject *nn_fill_rows(NNContext *self, PyObject *args) {
    PyObject *objs[2];
    DeviceArray *m[2];
    fl_dtype dtype;
    static const char *names[2] = {"out", "row"};
    if (!PyArg_ParseTuple(args, "OO:fill_rows", &objs[0], &objs[1]) || float_arrays(self, 2, objs, names, m, &dtype) < 0)
        return NULL;
    if (m[0]->ndim != 2 || m[1]->ndim != 1 || m[1]->shape[0] != m[0]->shape[1])
        return shape_error("out (rows, cols), row (cols,)");
    int err;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        err = self->backend->fill_rows(self->ctx, dtype, m[0]->data, m[0]->shape[0], m[0]->shape[1], m[1]->data);
    Py_END_ALLOW_THREADS
    return finish(self, err);
}

static PyObject *nn_sum_rows(NNContext *self, PyObject *args) {
    PyObject *objs[2];
    DeviceArray *m[2];
    fl_dtype dtype;
    static const char *names[2] = {"input", "out"};
    if (!PyArg_ParseTuple(args, "OO:sum_rows", &objs[0], &objs[1]) || float_arrays(self, 2, objs, names, m, &dtype) < 0)
        return NULL;
    if (m[0]->ndim != 2 || m[1]->ndim != 1 || m[1]->shape[0] != m[0]->shape[1])
        return shape_error("input (rows, cols), out (cols,)");
    int err;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        err = self->backend->sum_rows(self->ctx, dtype, m[0]->data, m[0]->shape[0], m[0]->shape[1], m[1]->data);
    Py_END_ALLOW_THREADS
    return finish(self, err);
}

static PyObject *nn_relu(NNContext *self, PyObject *args) {
    PyObject *objs[2];
    DeviceArray *m[2];
    fl_dtype dtype;
    static const char *names[2] = {"input", "out"};
    if (!PyArg_ParseTuple(args, "OO:relu", &objs[0], &objs[1]) || float_arrays(self, 2, objs, names, m, &dtype) < 0)
        return NULL;
    if (size_of(m[0]) != size_of(m[1]))
        return shape_error("input and out differ in size");
    int err;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        err = self->backend->relu(self->ctx, dtype, m[0]->data, m[1]->data, size_of(m[0]));
    Py_END_ALLOW_THREADS
    return finish(self, err);
}

static PyObject *nn_relu_backward(NNContext *self, PyObject *args) {
    PyObject *objs[3];
    DeviceArray *m[3];
    fl_dtype dtype;
    static const char *names[3] = {"out", "grad_out", "grad_in"};
    if (!PyArg_ParseTuple(args, "OOO:relu_backward", &objs[0], &objs[1], &objs[2]) ||
        float_arrays(self, 3, objs, names, m, &dtype) < 0)
        return NULL;
    if (size_of(m[0]) != size_of(m[1]) || size_of(m[0]) != size_of(m[2]))
        return shape_error("out, grad_out and grad_in differ in size");
    int err;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        err = self->backend->relu_backward(self->ctx, dtype, m[0]->data, m[1]->data, m[2]->data, size_of(m[0]));
    Py_END_ALLOW_THREADS
    return finish(self, err);
}

/* loss(kind, output, target, grad=None) -> float; kind "mse" or "cross_entropy". */
static PyObject *nn_loss(NNContext *self, PyObject *args) {
    const char *kind_name;
    PyObject *objs[2], *target_obj, *grad_obj = Py_None;
    DeviceArray *m[2];
    fl_dtype dtype;
    static const char *names[2] = {"output", "grad"};
    if (!PyArg_ParseTuple(args, "sOO|O:loss", &kind_name, &objs[0], &target_obj, &grad_obj))
        return NULL;
    const int ce = strcmp(kind_name, "cross_entropy") == 0;
    if (!ce && strcmp(kind_name, "mse") != 0)
        return fl_raisef(NULL, FL_EXC_VALUE, "'kind' must be 'mse' or 'cross_entropy', not '%s'", kind_name);
    objs[1] = grad_obj == Py_None ? objs[0] : grad_obj;
    DeviceArray *target = fl_py_device_array_check(state_of(self), target_obj, "target");
    if (target == NULL || float_arrays(self, 2, objs, names, m, &dtype) < 0)
        return NULL;
    if (m[0]->ndim != 2 || size_of(m[1]) != size_of(m[0]))
        return shape_error("output (rows, cols) and grad of its size");
    const int64_t rows = m[0]->shape[0], cols = m[0]->shape[1];
    if (ce ? (target->descr->type_num != NPY_INT64 || size_of(target) != rows)
           : (target->descr->type_num != m[0]->descr->type_num || size_of(target) != rows * cols))
        return shape_error("target: int64 (rows,) labels, or output's dtype and size for mse");
    double value = 0;
    int err;
    void *grad = grad_obj == Py_None ? NULL : m[1]->data;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        err = self->backend->loss(self->ctx, dtype, ce ? FL_NN_CROSS_ENTROPY : FL_NN_MSE, m[0]->data, target->data,
                                  rows, cols, grad, &value);
    Py_END_ALLOW_THREADS
    PyObject *result = err != 0 ? raise_op(self, err) : PyFloat_FromDouble(value);
    pthread_mutex_unlock(&self->lock);
    return result;
}

/* A required keyword-only float: PyArg formats cannot say "required" after '$' on every
 * Python (3.9 wants '|' before '$'), so it defaults to NaN and is checked here. */
static int require_lr(double lr, const char *function) {
    if (isnan(lr)) {
        fl_raisef(NULL, FL_EXC_TYPE, "%s() missing required keyword-only argument 'lr'", function);
        return -1;
    }
    return 0;
}

static PyObject *nn_sgd(NNContext *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache sgd_args = FL_ARG_CACHE("sgd");
    PyObject *objs[3];
    DeviceArray *m[3];
    fl_dtype dtype;
    fl_nn_sgd_args a = {NAN, 0, 0, 0, 0}; /* lr: required, NaN until given */
    static const char *names[3] = {"param", "grad", "buf"};
    if (fl_parse_args_dict(&sgd_args, args, kwargs, FL_ARG("param", OBJECT, &objs[0]),
                           FL_ARG("grad", OBJECT, &objs[1]), FL_ARG("buf", OBJECT, &objs[2]),
                           FL_ARG("|$lr", DOUBLE, &a.lr), FL_ARG("momentum", DOUBLE, &a.momentum),
                           FL_ARG("weight_decay", DOUBLE, &a.weight_decay),
                           FL_ARG("nesterov", BOOL, &a.nesterov),
                           FL_ARG("first_step", BOOL, &a.first_step)) < 0 ||
        require_lr(a.lr, "sgd") < 0)
        return NULL;
    const int with_buf = objs[2] != Py_None;
    if (!with_buf)
        objs[2] = objs[0];
    if (float_arrays(self, 3, objs, names, m, &dtype) < 0)
        return NULL;
    if (size_of(m[0]) != size_of(m[1]) || size_of(m[0]) != size_of(m[2]))
        return shape_error("param, grad and buf differ in size");
    int err;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        err = self->backend->sgd(self->ctx, dtype, m[0]->data, m[1]->data, with_buf ? m[2]->data : NULL,
                                 size_of(m[0]), &a);
    Py_END_ALLOW_THREADS
    return finish(self, err);
}

static PyObject *nn_adam(NNContext *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache adam_args = FL_ARG_CACHE("adam");
    PyObject *objs[4];
    DeviceArray *m[4];
    fl_dtype dtype;
    fl_nn_adam_args a = {NAN, 0.9, 0.999, 1e-8, 0, 0, 1}; /* lr: required, NaN until given */
    long long step = 1;
    static const char *names[4] = {"param", "grad", "exp_avg", "exp_avg_sq"};
    if (fl_parse_args_dict(&adam_args, args, kwargs, FL_ARG("param", OBJECT, &objs[0]),
                           FL_ARG("grad", OBJECT, &objs[1]), FL_ARG("exp_avg", OBJECT, &objs[2]),
                           FL_ARG("exp_avg_sq", OBJECT, &objs[3]), FL_ARG("|$lr", DOUBLE, &a.lr),
                           FL_ARG("beta1", DOUBLE, &a.beta1), FL_ARG("beta2", DOUBLE, &a.beta2),
                           FL_ARG("eps", DOUBLE, &a.eps),
                           FL_ARG("weight_decay", DOUBLE, &a.weight_decay),
                           FL_ARG("decoupled", BOOL, &a.decoupled),
                           FL_ARG("step", INT64, &step)) < 0 ||
        require_lr(a.lr, "adam") < 0 || float_arrays(self, 4, objs, names, m, &dtype) < 0)
        return NULL;
    a.step = step;
    for (int i = 1; i < 4; i++)
        if (size_of(m[i]) != size_of(m[0]))
            return shape_error("param, grad, exp_avg and exp_avg_sq differ in size");
    int err;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        err = self->backend->adam(self->ctx, dtype, m[0]->data, m[1]->data, m[2]->data, m[3]->data, size_of(m[0]), &a);
    Py_END_ALLOW_THREADS
    return finish(self, err);
}

/* alloc(nbytes) -> int address; raises MemoryError with the backend's message. */
static PyObject *nn_alloc(NNContext *self, PyObject *arg) {
    Py_ssize_t bytes = PyLong_AsSsize_t(arg);
    if (bytes <= 0)
        return PyErr_Occurred() ? NULL : fl_raisef(NULL, FL_EXC_VALUE, "'nbytes' must be > 0");
    void *ptr;
    ctx_lock(self);
    Py_BEGIN_ALLOW_THREADS
        ptr = self->backend->alloc(self->ctx, (size_t)bytes);
    Py_END_ALLOW_THREADS
    PyObject *result = ptr == NULL ? raise_op(self, FL_ENOMEM) : PyLong_FromVoidPtr(ptr);
    pthread_mutex_unlock(&self->lock);
    return result;
}

static PyObject *nn_free(NNContext *self, PyObject *arg) {
    void *ptr = PyLong_AsVoidPtr(arg);
    if (ptr == NULL && PyErr_Occurred())
        return NULL;
    ctx_lock(self);
    self->backend->free(self->ctx, ptr);
    return finish(self, 0);
}

/* to_device(dst, host), to_host(src, host), copy(dst, src), zero(array): bytes as dst's. */
static PyObject *nn_transfer(NNContext *self, PyObject *args) {
    const char *what;
    PyObject *dst_obj, *src_obj;
    if (!PyArg_ParseTuple(args, "sOO:_transfer", &what, &dst_obj, &src_obj))
        return NULL;
    DeviceArray *dst = fl_py_device_array_check(state_of(self), dst_obj, "array"), *src = NULL;
    if (dst == NULL)
        return NULL;
    const int copy = strcmp(what, "copy") == 0, zero = strcmp(what, "zero") == 0;
    void *host = NULL;
    if (copy) {
        src = fl_py_device_array_check(state_of(self), src_obj, "src");
        if (src == NULL || src->nbytes != dst->nbytes)
            return src ? shape_error("copy: sizes differ") : NULL;
    } else if (!zero) {
        if (!PyArray_Check(src_obj) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)src_obj) ||
            (size_t)PyArray_NBYTES((PyArrayObject *)src_obj) != dst->nbytes)
            return shape_error("host: a C-contiguous NumPy array of the same byte size");
        host = PyArray_DATA((PyArrayObject *)src_obj);
    }
    int err;
    ctx_lock(self);
    if (copy) {
        err = self->backend->copy(self->ctx, dst->data, src->data, dst->nbytes);
    } else if (zero) {
        err = self->backend->zero(self->ctx, dst->data, dst->nbytes);
    } else {
        Py_BEGIN_ALLOW_THREADS
            err = strcmp(what, "to_host") == 0 ? self->backend->to_host(self->ctx, host, dst->data, dst->nbytes)
                                               : self->backend->to_device(self->ctx, dst->data, host, dst->nbytes);
        Py_END_ALLOW_THREADS
    }
    return finish(self, err);
}

static PyObject *nn_wait_stream(NNContext *self, PyObject *arg) {
    size_t stream = PyLong_AsSize_t(arg);
    if (stream == (size_t)-1 && PyErr_Occurred())
        return NULL;
    ctx_lock(self);
    return finish(self, self->backend->wait_stream(self->ctx, (uintptr_t)stream));
}

static PyMethodDef nn_methods[] = {
    {"gemm", (PyCFunction)nn_gemm, METH_VARARGS, "gemm(trans_a, trans_b, alpha, a, b, beta, c)"},
    {"fill_rows", (PyCFunction)nn_fill_rows, METH_VARARGS, "fill_rows(out, row)"},
    {"sum_rows", (PyCFunction)nn_sum_rows, METH_VARARGS, "sum_rows(input, out)"},
    {"relu", (PyCFunction)nn_relu, METH_VARARGS, "relu(input, out)"},
    {"relu_backward", (PyCFunction)nn_relu_backward, METH_VARARGS, "relu_backward(out, grad_out, grad_in)"},
    {"loss", (PyCFunction)nn_loss, METH_VARARGS, "loss(kind, output, target, grad=None) -> float"},
    {"sgd", (PyCFunction)(void (*)(void))nn_sgd, METH_VARARGS | METH_KEYWORDS,
     "sgd(param, grad, buf, *, lr, momentum=0, weight_decay=0, nesterov=False, first_step=False)"},
    {"adam", (PyCFunction)(void (*)(void))nn_adam, METH_VARARGS | METH_KEYWORDS,
     "adam(param, grad, exp_avg, exp_avg_sq, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0,\n"
     "     decoupled=False, step=1)"},
    {"alloc", (PyCFunction)nn_alloc, METH_O, "alloc(nbytes) -> int"},
    {"free", (PyCFunction)nn_free, METH_O, "free(ptr)"},
    {"_transfer", (PyCFunction)nn_transfer, METH_VARARGS,
     "_transfer(what, array, other): 'to_device'/'to_host' (other: NumPy), 'copy' (other:\n"
     "a DeviceArray source), 'zero' (other ignored)"},
    {"wait_stream", (PyCFunction)nn_wait_stream, METH_O, "wait_stream(handle)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot nn_slots[] = {
    {Py_tp_doc, "_NNContext(device=0)\n--\n\nTest-only: the CUDA nn backend's ops on DeviceArrays."},
    {Py_tp_new, nn_new},
    {Py_tp_dealloc, nn_dealloc},
    {Py_tp_methods, nn_methods},
    {0, NULL},
};

static PyType_Spec nn_spec = {
    .name = "fastloop._cuda._NNContext",
    .basicsize = sizeof(NNContext),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = nn_slots,
};

int fl_py_nn_testing_init(PyObject *module, cuda_state *state) {
    state->nn_context_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &nn_spec, NULL);
    if (state->nn_context_type == NULL)
        return -1;
    return PyModule_AddObjectRef(module, "_NNContext", (PyObject *)state->nn_context_type);
}
