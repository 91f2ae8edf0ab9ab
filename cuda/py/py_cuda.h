/* py_cuda.h - what the binding files of fastloop._cuda share: the module state, error
 * conversion, the DeviceArray struct and the argument helpers.
 *
 * The binding is thin: it parses and checks arguments (naming them in TypeError and
 * ValueError), makes one call into cuda/'s C interface with the GIL released when it can
 * block, and turns a cudaError_t into fastloop.CudaError.
 */
#ifndef FL_PY_CUDA_H
#define FL_PY_CUDA_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "py/fl_compat.h"
#include "base/fl_error.h"
#include "py/fl_exc.h"
#include "py/py_args.h"
#include <stdint.h>

#include "py_numpy.h"

/* Per-module state (no C globals). */
typedef struct cuda_state {
    fl_exc_classes exc; /* the exception table's classes (py/fl_exc.h), shared with _core */
    PyTypeObject *device_array_type;
    PyTypeObject *stream_type;
    PyTypeObject *pinned_type;
    PyTypeObject *nn_context_type;
    PyTypeObject *jpeg_decoder_type;
} cuda_state;

/* The state of the module that defines `type` (the types are final: no subclasses). */
static inline cuda_state *fl_py_state_of(PyTypeObject *type) {
    return (cuda_state *)PyType_GetModuleState(type);
}
static inline cuda_state *fl_py_state(PyObject *module) {
    return (cuda_state *)PyModule_GetState(module);
}

/* Raises fastloop.CudaError("<what>: <string> (<name>, code N)") with .code FL_ECUDA and
 * .cuda_code N. Returns NULL. */
PyObject *fl_py_raise_cuda(cuda_state *state, int code, const char *what);

/* The body of a `<name>_load(path=None)` binding (cache names it): loads a dlopened CUDA
 * library with the GIL released through load(path, why, why_len), as fl_cublas_load() and
 * fl_nvjpeg_load() take it (path None: the default names). Returns the loaded file's path
 * (str), or NULL with CudaUnavailable("<what> could not be loaded: <why>"). */
PyObject *fl_py_load_library(PyObject *module, PyObject *args, PyObject *kwargs,
                             fl_arg_cache *cache,
                             int (*load)(const char *path, char *why, size_t why_len),
                             const char *(*loaded_path)(void), const char *what);

/* Checks that CUDA can run and `device` exists, before anything touches the GPU: returns 0,
 * or -1 with CudaUnavailable (no driver, no device) or ValueError (no such device). */
int fl_py_require_device(cuda_state *state, int device);

#define FL_PY_MAX_NDIM 32

/* fastloop.cuda.DeviceArray: device memory with a shape and a NumPy dtype (C order).
 * The fields down to `owner` are set before the array is shared and only read after. The
 * pending write's fields change after construction (queued/settled): they are read and written
 * under the array's critical section, by py_device_array.c only (the helpers below). */
typedef struct DeviceArray {
    PyObject_HEAD
    char *data;   /* device pointer; NULL when nbytes is 0 */
    size_t nbytes;
    int ndim;
    Py_ssize_t shape[FL_PY_MAX_NDIM];
    PyArray_Descr *descr;
    int device;
    PyObject *owner;        /* a view's owner (keeps `data` alive); NULL: this array frees it */
    uintptr_t stream;       /* stream of the last queued write; 0 when none is pending */
    PyObject *stream_ref;   /* keeps a fastloop Stream behind `stream` alive, or NULL */
    PyObject *pending_host; /* host memory a queued copy still reads, or NULL */
    void *event;            /* recorded after the last queued write, or NULL; once made, kept */
    uint64_t writes;        /* writes queued so far: a wait settles only the ones it saw */
} DeviceArray;

/* A new DeviceArray of device memory on `device` (descr is stolen): a block a dropped array of
 * the same size left (fl_cuda_cached_malloc), or cudaMalloc'd. NULL on error. */
DeviceArray *fl_py_device_array_new(cuda_state *state, int device, int ndim,
                                    const Py_ssize_t *shape, PyArray_Descr *descr);

/* `obj` as a DeviceArray (borrowed), or NULL with TypeError naming argument `arg`. */
DeviceArray *fl_py_device_array_check(cuda_state *state, PyObject *obj, const char *arg);

/* Notes a write just queued on `stream` (ref: the object to keep alive with it, may be
 * NULL; host: host memory the write still reads, may be NULL) and records the array's
 * event after it, under the array's critical section. Returns 0, or -1 with CudaError. */
int fl_py_device_array_queued(cuda_state *state, DeviceArray *array, uintptr_t stream,
                              PyObject *ref, PyObject *host);

/* Makes work queued later on `stream` wait for the array's pending write (nothing to do
 * when none is pending or it is on `stream`): on the array's own event, recorded right after
 * that write, so not on later work of the writer's stream (the next batch's copy); a view made
 * by _from_pointer() has no event and waits for its stream as it is now. Under the array's
 * critical section. Never blocks the host. Returns 0 or a cudaError_t code. */
int fl_py_device_array_wait_stream(DeviceArray *array, uintptr_t stream);

/* __dlpack__ and __dlpack_device__ of a DeviceArray (py_dlpack.c). */
PyObject *fl_py_dlpack(DeviceArray *self, PyObject *args, PyObject *kwargs);
PyObject *fl_py_dlpack_device(DeviceArray *self, PyObject *unused);

/* Parses a `stream` argument: None -> the legacy default stream (1); a fastloop Stream
 * (*ref = it, borrowed); an int handle (0 means the legacy default stream, as torch's
 * default stream reports 0); or an object with an int `cuda_stream` (torch.cuda.Stream).
 * Returns 0, or -1 with TypeError/ValueError naming "stream". */
int fl_py_parse_stream(cuda_state *state, PyObject *obj, int device, uintptr_t *handle,
                       PyObject **ref);

/* A NumPy array view of `obj` that is C-contiguous and aligned with a dtype a DeviceArray
 * can hold (bool, integers, floats, complex), as a new reference; NULL with TypeError
 * naming `arg`. */
PyArrayObject *fl_py_host_array(PyObject *obj, const char *arg);

/* Type and function registration of each binding file. */
int fl_py_device_array_init(PyObject *module, cuda_state *state);
int fl_py_stream_init(PyObject *module, cuda_state *state);
int fl_py_pinned_init(PyObject *module, cuda_state *state);
int fl_py_preprocess_init(PyObject *module);
int fl_py_nn_testing_init(PyObject *module, cuda_state *state);
int fl_py_gpu_decode_init(PyObject *module, cuda_state *state);

#endif
