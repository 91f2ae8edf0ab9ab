/* py_cuda.c - fastloop._cuda: the module (device queries, the self-test, cuBLAS loading,
 * the nn backend capsule, the copy benchmark), loaded lazily by fastloop.cuda; the types
 * live in py_device_array.c, py_stream.c, py_pinned.c, py_nn_testing.c. CUDA failures
 * raise fastloop.CudaError with the cudaError_t code (`.cuda_code`). */
#define FL_PY_NUMPY_IMPORT
#include "py_cuda.h"

#include <cuda_runtime_api.h> /* cudaGetDevice only: a query the .cu wrappers do not need */

#include "fl_cublas.h"
#include "fl_cuda.h"
#include "fl_cuda_mem.h"
#ifdef FL_TESTING
#include <string.h>

#include "fl_cuda_device.h"
#include "fl_cuda_preprocess.h"
#endif

PyObject *fl_py_raise_cuda(cuda_state *state, int code, const char *what) {
    PyObject *message = PyUnicode_FromFormat(
        "%s: %s (%s, code %d)", what, fl_cuda_error_string(code), fl_cuda_error_name(code), code);
    fl_exc_raise(&state->exc, FL_EXC_CUDA, message, (fl_exc_codes){.code = FL_ECUDA, .cuda_code = code});
    Py_XDECREF(message);
    return NULL;
}

int fl_py_require_device(cuda_state *state, int device) {
    int count, rc;
    Py_BEGIN_ALLOW_THREADS /* the first call loads the driver */
        rc = fl_cuda_device_count(&count);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        fl_raisef(&state->exc, FL_EXC_CUDA_UNAVAILABLE, "CUDA is not available: cudaGetDeviceCount: %s (%s)",
                  fl_cuda_error_string(rc), fl_cuda_error_name(rc));
        return -1;
    }
    if (count == 0) {
        fl_raisef(&state->exc, FL_EXC_CUDA_UNAVAILABLE, "CUDA is not available: no CUDA device");
        return -1;
    }
    if (device < 0 || device >= count) {
        fl_raisef(NULL, FL_EXC_VALUE, "'device' %d does not exist: %d CUDA device(s)", device,
                  count);
        return -1;
    }
    return 0;
}

/* raise_cuda for module-level functions. */
static PyObject *raise_cuda(PyObject *module, int code, const char *what) {
    return fl_py_raise_cuda(fl_py_state(module), code, what);
}

static PyObject *runtime_version(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromLong(fl_cuda_runtime_version());
}

static PyObject *driver_version(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    int version;
    Py_BEGIN_ALLOW_THREADS
        version = fl_cuda_driver_version();
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(version);
}

static PyObject *device_count(PyObject *module, PyObject *unused) {
    (void)unused;
    int count, rc;
    Py_BEGIN_ALLOW_THREADS /* the first call loads the driver: can take a while */
        rc = fl_cuda_device_count(&count);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_cuda(module, rc, "cudaGetDeviceCount");
    return PyLong_FromLong(count);
}

/* The calling thread's current device (cudaGetDevice): what device="cuda" means when torch
 * has not chosen one. It makes no context. */
static PyObject *current_device(PyObject *module, PyObject *unused) {
    (void)unused;
    int device = 0;
    cudaError_t rc;
    Py_BEGIN_ALLOW_THREADS /* the first runtime call loads the driver */
        rc = cudaGetDevice(&device);
    Py_END_ALLOW_THREADS
    if (rc != cudaSuccess)
        return raise_cuda(module, (int)rc, "cudaGetDevice");
    return PyLong_FromLong(device);
}

static PyObject *device_info(PyObject *module, PyObject *arg) {
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (value < 0 || value > 1 << 16) {
        fl_raisef(NULL, FL_EXC_VALUE, "device index must be >= 0, not %ld", value);
        return NULL;
    }
    int index = (int)value;
    fl_cuda_device info;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_cuda_device_info(index, &info);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_cuda(module, rc, "cudaGetDeviceProperties");
    return Py_BuildValue("{s:i,s:s,s:n,s:(ii),s:i,s:i}", "index", index, "name", info.name,
                         "total_memory", (Py_ssize_t)info.total_memory, "compute_capability",
                         info.major, info.minor, "multiprocessors", info.multiprocessors,
                         "pci_bus_id", info.pci_bus_id);
}

