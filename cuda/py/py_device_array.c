/* py_device_array.c - fastloop.cuda.DeviceArray (device memory with a shape and a NumPy
 * dtype, C order) and the functions that make one: empty(), to_device(), _from_pointer().
 *
 * An array remembers the stream of its last queued write (preprocess, an async to_device)
 * and an event recorded after it: __cuda_array_interface__ and __dlpack__ hand that stream
 * to consumers, ready()/synchronize() ask about or wait for the event, and host memory a
 * queued copy still reads is kept alive until then.
 *
 * Free threading: that pending write (stream, stream_ref, pending_host, event, writes) is
 * the array's only state that changes after construction. It is read and written under the
 * array's critical section; a call that waits with the GIL released keeps a strong reference
 * to the stream's owner across the wait, and settles afterwards only if no write was queued
 * meanwhile (the `writes` count), since the section is suspended while it waits.
 */
#include "py_cuda.h"

#include <structmember.h>

#include "fl_cuda_mem.h"

/* ---- lifetime ---- */

static int array_traverse(DeviceArray *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    Py_VISIT(self->stream_ref);
    Py_VISIT(self->pending_host);
    return 0;
}

static int array_clear(DeviceArray *self) {
    Py_CLEAR(self->owner);
    Py_CLEAR(self->stream_ref);
    Py_CLEAR(self->pending_host);
    return 0;
}

static void array_dealloc(DeviceArray *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->owner == NULL && self->data != NULL) {
        void *event = self->event;
        const int reads_host = self->pending_host != NULL && event != NULL;
        Py_BEGIN_ALLOW_THREADS
            if (reads_host) /* a queued copy may still read pending_host: wait for it alone */
                fl_cuda_event_synchronize(event);
            /* kept for the next array of this size, reused once this one's use is done: no
             * cudaFree, which would wait for the whole device every batch */
            fl_cuda_cached_free(self->device, self->data, self->nbytes, event);
        Py_END_ALLOW_THREADS
    }
    fl_cuda_event_destroy(self->event); /* a wait queued on it still holds */
    array_clear(self); /* after the wait: a queued copy may still read pending_host */
    Py_XDECREF(self->descr);
    type->tp_free(self);
    Py_DECREF(type);
}

/* A new array object for `data` (not allocated here); descr is stolen. */
static DeviceArray *array_wrap(cuda_state *state, int device, int ndim, const Py_ssize_t *shape,
                               PyArray_Descr *descr, size_t nbytes) {
    DeviceArray *self = (DeviceArray *)state->device_array_type->tp_alloc(state->device_array_type, 0);
    if (self == NULL) {
        Py_DECREF(descr);
        return NULL;
    }
    self->descr = descr;
    self->device = device;
    self->ndim = ndim;
    self->nbytes = nbytes;
    for (int i = 0; i < ndim; i++)
        self->shape[i] = shape[i];
    return self;
}

/* ---- argument parsing ---- */

/* descr's dtype can live in a DeviceArray: bool, integer, float or complex, native order. */
static int descr_supported(PyArray_Descr *descr, const char *arg) {
    if (strchr("biufc", descr->kind) == NULL || !PyDataType_ISNOTSWAPPED(descr) ||
        PyDataType_ELSIZE(descr) == 0) {
        fl_raisef(NULL, FL_EXC_TYPE,
                  "'%s' must be a native bool, integer, float or complex dtype, not %R", arg,
                  (PyObject *)descr);
        return -1;
    }
    return 0;
}

/* Parses a dtype argument into a new descr reference; NULL with TypeError. */
static PyArray_Descr *parse_dtype(PyObject *obj) {
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(obj, &descr))
        return NULL;
    if (descr_supported(descr, "dtype") < 0) {
        Py_DECREF(descr);
        return NULL;
    }
    return descr;
}

