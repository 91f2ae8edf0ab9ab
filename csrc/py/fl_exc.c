/* fl_exc.c - see fl_exc.h. Compiled into both extensions (cuda/py/py_exc.c includes it). */
#include "py/fl_exc.h"

#include "py/fl_compat.h"

#include "base/fl_error.h"

static const char *const class_names[FL_EXC_COUNT] = {
#define FL__EXC_NAME(name, class_name, builtin) class_name,
    FL_EXC_MAP(FL__EXC_NAME)
#undef FL__EXC_NAME
};

/* The built-in class of a row, NULL for a fastloop class (PyExc_* are not constants). */
static PyObject *builtin_class(fl_exc exc) {
    switch (exc) {
#define FL__EXC_BUILTIN(name, class_name, builtin) \
    case FL_EXC_##name:                            \
        return builtin;
        FL_EXC_MAP(FL__EXC_BUILTIN)
#undef FL__EXC_BUILTIN
    default: return NULL;
    }
}

int fl_exc_load(fl_exc_classes *classes) {
    PyObject *errors = PyImport_ImportModule("fastloop.errors");
    if (errors == NULL)
        return -1;
    int rc = 0;
    for (int i = 0; i < FL_EXC_COUNT && rc == 0; i++) {
        PyObject *builtin = builtin_class((fl_exc)i);
        classes->cls[i] = builtin != NULL ? Py_NewRef(builtin)
                                          : PyObject_GetAttrString(errors, class_names[i]);
        rc = classes->cls[i] != NULL ? 0 : -1;
    }
    Py_DECREF(errors);
    return rc;
}

int fl_exc_traverse(fl_exc_classes *classes, visitproc visit, void *arg) {
    for (int i = 0; i < FL_EXC_COUNT; i++)
        Py_VISIT(classes->cls[i]);
    return 0;
}

void fl_exc_clear(fl_exc_classes *classes) {
    for (int i = 0; i < FL_EXC_COUNT; i++)
        Py_CLEAR(classes->cls[i]);
}

PyObject *fl_exc_names(void) {
    PyObject *names = PyList_New(0);
    for (int i = 0; names != NULL && i < FL_EXC_COUNT; i++) {
        if (builtin_class((fl_exc)i) != NULL)
            continue;
        PyObject *name = PyUnicode_FromString(class_names[i]);
        if (name == NULL || PyList_Append(names, name) < 0)
            Py_CLEAR(names);
        Py_XDECREF(name);
    }
    PyObject *tuple = names != NULL ? PyList_AsTuple(names) : NULL;
    Py_XDECREF(names);
    return tuple;
}

#define FL__ANY_ERR 0 /* a row for every code of its origin */

/* Read top down; the first row whose origin and code match gives the class. */
static const struct {
    fl_raise_in in;
    int err;
    fl_exc exc;
} code_table[] = {
    /* from every origin, before the origins' catch-alls */
    {FL_IN_CORE, FL_EDECODE, FL_EXC_DECODE},
    /* a file or a spec from the user: I/O is OSError, bad content ValueError */
    {FL_IN_DATA, FL_ESYS, FL_EXC_OS},
    {FL_IN_DATA, FL_ENOMEM, FL_EXC_MEMORY},
    {FL_IN_DATA, FL_EUNAVAILABLE, FL_EXC_UNAVAILABLE},
    {FL_IN_DATA, FL__ANY_ERR, FL_EXC_VALUE},
    /* loading a shared library (a codec, BLAS): any failure is OSError */
    {FL_IN_LIBRARY, FL__ANY_ERR, FL_EXC_OS},
    {FL_IN_SINK, FL_ESYS, FL_EXC_SINK},
    {FL_IN_CHECKPOINT, FL_ESYS, FL_EXC_CHECKPOINT},
    /* every origin */
    {FL_IN_CORE, FL_EINVAL, FL_EXC_VALUE},
    {FL_IN_CORE, FL_ENOMEM, FL_EXC_MEMORY},
    {FL_IN_CORE, FL_ECLOSED, FL_EXC_CLOSED},
    {FL_IN_CORE, FL_ETIMEDOUT, FL_EXC_TIMEOUT},
    {FL_IN_CORE, FL_EUNAVAILABLE, FL_EXC_UNAVAILABLE},
    {FL_IN_CORE, FL_EOVERFLOW, FL_EXC_OVERFLOW},
    {FL_IN_CORE, FL_ECUDA, FL_EXC_CUDA},
    {FL_IN_CORE, FL__ANY_ERR, FL_EXC_ERROR},
};

fl_exc fl_exc_for_code(int err, fl_raise_in in) {
    for (size_t i = 0; i < sizeof code_table / sizeof code_table[0]; i++)
        if ((code_table[i].in == in || code_table[i].in == FL_IN_CORE) &&
            (code_table[i].err == err || code_table[i].err == FL__ANY_ERR))
            return code_table[i].exc;
    return FL_EXC_ERROR;
}

/* Sets an attribute unless the code is absent; 0 or -1. */
static int set_code(PyObject *error, const char *name, int code) {
    if (code == 0)
        return 0;
    PyObject *value = PyLong_FromLong(code);
    int rc = value != NULL ? PyObject_SetAttrString(error, name, value) : -1;
    Py_XDECREF(value);
    return rc;
}

PyObject *fl_exc_raise(const fl_exc_classes *classes, fl_exc exc, PyObject *message,
                       fl_exc_codes codes) {
    if (message == NULL)
        return NULL;
    PyObject *type = classes != NULL ? classes->cls[exc] : builtin_class(exc);
    if (type == NULL) {
        /* the table itself is unusable: nothing to raise through */
        PyErr_Format(PyExc_SystemError, "fastloop raised %s without its module's exception table",
                     class_names[exc]);
        return NULL;
    }
    if (codes.code == 0 && codes.cuda_code == 0 && codes.sys_errno == 0) {
        PyErr_SetObject(type, message); /* the common case: no instance to decorate */
        return NULL;
    }
    PyObject *error = codes.sys_errno != 0
                          ? PyObject_CallFunction(type, "iO", codes.sys_errno, message)
                          : PyObject_CallOneArg(type, message);
    if (error != NULL && set_code(error, "code", codes.code) == 0 &&
        set_code(error, "cuda_code", codes.cuda_code) == 0)
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
    Py_XDECREF(error);
    return NULL;
}

PyObject *fl_raisef(const fl_exc_classes *classes, fl_exc exc, const char *format, ...) {
    va_list args;
    va_start(args, format);
    PyObject *message = PyUnicode_FromFormatV(format, args);
    va_end(args);
    fl_exc_raise(classes, exc, message, (fl_exc_codes){0});
    Py_XDECREF(message);
    return NULL;
}
