/* py_errors.c - the one place where a core error code becomes a Python exception: a table
 * from fl_err to exception class, which a call can override (fl_raise_opts). */
#include "fl_module.h"

#include "base/fl_error.h"

/* The class each code raises unless a call says otherwise. */
static const struct {
    int err;
    fl_exc exc;
} default_table[] = {
    {FL_EINVAL, FL_EXC_VALUE},         {FL_ENOMEM, FL_EXC_MEMORY},
    {FL_ECLOSED, FL_EXC_CLOSED},       {FL_ETIMEDOUT, FL_EXC_TIMEOUT},
    {FL_EUNAVAILABLE, FL_EXC_UNAVAILABLE}, {FL_EOVERFLOW, FL_EXC_OVERFLOW},
};

static fl_exc class_for(int err, const fl_raise_opts *opts) {
    for (int i = 0; i < FL_RAISE_OVERRIDES && opts->overrides[i].exc != FL_EXC_DEFAULT; i++)
        if (opts->overrides[i].err == err)
            return opts->overrides[i].exc;
    if (opts->otherwise != FL_EXC_DEFAULT)
        return opts->otherwise;
    for (size_t i = 0; i < sizeof default_table / sizeof default_table[0]; i++)
        if (default_table[i].err == err)
            return default_table[i].exc;
    return FL_EXC_ERROR;
}

/* fastloop.CudaError lives in Python only (fastloop.errors); looked up when raised. */
static PyObject *cuda_error_type(void) {
    PyObject *errors = PyImport_ImportModule("fastloop.errors");
    PyObject *type = errors != NULL ? PyObject_GetAttrString(errors, "CudaError") : NULL;
    Py_XDECREF(errors);
    return type;
}

/* A new reference to the class, or NULL with an exception set. */
static PyObject *class_object(fl_module_state *state, fl_exc exc) {
    if (state == NULL && exc != FL_EXC_VALUE && exc != FL_EXC_MEMORY && exc != FL_EXC_TIMEOUT && exc != FL_EXC_OS &&
        exc != FL_EXC_OVERFLOW) {
        PyErr_SetString(PyExc_SystemError, "fl_raise_with: a fastloop exception class needs the module state");
        return NULL;
    }
    switch (exc) {
    case FL_EXC_VALUE: return Py_NewRef(PyExc_ValueError);
    case FL_EXC_MEMORY: return Py_NewRef(PyExc_MemoryError);
    case FL_EXC_TIMEOUT: return Py_NewRef(PyExc_TimeoutError);
    case FL_EXC_OS: return Py_NewRef(PyExc_OSError);
    case FL_EXC_OVERFLOW: return Py_NewRef(PyExc_OverflowError);
    case FL_EXC_CLOSED: return Py_NewRef(state->closed);
    case FL_EXC_UNAVAILABLE: return Py_NewRef(state->codec_unavailable);
    case FL_EXC_SINK: return Py_NewRef(state->sink_error);
    case FL_EXC_CHECKPOINT: return Py_NewRef(state->checkpoint_error);
    case FL_EXC_CUDA: return cuda_error_type();
    default: return Py_NewRef(state->error);
    }
}

/* OSError(errno, message): Python makes it FileNotFoundError, PermissionError... */
static void set_os_error(PyObject *type, int sys_errno, PyObject *message) {
    PyObject *args = sys_errno != 0 ? Py_BuildValue("(iO)", sys_errno, message) : PyTuple_Pack(1, message);
    if (args != NULL)
        PyErr_SetObject(type, args);
    Py_XDECREF(args);
}

PyObject *fl_raise_with(fl_module_state *state, int err, const fl_raise_opts *opts) {
    if (opts->instance != NULL) { /* the caller built it (a worker's failure, told by the worker) */
        fl_error_clear();
        PyErr_SetObject((PyObject *)Py_TYPE(opts->instance), opts->instance);
        return NULL;
    }
    const char *detail = opts->message != NULL ? opts->message : fl_error_detail();
    const char *text = detail[0] != '\0' ? detail : fl_strerror(err);
    int sys_errno = fl_error_errno();
    fl_exc exc = class_for(err, opts);
    PyObject *message = opts->what != NULL ? PyUnicode_FromFormat("%s: %s", opts->what, text)
                                           : PyUnicode_FromString(text);
    fl_error_clear(); /* after the last read of the detail */
    PyObject *type = message != NULL ? class_object(state, exc) : NULL;
    if (type != NULL && exc == FL_EXC_OS)
        set_os_error(type, sys_errno, message);
    else if (type != NULL)
        PyErr_SetObject(type, message);
    Py_XDECREF(type);
    Py_XDECREF(message);
    return NULL;
}

PyObject *fl_raise(fl_module_state *state, int err, const char *what) {
    return fl_raise_with(state, err, &(fl_raise_opts){.what = what});
}