static PyObject *selftest(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache selftest_args = FL_ARG_CACHE("selftest");
    int index = 0;
    Py_ssize_t n = 1 << 20;
    if (fl_parse_args_dict(&selftest_args, args, kwargs, FL_ARG("|device", INT, &index),
                           FL_ARG("n", SSIZE, &n)) < 0)
        return NULL;
    if (n <= 0 || n > (1 << 24)) {
        fl_raisef(NULL, FL_EXC_VALUE, "'n' must be in 1..%d, not %zd", 1 << 24, n);
        return NULL;
    }
    double kernel_ms;
    size_t errors;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_cuda_selftest(index, (size_t)n, &kernel_ms, &errors);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_cuda(module, rc, "selftest");
    return Py_BuildValue("{s:i,s:n,s:d,s:n}", "device", index, "n", n, "kernel_ms", kernel_ms,
                         "errors", (Py_ssize_t)errors);
}

PyObject *fl_py_load_library(PyObject *module, PyObject *args, PyObject *kwargs,
                             fl_arg_cache *cache,
                             int (*load)(const char *path, char *why, size_t why_len),
                             const char *(*loaded_path)(void), const char *what) {
    const char *path = NULL;
    if (fl_parse_args_dict(cache, args, kwargs, FL_ARG("|path", STR_OR_NONE, &path)) < 0)
        return NULL;
    char why[4096];
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = load(path, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return fl_raisef(&fl_py_state(module)->exc, FL_EXC_CUDA_UNAVAILABLE,
                         "%s could not be loaded: %s", what, why);
    return PyUnicode_DecodeFSDefault(loaded_path());
}

static PyObject *cublas_load(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache cublas_load_args = FL_ARG_CACHE("cublas_load");
    return fl_py_load_library(module, args, kwargs, &cublas_load_args, fl_cublas_load,
                              fl_cublas_path, "CUDA is not available: cuBLAS");
}

static PyObject *nn_backend(PyObject *module, PyObject *unused) {
    (void)unused;
    if (fl_cublas() == NULL)
        return fl_raisef(&fl_py_state(module)->exc, FL_EXC_CUDA_UNAVAILABLE,
                         "CUDA is not available: cuBLAS is not loaded (call cublas_load first)");
    return PyCapsule_New((void *)fl_cuda_nn_backend(), FL_NN_BACKEND_CAPSULE, NULL);
}

static PyObject *memcpy_benchmark(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache memcpy_benchmark_args = FL_ARG_CACHE("memcpy_benchmark");
    Py_ssize_t nbytes;
    int pinned = 1, repeats = 10, device = 0;
    if (fl_parse_args_dict(&memcpy_benchmark_args, args, kwargs, FL_ARG("nbytes", SSIZE, &nbytes),
                           FL_ARG("|pinned", BOOL, &pinned), FL_ARG("repeats", INT, &repeats),
                           FL_ARG("device", INT, &device)) < 0)
        return NULL;
    if (nbytes <= 0)
        return fl_raisef(NULL, FL_EXC_VALUE, "'nbytes' must be > 0, not %zd", nbytes);
    if (repeats <= 0)
        return fl_raisef(NULL, FL_EXC_VALUE, "'repeats' must be > 0, not %d", repeats);
    if (fl_py_require_device(fl_py_state(module), device) < 0)
        return NULL;
    double gbps;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = fl_cuda_memcpy_benchmark(device, (size_t)nbytes, pinned, repeats, &gbps);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_cuda(module, rc, "memcpy_benchmark");
    return PyFloat_FromDouble(gbps);
}

static PyObject *empty_cache(PyObject *module, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache empty_cache_args = FL_ARG_CACHE("empty_cache");
    int device = -1;
    if (fl_parse_args_dict(&empty_cache_args, args, kwargs, FL_ARG("|device", INT, &device)) < 0)
        return NULL;
    int first = device < 0 ? 0 : device, last = device < 0 ? 63 : device, rc = 0;
    Py_BEGIN_ALLOW_THREADS /* cudaFree waits for the device */
        for (int d = first; d <= last && rc == 0; d++)
            rc = fl_cuda_cache_release(d);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return raise_cuda(module, rc, "cudaFree(cached blocks)");
    Py_RETURN_NONE;
}

#ifdef FL_TESTING
/* ---- _device_restored(): the tests' proof that every entry point gives the caller's device
 * back, on a machine without a GPU: the guard's runtime calls are replaced by a fake current
 * device, and each entry point runs into its error path (the real runtime has no device). ---- */

static _Thread_local int fake_current = -1, fake_sets, fake_set_fails_for = -1, fake_no_context;

static int fake_get(int *device) {
    *device = fake_current;
    return 0;
}

static int fake_set(int device) {
    fake_sets++;
    if (device == fake_set_fails_for)
        return 101; /* cudaErrorInvalidDevice */
    fake_current = device;
    return 0;
}

static int fake_has_context(int device) { return !(fake_no_context && device == 0); }

/* Runs one entry point; appends its name to `failed` when the current device after it is not
 * `expect`, or when it never switched to `device` (switched: 0, the set was refused). */
#define PROBE(name, call)                                                                     \
    do {                                                                                      \
        fake_sets = 0;                                                                        \
        (void)(call);                                                                         \
        if (fake_current != expect || fake_sets == 0) {                                       \
            PyObject *what = PyUnicode_FromFormat("%s: current %d, expected %d, %d set(s)", \
                                                  name, fake_current, expect, fake_sets);    \
            if (what == NULL || PyList_Append(failed, what) < 0) {                            \
                Py_XDECREF(what);                                                             \
                return -1;                                                                    \
            }                                                                                 \
            Py_DECREF(what);                                                                  \
        }                                                                                     \
        fake_current = caller;                                                                \
    } while (0)

/* Every device-taking entry point of fl_cuda.h and fl_cuda_mem.h, and the nn backend's ops on a
 * bare context, with `device` asked and `caller` current; `expect` is current afterwards. */
static int probe_entry_points(PyObject *failed, int caller, int device, int expect) {
    void *ptr = NULL, *event = NULL;
    uintptr_t stream = 0;
    int flag = 0;
    double ms, gbps;
    size_t errors;
    char host[16];
    fake_current = caller;
    PROBE("fl_cuda_selftest", fl_cuda_selftest(device, 16, &ms, &errors));
    PROBE("fl_cuda_malloc", fl_cuda_malloc(device, 64, &ptr));
    PROBE("fl_cuda_free", fl_cuda_free(device, (void *)host));
    PROBE("fl_cuda_cached_free", fl_cuda_cached_free(device, (void *)host, 64, NULL));
    PROBE("fl_cuda_alloc_async", fl_cuda_alloc_async(device, 64, FL_CUDA_LEGACY_STREAM, &ptr));
    PROBE("fl_cuda_free_async", fl_cuda_free_async(device, (void *)host, FL_CUDA_LEGACY_STREAM));
    PROBE("fl_cuda_to_device", fl_cuda_to_device(device, (void *)host, host, 8, FL_CUDA_LEGACY_STREAM, 1));
    PROBE("fl_cuda_to_host", fl_cuda_to_host(device, host, (void *)host, 8, FL_CUDA_LEGACY_STREAM));
    PROBE("fl_cuda_stream_create", fl_cuda_stream_create(device, &stream));
    PROBE("fl_cuda_stream_destroy", fl_cuda_stream_destroy(device, FL_CUDA_LEGACY_STREAM + 1));
    PROBE("fl_cuda_stream_synchronize", fl_cuda_stream_synchronize(device, FL_CUDA_LEGACY_STREAM));
    PROBE("fl_cuda_stream_query", fl_cuda_stream_query(device, FL_CUDA_LEGACY_STREAM, &flag));
    PROBE("fl_cuda_stream_wait", fl_cuda_stream_wait(device, FL_CUDA_LEGACY_STREAM, FL_CUDA_LEGACY_STREAM));
    PROBE("fl_cuda_stream_wait_event", fl_cuda_stream_wait_event(device, FL_CUDA_LEGACY_STREAM, NULL));
    PROBE("fl_cuda_event_record", fl_cuda_event_record(device, &event, FL_CUDA_LEGACY_STREAM));
    PROBE("fl_cuda_host_register", fl_cuda_host_register(device, host, sizeof host, &flag));
    PROBE("fl_cuda_host_unregister", fl_cuda_host_unregister(device, host));
    PROBE("fl_cuda_memcpy_benchmark", fl_cuda_memcpy_benchmark(device, 64, 1, 1, &gbps));
    fl_cuda_preprocess_job job;
    memset(&job, 0, sizeof job);
    job.device = device, job.stream = FL_CUDA_LEGACY_STREAM, job.c = 3;
    PROBE("fl_cuda_preprocess", fl_cuda_preprocess(&job, &event));
    const fl_nn_backend *nn = fl_cuda_nn_backend();
    void *ctx = fl_cuda_nn_bare_context(device);
    if (ctx == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    float one = 1;
    double loss;
    PROBE("nn.sync", nn->sync(ctx));
    PROBE("nn.alloc", nn->alloc(ctx, 64));
    PROBE("nn.free", (nn->free(ctx, host), 0));
    PROBE("nn.to_device", nn->to_device(ctx, host, host, 8));
    PROBE("nn.to_host", nn->to_host(ctx, host, host, 8));
    PROBE("nn.copy", nn->copy(ctx, host, host, 8));
    PROBE("nn.zero", nn->zero(ctx, host, 8));
    PROBE("nn.fill_rows", nn->fill_rows(ctx, FL_FLOAT32, host, 1, 1, &one));
    PROBE("nn.sum_rows", nn->sum_rows(ctx, FL_FLOAT32, host, 1, 1, host));
    PROBE("nn.relu", nn->relu(ctx, FL_FLOAT32, host, host, 1));
    PROBE("nn.relu_backward", nn->relu_backward(ctx, FL_FLOAT32, host, host, host, 1));
    PROBE("nn.loss", nn->loss(ctx, FL_FLOAT32, FL_NN_MSE, host, host, 1, 1, host, &loss));
    PROBE("nn.wait_stream", nn->wait_stream(ctx, FL_CUDA_LEGACY_STREAM));
    PROBE("nn.close", (nn->close(ctx), 0));
    return 0;
}

static PyObject *device_restored(PyObject *module, PyObject *unused) {
    (void)unused;
    int count = 0;
    if (fl_cuda_device_count(&count) == 0 && count > 0)
        return fl_raisef(NULL, FL_EXC_RUNTIME, "_device_restored() runs the entry points into their "
                         "error paths: only on a machine without a CUDA device");
    (void)module;
    static const fl_cuda_device_ops fake = {fake_get, fake_set, fake_has_context};
    PyObject *result = PyDict_New(), *failed = NULL;
    /* (name, caller's device, device asked, set refused for, device 0 without a context, expected after) */
    static const struct { const char *name; int caller, device, refuse, no_context, expect; } cases[] = {
        {"switched and restored", 5, 3, -1, 0, 5},
        {"set refused, restored", 5, 3, 3, 0, 5},
        {"no context on the caller's device 0: left", 0, 3, -1, 1, 3},
    };
    const fl_cuda_device_ops *previous = fl_cuda_device_ops_swap(&fake);
    for (size_t i = 0; result != NULL && i < sizeof cases / sizeof *cases; i++) {
        fake_set_fails_for = cases[i].refuse;
        fake_no_context = cases[i].no_context;
        failed = PyList_New(0);
        if (failed == NULL || probe_entry_points(failed, cases[i].caller, cases[i].device, cases[i].expect) < 0 ||
            PyDict_SetItemString(result, cases[i].name, failed) < 0)
            Py_CLEAR(result);
        Py_CLEAR(failed);
    }
    fl_cuda_device_ops_swap(previous);
    fake_set_fails_for = -1;
    fake_no_context = 0;
    return result;
}
#endif

static PyMethodDef cuda_functions[] = {
    {"runtime_version", runtime_version, METH_NOARGS,
     "runtime_version()\n--\n\nThe CUDA runtime version built in, e.g. 13000."},
    {"driver_version", driver_version, METH_NOARGS,
     "driver_version()\n--\n\nThe CUDA version the driver supports; 0 without a driver."},
    {"device_count", device_count, METH_NOARGS,
     "device_count()\n--\n\nThe number of CUDA devices; raises fastloop.CudaError when the\n"
     "runtime cannot answer (no driver, driver too old)."},
    {"current_device", current_device, METH_NOARGS,
     "current_device()\n--\n\nThe calling thread's current CUDA device (cudaGetDevice); raises\n"
     "fastloop.CudaError when the runtime cannot answer."},
    {"device_info", device_info, METH_O,
     "device_info(index, /)\n--\n\nA dict describing device `index`."},
    {"selftest", (PyCFunction)(void (*)(void))selftest, METH_VARARGS | METH_KEYWORDS,
     "selftest(device=0, n=1048576)\n--\n\nRun a vector-add kernel on the device and check\n"
     "every result; returns a dict with kernel_ms and errors (0 when all are right)."},
    {"cublas_load", (PyCFunction)(void (*)(void))cublas_load, METH_VARARGS | METH_KEYWORDS,
     "cublas_load(path=None)\n--\n\nLoad cuBLAS (path, then $FASTLOOP_CUBLAS, then\n"
     "libcublas.so.13/.12/.so) unless loaded; returns the file loaded. Raises\n"
     "fastloop.CudaUnavailable naming every candidate tried."},
    {"nn_backend", nn_backend, METH_NOARGS,
     "nn_backend()\n--\n\nA PyCapsule named 'fastloop.nn_backend' holding the CUDA\n"
     "`const fl_nn_backend *` (cuBLAS must be loaded)."},
    {"memcpy_benchmark", (PyCFunction)(void (*)(void))memcpy_benchmark,
     METH_VARARGS | METH_KEYWORDS,
     "memcpy_benchmark(nbytes, pinned=True, repeats=10, device=0)\n--\n\n"
     "Host-to-device cudaMemcpyAsync bandwidth in GB/s (1e9 bytes/s)."},
    {"empty_cache", (PyCFunction)(void (*)(void))empty_cache, METH_VARARGS | METH_KEYWORDS,
     "empty_cache(device=-1)\n--\n\nFree the device blocks kept for reuse by dropped\n"
     "DeviceArrays (every device when -1); waits for the device."},
#ifdef FL_TESTING
    {"_device_restored", device_restored, METH_NOARGS,
     "_device_restored()\n--\n\nThe tests' hook (no GPU only): every entry point run with a fake\n"
     "current device; a dict of case -> the entry points that left the wrong device current."},
#endif
    {NULL, NULL, 0, NULL},
};

static int cuda_exec(PyObject *module) {
    cuda_state *state = fl_py_state(module);
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    if (fl_exc_load(&state->exc) < 0)
        return -1;
    if (fl_py_device_array_init(module, state) < 0 || fl_py_stream_init(module, state) < 0 ||
        fl_py_pinned_init(module, state) < 0 || fl_py_preprocess_init(module) < 0 ||
        fl_py_gpu_decode_init(module, state) < 0)
        return -1;
#ifdef FL_TESTING /* _NNContext, the tests' hook: only in builds made with FASTLOOP_TESTING=1 */
    if (fl_py_nn_testing_init(module, state) < 0)
        return -1;
#endif
    return 0;
}

static int cuda_traverse(PyObject *module, visitproc visit, void *arg) {
    cuda_state *state = fl_py_state(module);
    fl_exc_traverse(&state->exc, visit, arg);
    Py_VISIT(state->device_array_type);
    Py_VISIT(state->stream_type);
    Py_VISIT(state->pinned_type);
    Py_VISIT(state->nn_context_type);
    Py_VISIT(state->jpeg_decoder_type);
    return 0;
}

static int cuda_clear(PyObject *module) {
    cuda_state *state = fl_py_state(module);
    fl_exc_clear(&state->exc);
    Py_CLEAR(state->device_array_type);
    Py_CLEAR(state->stream_type);
    Py_CLEAR(state->pinned_type);
    Py_CLEAR(state->nn_context_type);
    Py_CLEAR(state->jpeg_decoder_type);
    return 0;
}

static void cuda_free(void *module) {
    cuda_clear(module);
    for (int device = 0; device < 64; device++) /* the blocks dropped DeviceArrays left for reuse */
        (void)fl_cuda_cache_release(device);
}

static PyModuleDef_Slot cuda_slots[] = {
    {Py_mod_exec, cuda_exec},
#ifdef Py_mod_gil /* what the GIL used to protect, and what does now: docs/development.md */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef cuda_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastloop._cuda",
    .m_doc = "fastloop's CUDA code: device arrays, streams, pinned memory, GPU preprocessing,\n"
             "the nn backend and device queries.",
    .m_size = sizeof(cuda_state),
    .m_methods = cuda_functions,
    .m_slots = cuda_slots,
    .m_traverse = cuda_traverse,
    .m_clear = cuda_clear,
    .m_free = cuda_free,
};

PyMODINIT_FUNC PyInit__cuda(void) { return PyModuleDef_Init(&cuda_module); }
