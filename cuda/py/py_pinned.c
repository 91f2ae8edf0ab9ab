/* py_pinned.c - fastloop.cuda.pin(array) -> PinnedRegion: page-locks a NumPy array's
 * buffer (cudaHostRegister, portable to every device) so copies from it run at full DMA
 * speed and asynchronously; close() (or the end of a `with` block, or the object going)
 * unregisters it. The region keeps the array alive while the pages are registered. */
#include "py_cuda.h"

#include <limits.h>
#include <structmember.h>

#include "fl_cuda_mem.h"

typedef struct PinnedRegion {
    PyObject_HEAD
    PyObject *array; /* NULL once closed; read and cleared under the region's critical section */
    void *ptr;
    Py_ssize_t nbytes;
    int device; /* current while registering and unregistering; -1: the caller's current one */
    char already; /* the range was registered before: not ours to unregister */
} PinnedRegion;

/* Unregisters (when this region registered) and drops the array; idempotent. The caller
 * that takes the array out (under the critical section) is the one that unregisters: a
 * close() racing it returns at once, while the pages may still be registered. */
static int region_release(PinnedRegion *self) {
    PyObject *array;
    Py_BEGIN_CRITICAL_SECTION(self);
    array = self->array;
    self->array = NULL;
    Py_END_CRITICAL_SECTION();
    int rc = 0;
    if (array != NULL && !self->already && self->nbytes > 0) {
        void *ptr = self->ptr;
        const int device = self->device;
        Py_BEGIN_ALLOW_THREADS
            rc = fl_cuda_host_unregister(device, ptr);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(array); /* after the unregister: the pages are the array's */
    return rc;
}

static int region_traverse(PinnedRegion *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->array);
    return 0;
}

static int region_clear(PinnedRegion *self) {
    region_release(self); /* the pages must not stay locked past the array */
    return 0;
}

static void region_dealloc(PinnedRegion *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    region_release(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *region_close(PinnedRegion *self, PyObject *unused) {
    (void)unused;
    int rc = region_release(self);
    if (rc != 0)
        return fl_py_raise_cuda(fl_py_state_of(Py_TYPE(self)), rc, "cudaHostUnregister");
    Py_RETURN_NONE;
}

static PyObject *region_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *region_exit(PinnedRegion *self, PyObject *args) {
    (void)args;
    return region_close(self, NULL);
}

static PyObject *get_closed(PinnedRegion *self, void *unused) {
    (void)unused;
    int closed;
    Py_BEGIN_CRITICAL_SECTION(self);
    closed = self->array == NULL;
    Py_END_CRITICAL_SECTION();
    return PyBool_FromLong(closed);
}

static PyMethodDef region_methods[] = {
    {"close", (PyCFunction)region_close, METH_NOARGS,
     "close()\n--\n\nUnregister the pages (unless they were pinned before pin() was called)\n"
     "and let go of the array. Idempotent."},
    {"__enter__", region_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)region_exit, METH_VARARGS, "Closes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef region_getset[] = {
    {"closed", (getter)get_closed, NULL, "True once close() ran.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef region_members[] = {
    {"nbytes", T_PYSSIZET, offsetof(PinnedRegion, nbytes), READONLY, "Bytes registered."},
    {"already_pinned", T_BOOL, offsetof(PinnedRegion, already), READONLY,
     "True when the memory was registered before (close() leaves it registered)."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot region_slots[] = {
    {Py_tp_doc, "PinnedRegion: a NumPy array's buffer page-locked by fastloop.cuda.pin()."},
    {Py_tp_dealloc, region_dealloc},
    {Py_tp_traverse, region_traverse},
    {Py_tp_clear, region_clear},
    {Py_tp_methods, region_methods},
    {Py_tp_getset, region_getset},
    {Py_tp_members, region_members},
    {0, NULL},
};

static PyType_Spec region_spec = {
    .name = "fastloop.cuda.PinnedRegion",
    .basicsize = sizeof(PinnedRegion),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = region_slots,
};

static PyObject *pin(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache pin_args = FL_ARG_CACHE("pin");
    PyObject *array, *device_obj = Py_None;
    if (fl_parse_args_dict(&pin_args, args, kwargs, FL_ARG("array", OBJECT, &array),
                           FL_ARG("|device", OBJECT, &device_obj)) < 0)
        return NULL;
    cuda_state *state = fl_py_state(module);
    if (!PyArray_Check(array) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)array))
        return fl_raisef(NULL, FL_EXC_TYPE, "'array' must be a C-contiguous NumPy array, not %.200s",
                         Py_TYPE(array)->tp_name);
    int device = -1; /* None: the thread's current device, no switch */
    if (device_obj != Py_None) {
        long value = PyLong_Check(device_obj) ? PyLong_AsLong(device_obj) : -1;
        if (value == -1 && PyErr_Occurred())
            return NULL;
        device = value > INT_MAX ? -1 : (int)value;
        if (!PyLong_Check(device_obj) || device < 0)
            return fl_raisef(NULL, FL_EXC_VALUE, "'device' must be None or a device index >= 0, not %R", device_obj);
    }
    if (fl_py_require_device(state, device < 0 ? 0 : device) < 0)
        return NULL;
    PinnedRegion *self = PyObject_GC_New(PinnedRegion, state->pinned_type);
    if (self == NULL)
        return NULL;
    self->array = NULL;
    self->ptr = PyArray_DATA((PyArrayObject *)array);
    self->nbytes = PyArray_NBYTES((PyArrayObject *)array);
    self->already = 0;
    self->device = device;
    int rc = 0;
    if (self->nbytes > 0) {
        void *ptr = self->ptr;
        size_t nbytes = (size_t)self->nbytes;
        int already;
        Py_BEGIN_ALLOW_THREADS /* locking many pages takes a while */
            rc = fl_cuda_host_register(device, ptr, nbytes, &already);
        Py_END_ALLOW_THREADS
        self->already = (char)already;
    }
    if (rc != 0) {
        Py_DECREF(self);
        char what[80];
        snprintf(what, sizeof what, "cudaHostRegister(%zd bytes)", PyArray_NBYTES((PyArrayObject *)array));
        return fl_py_raise_cuda(state, rc, what);
    }
    self->array = Py_NewRef(array);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyMethodDef pinned_functions[] = {
    {"pin", (PyCFunction)(void (*)(void))pin, METH_VARARGS | METH_KEYWORDS,
     "pin(array, /, device=None)\n--\n\nPage-lock a C-contiguous NumPy array's buffer for fast,\n"
     "asynchronous host-to-device copies (to every device); returns a PinnedRegion whose close()\n"
     "(or the end of a `with` block) unregisters it. `device`: the one made current for the\n"
     "call (a loader's, so no context is made on another GPU); None: the thread's current one.\n"
     "Pinning memory that is already pinned succeeds (already_pinned is then True). Raises\n"
     "fastloop.CudaError when the driver refuses."},
    {NULL, NULL, 0, NULL},
};

int fl_py_pinned_init(PyObject *module, cuda_state *state) {
    state->pinned_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &region_spec, NULL);
    if (state->pinned_type == NULL ||
        PyModule_AddObjectRef(module, "PinnedRegion", (PyObject *)state->pinned_type) < 0)
        return -1;
    FL_DISALLOW_INSTANTIATION(state->pinned_type);
    return PyModule_AddFunctions(module, pinned_functions);
}