/* Parses `shape` (an int or a sequence of ints >= 0) into shape[*ndim]. */
static int parse_shape(PyObject *obj, Py_ssize_t *shape, int *ndim) {
    if (PyLong_Check(obj)) {
        *ndim = 1;
        shape[0] = PyLong_AsSsize_t(obj);
    } else {
        PyObject *listed = PySequence_Fast(obj, "'shape' must be an int or a sequence of ints");
        PyObject *seq = listed != NULL ? PySequence_Tuple(listed) : NULL; /* a snapshot: another thread may change a list */
        Py_XDECREF(listed);
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > FL_PY_MAX_NDIM) {
            Py_DECREF(seq);
            fl_raisef(NULL, FL_EXC_VALUE, "'shape' has %zd dimensions, more than %d", n,
                      FL_PY_MAX_NDIM);
            return -1;
        }
        *ndim = (int)n;
        for (Py_ssize_t i = 0; i < n; i++)
            shape[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        Py_DECREF(seq);
    }
    for (int i = 0; i < *ndim; i++) {
        if (shape[i] == -1 && PyErr_Occurred())
            return -1;
        if (shape[i] < 0) {
            fl_raisef(NULL, FL_EXC_VALUE, "'shape' must hold sizes >= 0, not %zd", shape[i]);
            return -1;
        }
    }
    return 0;
}

/* The byte size of shape x itemsize, or -1 with ValueError on overflow. */
static int shape_bytes(int ndim, const Py_ssize_t *shape, size_t itemsize, size_t *nbytes) {
    size_t total = itemsize;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(total, (size_t)shape[i], &total) || total > PY_SSIZE_T_MAX) {
            fl_raisef(NULL, FL_EXC_VALUE, "'shape' is too large");
            return -1;
        }
    *nbytes = total;
    return 0;
}

static PyObject *shape_tuple(int ndim, const Py_ssize_t *shape) {
    PyObject *tuple = PyTuple_New(ndim);
    for (int i = 0; tuple != NULL && i < ndim; i++) {
        PyObject *item = PyLong_FromSsize_t(shape[i]);
        if (item == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, i, item);
    }
    return tuple;
}

PyArrayObject *fl_py_host_array(PyObject *obj, const char *arg) {
    PyArrayObject *array = (PyArrayObject *)PyArray_FromAny(obj, NULL, 0, 0, NPY_ARRAY_IN_ARRAY, NULL);
    if (array == NULL)
        return NULL;
    if (descr_supported(PyArray_DESCR(array), arg) < 0) {
        Py_DECREF(array);
        return NULL;
    }
    return array;
}

/* 1 when host array `array` has the DeviceArray's shape, else 0. */
static int same_shape(DeviceArray *self, PyArrayObject *array) {
    if (PyArray_NDIM(array) != self->ndim)
        return 0;
    for (int i = 0; i < self->ndim; i++)
        if (PyArray_DIM(array, i) != self->shape[i])
            return 0;
    return 1;
}

/* ---- the C interface other binding files use ---- */

DeviceArray *fl_py_device_array_new(cuda_state *state, int device, int ndim,
                                    const Py_ssize_t *shape, PyArray_Descr *descr) {
    size_t nbytes;
    if (shape_bytes(ndim, shape, (size_t)PyDataType_ELSIZE(descr), &nbytes) < 0) {
        Py_DECREF(descr);
        return NULL;
    }
    DeviceArray *self = array_wrap(state, device, ndim, shape, descr, nbytes);
    if (self == NULL || nbytes == 0)
        return self;
    int rc;
    void *data = NULL;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_cuda_cached_malloc(device, nbytes, &data); /* a dropped array's block, or cudaMalloc */
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_DECREF(self);
        char what[64];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", nbytes);
        return (DeviceArray *)fl_py_raise_cuda(state, rc, what);
    }
    self->data = data;
    return self;
}

