/* py_dlpack.c - DeviceArray.__dlpack__ and __dlpack_device__: the array exported without
 * a copy as a DLPack capsule, after making the consumer's stream wait for the array's
 * pending write (the Python array API standard's rules for `stream` on CUDA). */
#include "py_cuda.h"

#include <stdlib.h>

#include "fl_cuda_mem.h"
#include "fl_dlpack.h"

/* Drops the reference a capsule's tensor held on its DeviceArray. The consumer may call
 * the deleter from any thread, with or without the GIL. Once the interpreter is finalizing it
 * is too late to take the GIL (a thread that tries is ended or hangs): the reference leaks.
 * Py_IsFinalizing() is public from 3.13; py/fl_compat.h maps it to _Py_IsFinalizing() on
 * 3.9-3.12, where that is the only spelling (the GPU machines run 3.12). */
static void release_array(void *array) {
    if (Py_IsFinalizing())
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF((PyObject *)array);
    PyGILState_Release(gil);
}

static void delete_unversioned(fl_dl_managed_tensor *self) {
    release_array(self->manager_ctx);
    free(self);
}

static void delete_versioned(fl_dl_managed_tensor_versioned *self) {
    release_array(self->manager_ctx);
    free(self);
}

/* A capsule nobody consumed (still named "dltensor"/"dltensor_versioned") owns its tensor. */
static void destroy_unversioned(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        fl_dl_managed_tensor *m = PyCapsule_GetPointer(capsule, "dltensor");
        m->deleter(m);
    }
}

static void destroy_versioned(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        fl_dl_managed_tensor_versioned *m = PyCapsule_GetPointer(capsule, "dltensor_versioned");
        m->deleter(m);
    }
}

/* Fills a DLTensor describing `self`; dims holds 2 * ndim int64 (shape, then strides). */
static void describe(DeviceArray *self, fl_dl_tensor *t, int64_t *dims) {
    static const char kinds[] = "iufcb";
    static const uint8_t codes[] = {FL_DL_INT, FL_DL_UINT, FL_DL_FLOAT, FL_DL_COMPLEX, FL_DL_BOOL};
    t->data = self->data;
    t->device.device_type = FL_DL_CUDA;
    t->device.device_id = self->device;
    t->ndim = self->ndim;
    t->dtype.code = codes[strchr(kinds, self->descr->kind) - kinds]; /* kind checked at creation */
    t->dtype.bits = (uint8_t)(8 * PyDataType_ELSIZE(self->descr));
    t->dtype.lanes = 1;
    t->shape = dims;
    t->strides = dims + self->ndim;
    t->byte_offset = 0;
    int64_t stride = 1;
    for (int i = self->ndim - 1; i >= 0; i--) {
        dims[i] = self->shape[i];
        dims[self->ndim + i] = stride;
        stride *= self->shape[i];
    }
}

static PyObject *capsule_unversioned(DeviceArray *self) {
    fl_dl_managed_tensor *m = malloc(sizeof *m + 2 * (size_t)self->ndim * sizeof(int64_t));
    if (m == NULL)
        return PyErr_NoMemory();
    describe(self, &m->dl_tensor, (int64_t *)(m + 1));
    m->manager_ctx = Py_NewRef(self);
    m->deleter = delete_unversioned;
    PyObject *capsule = PyCapsule_New(m, "dltensor", destroy_unversioned);
    if (capsule == NULL)
        m->deleter(m);
    return capsule;
}

static PyObject *capsule_versioned(DeviceArray *self) {
    fl_dl_managed_tensor_versioned *m = malloc(sizeof *m + 2 * (size_t)self->ndim * sizeof(int64_t));
    if (m == NULL)
        return PyErr_NoMemory();
    m->version.major = FL_DLPACK_MAJOR;
    m->version.minor = FL_DLPACK_MINOR;
    m->flags = 0;
    describe(self, &m->dl_tensor, (int64_t *)(m + 1));
    m->manager_ctx = Py_NewRef(self);
    m->deleter = delete_versioned;
    PyObject *capsule = PyCapsule_New(m, "dltensor_versioned", destroy_versioned);
    if (capsule == NULL)
        m->deleter(m);
    return capsule;
}

/* The consumer's stream from __dlpack__'s `stream`: None -> the legacy default stream;
 * -1 -> *sync = 0; 0 and other negatives are refused (the standard's rules). */
static int consumer_stream(PyObject *obj, uintptr_t *stream, int *sync) {
    *sync = 1;
    *stream = FL_CUDA_LEGACY_STREAM;
    if (obj == Py_None)
        return 0;
    long long value = PyLong_AsLongLong(obj);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value == -1) {
        *sync = 0;
        return 0;
    }
    if (value <= 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'stream' %lld is not a CUDA stream (0 is ambiguous: pass 1 for the legacy default stream)", value);
        return -1;
    }
    *stream = (uintptr_t)value;
    return 0;
}

/* Checks dl_device (None or (2, this device)) and copy (None or False). */
static int check_export(DeviceArray *self, PyObject *dl_device, PyObject *copy) {
    if (dl_device != Py_None) {
        int type, id;
        if (!PyTuple_Check(dl_device) || !PyArg_ParseTuple(dl_device, "ii", &type, &id)) {
            fl_raisef(NULL, FL_EXC_TYPE, "'dl_device' must be a (device_type, device_id) tuple, not %R", dl_device);
            return -1;
        }
        if (type != FL_DL_CUDA || id != self->device) {
            fl_raisef(NULL, FL_EXC_BUFFER,
                      "this DeviceArray lives on CUDA device %d and cannot be exported to "
                      "DLPack device (%d, %d) without a copy; use to_numpy() for the host",
                      self->device, type, id);
            return -1;
        }
    }
    int copy_asked = copy == Py_None ? 0 : PyObject_IsTrue(copy);
    if (copy_asked < 0)
        return -1;
    if (copy_asked) {
        fl_raisef(NULL, FL_EXC_BUFFER, "DeviceArray.__dlpack__ exports without a copy (copy=True is not supported)");
        return -1;
    }
    return 0;
}

PyObject *fl_py_dlpack(DeviceArray *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache dlpack_args = FL_ARG_CACHE("__dlpack__");
    PyObject *stream_obj = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (fl_parse_args_dict(&dlpack_args, args, kwargs, FL_ARG("|$stream", OBJECT, &stream_obj),
                           FL_ARG("max_version", OBJECT, &max_version),
                           FL_ARG("dl_device", OBJECT, &dl_device),
                           FL_ARG("copy", OBJECT, &copy)) < 0)
        return NULL;
    uintptr_t stream;
    int sync, major = 0, minor = 0;
    if (consumer_stream(stream_obj, &stream, &sync) < 0 || check_export(self, dl_device, copy) < 0)
        return NULL;
    if (max_version != Py_None && (!PyTuple_Check(max_version) || !PyArg_ParseTuple(max_version, "ii", &major, &minor)))
        return fl_raisef(NULL, FL_EXC_TYPE, "'max_version' must be a (major, minor) tuple, not %R", max_version);
    if (sync) {
        int rc = fl_py_device_array_wait_stream(self, stream);
        if (rc != 0)
            return fl_py_raise_cuda(fl_py_state_of(Py_TYPE(self)), rc, "__dlpack__ stream wait");
    }
    return major >= 1 ? capsule_versioned(self) : capsule_unversioned(self);
}

PyObject *fl_py_dlpack_device(DeviceArray *self, PyObject *unused) {
    (void)unused;
    return Py_BuildValue("(ii)", FL_DL_CUDA, self->device);
}
