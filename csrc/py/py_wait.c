/* py_wait.c - the interruptible wait loop (after CPython's Modules/_queuemodule.c) and
 * timeout parsing shared by every blocking call of the binding. */
#include <math.h>

#include "fl_module.h"

#include "base/fl_error.h"
#include "base/fl_time.h"

int fl_wait_interruptibly(fl_attempt_fn attempt, void *ctx, double timeout_s) {
    int rc = attempt(ctx, 0);
    if ((rc != FL_EAGAIN && rc != FL_ETIMEDOUT) || timeout_s == 0)
        return rc;
    const double deadline = timeout_s > 0 ? fl_monotonic() + timeout_s : INFINITY;
    for (;;) {
        double slice = FL_WAIT_SLICE_S;
        if (timeout_s > 0) {
            double remaining = deadline - fl_monotonic();
            if (remaining <= 0)
                return FL_ETIMEDOUT;
            if (remaining < slice)
                slice = remaining;
        }
        Py_BEGIN_ALLOW_THREADS
            rc = attempt(ctx, slice);
        Py_END_ALLOW_THREADS
        if (rc != FL_EAGAIN && rc != FL_ETIMEDOUT)
            return rc;
        if (PyErr_CheckSignals() < 0)
            return FL_EINTR;
    }
}

int fl_parse_timeout(PyObject *timeout, int block, double *seconds) {
    if (!block) {
        *seconds = 0;
        return 0;
    }
    if (timeout == NULL || timeout == Py_None) {
        *seconds = -1;
        return 0;
    }
    double value = PyFloat_AsDouble(timeout);
    if (value == -1.0 && PyErr_Occurred())
        return -1;
    if (value < 0 || isnan(value)) {
        fl_raisef(NULL, FL_EXC_VALUE, "'timeout' must be a non-negative number");
        return -1;
    }
    *seconds = value;
    return 0;
}
