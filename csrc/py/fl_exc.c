/* fl_exc.c - see fl_exc.h. Compiled into both extensions (cuda/py/py_exc.c includes it). */
#include "py/fl_exc.h"

#include "py/fl_compat.h"

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
        classes->cls[i] = builtin != NULL ? Py_NewRef(builtin) : PyObject_GetAttrString(errors, class_names[i]);
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
    for (int i = 0; names != NULL && i < FL_EXC_COUNT; i++)
        if (builtin_class((fl_exc)i) == NULL && PyList_Append(names, PyUnicode_FromString(class_names[i])) < 0)
            Py_CLEAR(names);
    PyObject *tuple = names != NULL ? PyList_AsTuple(names) : NULL;
    Py_XDECREF(names);
    return tuple;
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

PyObject *fl_exc_raise(const fl_exc_classes *classes, fl_exc exc, PyObject *message, fl_exc_codes codes) {
    if (message == NULL)
        return NULL;
    PyObject *type = classes != NULL ? classes->cls[exc] : builtin_class(exc);
    if (type == NULL) {
        /* the table itself is unusable: nothing to raise through */
        PyErr_Format(PyExc_SystemError, "fastloop raised %s without its module's exception table", class_names[exc]);
        return NULL;
    }
    if (codes.code == 0 && codes.cuda_code == 0 && codes.sys_errno == 0) {
        PyErr_SetObject(type, message); /* the common case: no instance to decorate */
        return NULL;
    }
    PyObject *error = codes.sys_errno != 0 ? PyObject_CallFunction(type, "iO", codes.sys_errno, message)
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
