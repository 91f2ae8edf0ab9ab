/* py_errors.c - a core error code (fl_err) becomes a Python exception here: the class from
 * fl_exc_for_code() (the code and where it came from), raised by fl_exc_raise(). */
#include "fl_module.h"

#include "base/fl_error.h"

PyObject *fl_raise_with(fl_module_state *state, int err, const fl_raise_opts *opts) {
    const fl_exc_classes *classes = state != NULL ? &state->exc : NULL;
    if (opts->instance != NULL) { /* the caller built it (a worker's failure, told by the worker) */
        fl_error_clear();
        PyErr_SetObject((PyObject *)Py_TYPE(opts->instance), opts->instance);
        return NULL;
    }
    const char *detail = opts->message != NULL ? opts->message : fl_error_detail();
    const char *text = detail[0] != '\0' ? detail : fl_strerror(err);
    fl_exc exc = fl_exc_for_code(err, opts->in);
    fl_exc_codes codes = {.code = err, .sys_errno = exc == FL_EXC_OS ? fl_error_errno() : 0};
    PyObject *message = opts->what != NULL ? PyUnicode_FromFormat("%s: %s", opts->what, text)
                                           : PyUnicode_FromString(text);
    fl_error_clear(); /* after the last read of the detail */
    fl_exc_raise(classes, exc, message, codes);
    Py_XDECREF(message);
    return NULL;
}

PyObject *fl_raise(fl_module_state *state, int err, const char *what) {
    return fl_raise_with(state, err, &(fl_raise_opts){.what = what});
}

PyObject *fl_result_or_raise(fl_module_state *state, int err, PyObject *result, const char *what) {
    if (err == FL_OK)
        return result;
    fl_raise(state, err, what); /* first: result's deallocation must not clear the core's detail */
    Py_DECREF(result);
    return NULL;
}
