/* py_cuda.c - fastloop._cuda: the Python binding of fl_cuda.h, loaded lazily by
 * fastloop.cuda. CUDA failures raise fastloop.CudaError with the cudaError_t code. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fl_cuda.h"

typedef struct {
    PyObject *cuda_error; /* fastloop.errors.CudaError */
} cuda_state;

static cuda_state *get_state(PyObject *module) { return (cuda_state *)PyModule_GetState(module); }

/* Raises fastloop.CudaError(message, code) for a failed call `what`; returns NULL. */
static PyObject *raise_cuda(PyObject *module, int code, const char *what) {
    PyObject *message = PyUnicode_FromFormat(
        "%s: %s (%s, code %d)", what, fl_cuda_error_string(code), fl_cuda_error_name(code), code);
    if (message == NULL)
        return NULL;
    PyObject *error = PyObject_CallFunction(get_state(module)->cuda_error, "Oi", message, code);
    Py_DECREF(message);
    if (error != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
    }
    return NULL;
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

static PyObject *device_info(PyObject *module, PyObject *arg) {
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (value < 0 || value > 1 << 16) {
        PyErr_Format(PyExc_ValueError, "device index must be >= 0, not %ld", value);
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
    static char *keywords[] = {"device", "n", NULL};
    int index = 0;
    Py_ssize_t n = 1 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|in:selftest", keywords, &index, &n))
        return NULL;
    if (n <= 0 || n > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "'n' must be in 1..%d, not %zd", 1 << 24, n);
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

static PyMethodDef cuda_functions[] = {
    {"runtime_version", runtime_version, METH_NOARGS,
     "runtime_version()\n--\n\nThe CUDA runtime version built in, e.g. 13000."},
    {"driver_version", driver_version, METH_NOARGS,
     "driver_version()\n--\n\nThe CUDA version the driver supports; 0 without a driver."},
    {"device_count", device_count, METH_NOARGS,
     "device_count()\n--\n\nThe number of CUDA devices; raises fastloop.CudaError when the\n"
     "runtime cannot answer (no driver, driver too old)."},
    {"device_info", device_info, METH_O,
     "device_info(index, /)\n--\n\nA dict describing device `index`."},
    {"selftest", (PyCFunction)(void (*)(void))selftest, METH_VARARGS | METH_KEYWORDS,
     "selftest(device=0, n=1048576)\n--\n\nRun a vector-add kernel on the device and check\n"
     "every result; returns a dict with kernel_ms and errors (0 when all are right)."},
    {NULL, NULL, 0, NULL},
};

static int cuda_exec(PyObject *module) {
    PyObject *errors = PyImport_ImportModule("fastloop.errors");
    if (errors == NULL)
        return -1;
    get_state(module)->cuda_error = PyObject_GetAttrString(errors, "CudaError");
    Py_DECREF(errors);
    return get_state(module)->cuda_error == NULL ? -1 : 0;
}

static int cuda_traverse(PyObject *module, visitproc visit, void *arg) {
    Py_VISIT(get_state(module)->cuda_error);
    return 0;
}

static int cuda_clear(PyObject *module) {
    Py_CLEAR(get_state(module)->cuda_error);
    return 0;
}

static void cuda_free(void *module) { cuda_clear(module); }

static PyModuleDef_Slot cuda_slots[] = {
    {Py_mod_exec, cuda_exec},
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef cuda_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastloop._cuda",
    .m_doc = "fastloop's CUDA code: device queries and a kernel self-test.",
    .m_size = sizeof(cuda_state),
    .m_methods = cuda_functions,
    .m_slots = cuda_slots,
    .m_traverse = cuda_traverse,
    .m_clear = cuda_clear,
    .m_free = cuda_free,
};

PyMODINIT_FUNC PyInit__cuda(void) { return PyModuleDef_Init(&cuda_module); }