DeviceArray *fl_py_device_array_check(cuda_state *state, PyObject *obj, const char *arg) {
    if (!PyObject_TypeCheck(obj, state->device_array_type)) {
        fl_raisef(NULL, FL_EXC_TYPE, "'%s' must be a fastloop.cuda.DeviceArray, not %.200s", arg, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (DeviceArray *)obj;
}

int fl_py_device_array_queued(cuda_state *state, DeviceArray *array, uintptr_t stream,
                              PyObject *ref, PyObject *host) {
    PyObject *old_ref = NULL, *old_host = NULL;
    int rc;
    Py_BEGIN_CRITICAL_SECTION(array);
    rc = fl_cuda_event_record(array->device, &array->event, stream); /* never blocks */
    if (rc == 0) {
        old_ref = array->stream_ref, old_host = array->pending_host;
        array->stream = stream;
        array->stream_ref = Py_XNewRef(ref);
        array->pending_host = Py_XNewRef(host);
        array->writes++;
    }
    Py_END_CRITICAL_SECTION();
    Py_XDECREF(old_ref); /* outside the section: a dealloc may run any code */
    Py_XDECREF(old_host);
    if (rc != 0) {
        fl_py_raise_cuda(state, rc, "cudaEventRecord");
        return -1;
    }
    return 0;
}

int fl_py_device_array_wait_stream(DeviceArray *array, uintptr_t stream) {
    int rc = 0;
    Py_BEGIN_CRITICAL_SECTION(array);
    if (array->stream != 0 && array->stream != stream)
        /* the array's own event, recorded after its write: not the stream as it is now, which
         * may already hold the next batch's copy */
        rc = array->event != NULL ? fl_cuda_stream_wait_event(array->device, stream, array->event)
                                  : fl_cuda_stream_wait(array->device, stream, array->stream);
    Py_END_CRITICAL_SECTION();
    return rc;
}

/* The array's pending write, read at once under its critical section. */
typedef struct pending_write {
    uintptr_t stream;     /* 0: none pending */
    PyObject *stream_ref; /* a strong reference keeping `stream` alive, or NULL: release it */
    void *event;          /* NULL until the first queued write; then kept until dealloc */
    uint64_t writes;      /* what settle() compares */
} pending_write;

static void pending_read(DeviceArray *self, pending_write *p) {
    Py_BEGIN_CRITICAL_SECTION(self);
    p->stream = self->stream;
    p->stream_ref = Py_XNewRef(self->stream_ref);
    p->event = self->event;
    p->writes = self->writes;
    Py_END_CRITICAL_SECTION();
}

/* Marks the array as having no pending write, after a wait for the writes counted in `seen`;
 * a write queued since (by another thread) stays pending. Never fails. */
static void settle(DeviceArray *self, uint64_t seen) {
    PyObject *ref = NULL, *host = NULL;
    Py_BEGIN_CRITICAL_SECTION(self);
    if (self->writes == seen) {
        ref = self->stream_ref, host = self->pending_host;
        self->stream = 0;
        self->stream_ref = self->pending_host = NULL;
    }
    Py_END_CRITICAL_SECTION();
    Py_XDECREF(ref);
    Py_XDECREF(host);
}

/* The stream a synchronous copy of the array runs on: after its pending write, if any. */
static uintptr_t copy_stream(const pending_write *p) {
    return p->stream ? p->stream : FL_CUDA_LEGACY_STREAM;
}

/* ---- getters ---- */

static PyObject *get_shape(DeviceArray *self, void *unused) {
    (void)unused;
    return shape_tuple(self->ndim, self->shape);
}

static PyObject *get_dtype(DeviceArray *self, void *unused) {
    (void)unused;
    return Py_NewRef(self->descr);
}

static PyObject *get_size(DeviceArray *self, void *unused) {
    (void)unused;
    Py_ssize_t size = 1;
    for (int i = 0; i < self->ndim; i++)
        size *= self->shape[i];
    return PyLong_FromSsize_t(size);
}

static PyObject *get_ptr(DeviceArray *self, void *unused) {
    (void)unused;
    return PyLong_FromVoidPtr(self->data);
}

static PyObject *get_cai(DeviceArray *self, void *unused) {
    (void)unused;
    uintptr_t pending;
    Py_BEGIN_CRITICAL_SECTION(self);
    pending = self->stream;
    Py_END_CRITICAL_SECTION();
    PyObject *shape = shape_tuple(self->ndim, self->shape);
    PyObject *typestr = PyObject_GetAttrString((PyObject *)self->descr, "str");
    PyObject *stream = pending ? PyLong_FromSize_t(pending) : Py_NewRef(Py_None);
    PyObject *result = NULL;
    if (shape != NULL && typestr != NULL && stream != NULL)
        result = Py_BuildValue("{s:O,s:O,s:(NO),s:O,s:i,s:O}", "shape", shape, "typestr", typestr,
                               "data", PyLong_FromVoidPtr(self->data), Py_False, "strides",
                               Py_None, "version", 3, "stream", stream);
    Py_XDECREF(shape);
    Py_XDECREF(typestr);
    Py_XDECREF(stream);
    return result;
}

static PyGetSetDef array_getset[] = {
    {"shape", (getter)get_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"dtype", (getter)get_dtype, NULL, "The NumPy dtype of the elements.", NULL},
    {"size", (getter)get_size, NULL, "The number of elements.", NULL},
    {"ptr", (getter)get_ptr, NULL, "The device address of the first element, an int.", NULL},
    {"__cuda_array_interface__", (getter)get_cai, NULL,
     "Numba's CUDA Array Interface, version 3; 'stream' is the stream of the last queued\n"
     "write (None when none is pending).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef array_members[] = {
    {"device", T_INT, offsetof(DeviceArray, device), READONLY, "The CUDA device index."},
    {"ndim", T_INT, offsetof(DeviceArray, ndim), READONLY, "The number of dimensions."},
    {"nbytes", T_PYSSIZET, offsetof(DeviceArray, nbytes), READONLY, "The size in bytes."},
    {NULL, 0, 0, 0, NULL},
};

/* ---- methods ---- */

static PyObject *array_to_numpy(DeviceArray *self, PyObject *unused) {
    (void)unused;
    cuda_state *state = fl_py_state_of(Py_TYPE(self));
    npy_intp dims[FL_PY_MAX_NDIM];
    for (int i = 0; i < self->ndim; i++)
        dims[i] = self->shape[i];
    Py_INCREF(self->descr); /* stolen by NewFromDescr */
    PyObject *out = PyArray_NewFromDescr(&PyArray_Type, self->descr, self->ndim, dims, NULL, NULL, 0, NULL);
    if (out == NULL || self->nbytes == 0)
        return out;
    int rc;
    pending_write p;
    pending_read(self, &p);
    const uintptr_t stream = copy_stream(&p);
    Py_BEGIN_ALLOW_THREADS
        rc = fl_cuda_to_host(self->device, PyArray_DATA((PyArrayObject *)out), self->data,
                             self->nbytes, stream);
    Py_END_ALLOW_THREADS
    Py_XDECREF(p.stream_ref);
    if (rc != 0) {
        Py_DECREF(out);
        return fl_py_raise_cuda(state, rc, "cudaMemcpyAsync(device to host)");
    }
    settle(self, p.writes);
    return out;
}

/* Copies host (the array's shape and dtype) into the array after its pending write and
 * waits for the copy. Returns 0, or -1 with CudaError. */
static int copy_in_waited(cuda_state *state, DeviceArray *self, PyArrayObject *host) {
    int rc = 0;
    pending_write p;
    pending_read(self, &p);
    const uintptr_t stream = copy_stream(&p);
    if (self->nbytes > 0) {
        Py_BEGIN_ALLOW_THREADS
            rc = fl_cuda_to_device(self->device, self->data, PyArray_DATA(host), self->nbytes,
                                   stream, 1);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(p.stream_ref);
    if (rc != 0) {
        fl_py_raise_cuda(state, rc, "cudaMemcpyAsync(host to device)");
        return -1;
    }
    settle(self, p.writes);
    return 0;
}

static PyObject *array_copy_from_numpy(DeviceArray *self, PyObject *arr) {
    cuda_state *state = fl_py_state_of(Py_TYPE(self));
    Py_INCREF(self->descr); /* stolen by FromAny; a cast that is not safe raises TypeError */
    PyArrayObject *host = (PyArrayObject *)PyArray_FromAny(arr, self->descr, 0, 0, NPY_ARRAY_IN_ARRAY, NULL);
    if (host == NULL)
        return NULL;
    if (!same_shape(self, host)) {
        PyObject *want = shape_tuple(self->ndim, self->shape);
        fl_raisef(NULL, FL_EXC_VALUE, "'arr' must have the array's shape %R", want);
        Py_XDECREF(want);
        Py_DECREF(host);
        return NULL;
    }
    const int rc = copy_in_waited(state, self, host);
    Py_DECREF(host);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *array_ready(DeviceArray *self, PyObject *unused) {
    (void)unused;
    int done = 1;
    pending_write p;
    pending_read(self, &p);
    Py_XDECREF(p.stream_ref); /* the event outlives the stream */
    if (p.stream != 0 && p.event != NULL) {
        int rc = fl_cuda_event_query(p.event, &done);
        if (rc != 0)
            return fl_py_raise_cuda(fl_py_state_of(Py_TYPE(self)), rc, "cudaEventQuery");
    }
    if (done)
        settle(self, p.writes);
    return PyBool_FromLong(done);
}

static PyObject *array_synchronize(DeviceArray *self, PyObject *unused) {
    (void)unused;
    pending_write p;
    pending_read(self, &p);
    Py_XDECREF(p.stream_ref); /* the event outlives the stream */
    if (p.stream != 0 && p.event != NULL) {
        int rc;
        Py_BEGIN_ALLOW_THREADS /* the event is kept until dealloc, and `self` is alive */
            rc = fl_cuda_event_synchronize(p.event);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            return fl_py_raise_cuda(fl_py_state_of(Py_TYPE(self)), rc, "cudaEventSynchronize");
    }
    settle(self, p.writes);
    Py_RETURN_NONE;
}

static PyObject *array_repr(DeviceArray *self) {
    PyObject *shape = shape_tuple(self->ndim, self->shape);
    if (shape == NULL)
        return NULL;
    PyObject *repr = PyUnicode_FromFormat("DeviceArray(shape=%R, dtype=%S, device=%d)", shape,
                                          (PyObject *)self->descr, self->device);
    Py_DECREF(shape);
    return repr;
}

/* _queued(stream, host): notes a write fastloop queued on `stream` by other means (the JPEG
 * decoder), keeping `host` (the memory it reads) alive until the array is settled. */
static PyObject *array_mark_queued(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames) {
    static fl_arg_cache queued_args = FL_ARG_CACHE("_queued");
    PyObject *stream_obj, *host, *ref = NULL;
    uintptr_t stream;
    cuda_state *state = fl_py_state_of(Py_TYPE(self));
    if (fl_parse_args(&queued_args, args, nargs, kwnames, FL_ARG("stream", OBJECT, &stream_obj),
                      FL_ARG("host", OBJECT, &host)) < 0 ||
        fl_py_parse_stream(state, stream_obj, self->device, &stream, &ref) < 0 ||
        fl_py_device_array_queued(state, self, stream, ref, host) < 0)
        return NULL;
    return Py_NewRef(self);
}

static PyMethodDef array_methods[] = {
    {"_queued", (PyCFunction)(void (*)(void))array_mark_queued, METH_FASTCALL | METH_KEYWORDS,
     "_queued(stream, host)\n--\n\nNote a write queued on `stream` that reads `host`; returns self."},
    {"to_numpy", (PyCFunction)array_to_numpy, METH_NOARGS,
     "to_numpy()\n--\n\nA new NumPy array holding a copy (waits for the array's pending write\n"
     "and the copy)."},
    {"copy_from_numpy", (PyCFunction)array_copy_from_numpy, METH_O,
     "copy_from_numpy(arr, /)\n--\n\nCopy a host array of the same shape (and a dtype that\n"
     "casts safely) into this array; returns once the copy is done."},
    {"ready", (PyCFunction)array_ready, METH_NOARGS,
     "ready()\n--\n\nTrue once the last queued write (and the copy from host memory it reads)\n"
     "is done; never blocks. A loader slot given to preprocess() can be reused then."},
    {"synchronize", (PyCFunction)array_synchronize, METH_NOARGS,
     "synchronize()\n--\n\nWait (GIL released) until the last queued write is done."},
    {"__dlpack__", (PyCFunction)(void (*)(void))fl_py_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "A DLPack capsule of this array (no copy); the consumer's `stream` waits for the\n"
     "array's pending write (stream -1: no wait)."},
    {"__dlpack_device__", (PyCFunction)fl_py_dlpack_device, METH_NOARGS,
     "__dlpack_device__()\n--\n\n(2, device): kDLCUDA and the device index."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot array_slots[] = {
    {Py_tp_doc, "DeviceArray: CUDA device memory with a shape and a NumPy dtype (C order).\n\n"
                "Made by fastloop.cuda.empty(), to_device() and preprocess(); exported\n"
                "without a copy through __cuda_array_interface__ and __dlpack__\n"
                "(torch.from_dlpack(array)). Not constructible directly."},
    {Py_tp_dealloc, array_dealloc},
    {Py_tp_traverse, array_traverse},
    {Py_tp_clear, array_clear},
    {Py_tp_repr, array_repr},
    {Py_tp_methods, array_methods},
    {Py_tp_getset, array_getset},
    {Py_tp_members, array_members},
    {0, NULL},
};

static PyType_Spec array_spec = {
    .name = "fastloop.cuda.DeviceArray",
    .basicsize = sizeof(DeviceArray),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = array_slots,
};

/* ---- module functions ---- */

static PyObject *empty(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache empty_args = FL_ARG_CACHE("empty");
    PyObject *shape_obj, *dtype_obj;
    int device = 0, ndim;
    Py_ssize_t shape[FL_PY_MAX_NDIM];
    if (fl_parse_args_dict(&empty_args, args, kwargs, FL_ARG("shape", OBJECT, &shape_obj),
                           FL_ARG("dtype", OBJECT, &dtype_obj),
                           FL_ARG("|device", INT, &device)) < 0 ||
        parse_shape(shape_obj, shape, &ndim) < 0)
        return NULL;
    PyArray_Descr *descr = parse_dtype(dtype_obj);
    if (descr == NULL)
        return NULL;
    cuda_state *state = fl_py_state(module);
    if (fl_py_require_device(state, device) < 0) {
        Py_DECREF(descr);
        return NULL;
    }
    return (PyObject *)fl_py_device_array_new(state, device, ndim, shape, descr);
}

/* `out` checked against the host array, or a new array for it; a new reference. */
static DeviceArray *output_for(cuda_state *state, PyObject *out_obj, PyArrayObject *host,
                               int device) {
    if (out_obj == NULL || out_obj == Py_None) {
        Py_INCREF(PyArray_DESCR(host));
        Py_ssize_t shape[FL_PY_MAX_NDIM];
        for (int i = 0; i < PyArray_NDIM(host); i++)
            shape[i] = PyArray_DIM(host, i);
        return fl_py_device_array_new(state, device, PyArray_NDIM(host), shape, PyArray_DESCR(host));
    }
    DeviceArray *out = fl_py_device_array_check(state, out_obj, "out");
    if (out == NULL)
        return NULL;
    if (!same_shape(out, host) || !PyArray_EquivTypes(out->descr, PyArray_DESCR(host)) ||
        out->device != device) {
        fl_raisef(NULL, FL_EXC_VALUE, "'out' must match 'array' in shape and dtype and be on device %d, not %R",
                  device, out_obj);
        return NULL;
    }
    return (DeviceArray *)Py_NewRef(out_obj);
}

/* Copies host into out: waited for without a stream, else queued on it. */
static int copy_in(cuda_state *state, DeviceArray *out, PyArrayObject *host, PyObject *stream_obj) {
    if (stream_obj == NULL || stream_obj == Py_None)
        return copy_in_waited(state, out, host);
    uintptr_t stream;
    PyObject *ref; /* borrowed from stream_obj, alive for the call */
    if (fl_py_parse_stream(state, stream_obj, out->device, &stream, &ref) < 0)
        return -1;
    int rc = fl_py_device_array_wait_stream(out, stream); /* after out's pending write */
    if (rc == 0 && out->nbytes > 0) {
        Py_BEGIN_ALLOW_THREADS
            rc = fl_cuda_to_device(out->device, out->data, PyArray_DATA(host), out->nbytes, stream, 0);
        Py_END_ALLOW_THREADS
    }
    if (rc != 0) {
        fl_py_raise_cuda(state, rc, "cudaMemcpyAsync(host to device)");
        return -1;
    }
    return fl_py_device_array_queued(state, out, stream, ref, (PyObject *)host);
}

static PyObject *to_device(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache to_device_args = FL_ARG_CACHE("to_device");
    PyObject *array_obj, *stream_obj = NULL, *out_obj = NULL;
    int device = 0;
    if (fl_parse_args_dict(&to_device_args, args, kwargs, FL_ARG("array", OBJECT, &array_obj),
                           FL_ARG("|device", INT, &device), FL_ARG("$stream", OBJECT, &stream_obj),
                           FL_ARG("out", OBJECT, &out_obj)) < 0)
        return NULL;
    cuda_state *state = fl_py_state(module);
    PyArrayObject *host = fl_py_host_array(array_obj, "array");
    if (host == NULL)
        return NULL;
    DeviceArray *out = NULL;
    if (fl_py_require_device(state, device) == 0)
        out = output_for(state, out_obj, host, device);
    if (out != NULL && copy_in(state, out, host, stream_obj) < 0)
        Py_CLEAR(out);
    Py_DECREF(host);
    return (PyObject *)out;
}

static PyObject *from_pointer(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache from_pointer_args = FL_ARG_CACHE("_from_pointer");
    PyObject *ptr_obj, *shape_obj, *dtype_obj, *owner, *stream_obj = Py_None;
    int device, ndim;
    Py_ssize_t shape[FL_PY_MAX_NDIM];
    if (fl_parse_args_dict(&from_pointer_args, args, kwargs, FL_ARG("ptr", OBJECT, &ptr_obj),
                           FL_ARG("shape", OBJECT, &shape_obj), FL_ARG("dtype", OBJECT, &dtype_obj),
                           FL_ARG("device", INT, &device), FL_ARG("owner", OBJECT, &owner),
                           FL_ARG("|stream", OBJECT, &stream_obj)) < 0 ||
        parse_shape(shape_obj, shape, &ndim) < 0)
        return NULL;
    void *ptr = PyLong_AsVoidPtr(ptr_obj);
    if (ptr == NULL && PyErr_Occurred())
        return NULL;
    if (owner == Py_None || device < 0)
        return fl_raisef(NULL, FL_EXC_VALUE, "'owner' must not be None and 'device' must be >= 0");
    cuda_state *state = fl_py_state(module);
    PyArray_Descr *descr = parse_dtype(dtype_obj);
    size_t nbytes;
    if (descr == NULL)
        return NULL;
    if (shape_bytes(ndim, shape, (size_t)PyDataType_ELSIZE(descr), &nbytes) < 0) {
        Py_DECREF(descr);
        return NULL;
    }
    uintptr_t stream = 0;
    PyObject *ref = NULL;
    if (stream_obj != Py_None && fl_py_parse_stream(state, stream_obj, device, &stream, &ref) < 0) {
        Py_DECREF(descr);
        return NULL;
    }
    DeviceArray *self = array_wrap(state, device, ndim, shape, descr, nbytes);
    if (self == NULL)
        return NULL;
    self->data = ptr;
    self->owner = Py_NewRef(owner);
    self->stream = stream;
    self->stream_ref = Py_XNewRef(ref);
    return (PyObject *)self;
}

static PyMethodDef array_functions[] = {
    {"empty", (PyCFunction)(void (*)(void))empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype, device=0)\n--\n\nA DeviceArray of uninitialized memory."},
    {"to_device", (PyCFunction)(void (*)(void))to_device, METH_VARARGS | METH_KEYWORDS,
     "to_device(array, device=0, *, stream=None, out=None)\n--\n\nCopy a host array to the\n"
     "device. Without `stream` the copy is done on return; with one it is queued there and\n"
     "returns at once (ready()/synchronize() on the result; the host array is kept alive\n"
     "until then). `out`: a DeviceArray of the same shape and dtype to reuse."},
    {"_from_pointer", (PyCFunction)(void (*)(void))from_pointer, METH_VARARGS | METH_KEYWORDS,
     "_from_pointer(ptr, shape, dtype, device, owner, stream=None)\n--\n\nA DeviceArray view\n"
     "of device memory that `owner` keeps alive (for fastloop's own C code: nothing is\n"
     "checked about `ptr`). `stream`: where a write to it may still be pending."},
    {NULL, NULL, 0, NULL},
};

int fl_py_device_array_init(PyObject *module, cuda_state *state) {
    state->device_array_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &array_spec, NULL);
    if (state->device_array_type == NULL ||
        PyModule_AddObjectRef(module, "DeviceArray", (PyObject *)state->device_array_type) < 0)
        return -1;
    FL_DISALLOW_INSTANTIATION(state->device_array_type);
    return PyModule_AddFunctions(module, array_functions);
}
