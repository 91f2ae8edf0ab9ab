/* py_errors.c - a core error code (fl_err) becomes a Python exception here: which class each
 * code raises, by where it came from (fl_raise_in), then fl_exc_raise() raises it. */
#include "fl_module.h"

#include "base/fl_error.h"

#define FL__ANY_ERR 0 /* a row for every code of its origin */

/* Read top down; the first row whose origin and code match gives the class. */
static const struct {
    fl_raise_in in;
    int err;
    fl_exc exc;
} code_table[] = {
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

static fl_exc class_for(int err, fl_raise_in in) {
    for (size_t i = 0; i < sizeof code_table / sizeof code_table[0]; i++)
        if ((code_table[i].in == in || code_table[i].in == FL_IN_CORE) &&
            (code_table[i].err == err || code_table[i].err == FL__ANY_ERR))
            return code_table[i].exc;
    return FL_EXC_ERROR;
}

PyObject *fl_raise_with(fl_module_state *state, int err, const fl_raise_opts *opts) {
    const fl_exc_classes *classes = state != NULL ? &state->exc : NULL;
    if (opts->instance != NULL) { /* the caller built it (a worker's failure, told by the worker) */
        fl_error_clear();
        PyErr_SetObject((PyObject *)Py_TYPE(opts->instance), opts->instance);
        return NULL;
    }
    const char *detail = opts->message != NULL ? opts->message : fl_error_detail();
    const char *text = detail[0] != '\0' ? detail : fl_strerror(err);
    fl_exc exc = class_for(err, opts->in);
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
