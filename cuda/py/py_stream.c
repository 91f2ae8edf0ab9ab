/* py_stream.c - fastloop.cuda.Stream (a non-blocking CUDA stream) and the parsing of every
 * `stream` argument of fastloop._cuda. A Stream is destroyed only when its object goes,
 * and arrays with a write pending on it keep the object alive, so a handle they report is
 * never stale. */
#include "py_cuda.h"

#include <structmember.h>

#include "fl_cuda_mem.h"

typedef struct Stream {
    PyObject_HEAD
    uintptr_t handle;
    int device;
} Stream;

static PyObject *stream_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache stream_args = FL_ARG_CACHE("Stream");
    int device = 0;
    if (fl_parse_args_dict(&stream_args, args, kwargs, FL_ARG("|device", INT, &device)) < 0)
        return NULL;
    cuda_state *state = fl_py_state_of(type);
    if (fl_py_require_device(state, device) < 0)
        return NULL;
    uintptr_t handle;
    int rc = fl_cuda_stream_create(device, &handle);
    if (rc != 0)
        return fl_py_raise_cuda(state, rc, "cudaStreamCreateWithFlags");
    Stream *self = (Stream *)type->tp_alloc(type, 0);
    if (self == NULL) {
        fl_cuda_stream_destroy(device, handle);
        return NULL;
    }
    self->handle = handle;
    self->device = device;
    return (PyObject *)self;
}

static void stream_dealloc(Stream *self) {
    PyTypeObject *type = Py_TYPE(self);
    fl_cuda_stream_destroy(self->device, self->handle); /* queued work still completes */
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *stream_synchronize(Stream *self, PyObject *unused) {
    (void)unused;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_cuda_stream_synchronize(self->device, self->handle);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return fl_py_raise_cuda(fl_py_state_of(Py_TYPE(self)), rc, "cudaStreamSynchronize");
    Py_RETURN_NONE;
}

static PyObject *stream_query(Stream *self, PyObject *unused) {
    (void)unused;
    int done, rc = fl_cuda_stream_query(self->device, self->handle, &done);
    if (rc != 0)
        return fl_py_raise_cuda(fl_py_state_of(Py_TYPE(self)), rc, "cudaStreamQuery");
    return PyBool_FromLong(done);
}

static PyObject *stream_wait(Stream *self, PyObject *other) {
    cuda_state *state = fl_py_state_of(Py_TYPE(self));
    uintptr_t producer;
    PyObject *ref;
    if (fl_py_parse_stream(state, other, self->device, &producer, &ref) < 0)
        return NULL;
    int rc = fl_cuda_stream_wait(self->device, self->handle, producer);
    if (rc != 0)
        return fl_py_raise_cuda(state, rc, "cudaStreamWaitEvent");
    Py_RETURN_NONE;
}

static PyObject *stream_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *stream_exit(Stream *self, PyObject *args) {
    (void)args;
    return stream_synchronize(self, NULL);
}

static PyObject *stream_repr(Stream *self) {
    char handle[32]; /* hex of a size_t: PyUnicode_FromFormat has no such conversion before 3.13 */
    snprintf(handle, sizeof handle, "0x%zx", (size_t)self->handle);
    return PyUnicode_FromFormat("Stream(device=%d, handle=%s)", self->device, handle);
}

static PyObject *get_handle(Stream *self, void *unused) {
    (void)unused;
    return PyLong_FromSize_t(self->handle);
}

static PyMethodDef stream_methods[] = {
    {"synchronize", (PyCFunction)stream_synchronize, METH_NOARGS,
     "synchronize()\n--\n\nWait (GIL released) for everything queued on the stream."},
    {"query", (PyCFunction)stream_query, METH_NOARGS,
     "query()\n--\n\nTrue when everything queued on the stream is done; never blocks."},
    {"wait", (PyCFunction)stream_wait, METH_O,
     "wait(stream, /)\n--\n\nMake work queued later here wait for what is queued now on\n"
     "`stream` (a Stream, an int handle or a torch.cuda.Stream); the host does not wait."},
    {"__enter__", stream_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)stream_exit, METH_VARARGS, "Synchronizes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef stream_getset[] = {
    {"handle", (getter)get_handle, NULL, "The cudaStream_t as an int.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef stream_members[] = {
    {"device", T_INT, offsetof(Stream, device), READONLY, "The CUDA device index."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot stream_slots[] = {
    {Py_tp_doc, "Stream(device=0)\n--\n\nA non-blocking CUDA stream (no implicit ordering with\n"
                "the legacy default stream). `with Stream() as s:` synchronizes at the end.\n"
                "Destroyed when the object goes; queued work still completes."},
    {Py_tp_new, stream_new},
    {Py_tp_dealloc, stream_dealloc},
    {Py_tp_repr, stream_repr},
    {Py_tp_methods, stream_methods},
    {Py_tp_getset, stream_getset},
    {Py_tp_members, stream_members},
    {0, NULL},
};

static PyType_Spec stream_spec = {
    .name = "fastloop.cuda.Stream",
    .basicsize = sizeof(Stream),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = stream_slots,
};

/* An int stream handle; 0 (torch's default stream) is the legacy default stream. */
static int int_handle(PyObject *obj, uintptr_t *handle) {
    long long value = PyLong_AsLongLong(obj);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'stream' must be a CUDA stream handle >= 0, not %lld", value);
        return -1;
    }
    *handle = value == 0 ? FL_CUDA_LEGACY_STREAM : (uintptr_t)value;
    return 0;
}

int fl_py_parse_stream(cuda_state *state, PyObject *obj, int device, uintptr_t *handle,
                       PyObject **ref) {
    *ref = NULL;
    *handle = FL_CUDA_LEGACY_STREAM;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (PyObject_TypeCheck(obj, state->stream_type)) {
        Stream *stream = (Stream *)obj;
        if (stream->device != device) {
            fl_raisef(NULL, FL_EXC_VALUE, "'stream' is on device %d, not %d", stream->device, device);
            return -1;
        }
        *handle = stream->handle;
        *ref = obj;
        return 0;
    }
    if (PyLong_Check(obj) && !PyBool_Check(obj))
        return int_handle(obj, handle);
    PyObject *attr = PyObject_GetAttrString(obj, "cuda_stream"); /* torch.cuda.Stream */
    if (attr == NULL || !PyLong_Check(attr)) {
        Py_XDECREF(attr);
        PyErr_Clear();
        fl_raisef(NULL, FL_EXC_TYPE,
                  "'stream' must be None, a fastloop.cuda.Stream, an int handle or an object "
                  "with an int 'cuda_stream', not %.200s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    int rc = int_handle(attr, handle);
    Py_DECREF(attr);
    *ref = obj;
    return rc;
}

int fl_py_stream_init(PyObject *module, cuda_state *state) {
    state->stream_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &stream_spec, NULL);
    if (state->stream_type == NULL)
        return -1;
    return PyModule_AddObjectRef(module, "Stream", (PyObject *)state->stream_type);
}
