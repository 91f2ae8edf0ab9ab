/* fl_module.h - what the binding files of fastloop._core share: the module state, error
 * conversion, the interruptible wait loop and the array-argument checks.
 *
 * The binding is thin: it parses and checks arguments, calls one core function (with the
 * GIL released when the call can block or takes long), and turns core error codes into
 * Python exceptions. No logic of its own lives here.
 */
#ifndef FL_MODULE_H
#define FL_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fl_compat.h"
#include "py_args.h"
#include <pthread.h>
#include <sys/types.h>

#include "base/fl_dtype.h"
#include "base/fl_pool.h"
#include "py/fl_exc.h"

/* Per-module state (no C globals: ready for subinterpreters and free-threaded builds). */
typedef struct fl_module_state {
    PyTypeObject *queue_type;
    PyTypeObject *event_type;
    PyTypeObject *metrics_type;
    PyTypeObject *metric_stats_type;
    PyTypeObject *monitor_type;
    PyTypeObject *checkpointer_type;
    PyTypeObject *pipeline_type;
    PyTypeObject *loader_type;
    PyTypeObject *lease_type;
    PyTypeObject *npy_mapping_type;
    PyTypeObject *model_type;
    PyTypeObject *optimizer_type;
    fl_exc_classes exc;        /* the exception table's classes (fl_exc.h) */
    pthread_mutex_t pool_lock; /* guards pool, pool_pid and pool_users */
    fl_pool *pool;             /* intra-op worker threads, started on first use */
    pid_t pool_pid;            /* the process that made `pool` (a forked child must not use it) */
    int pool_users;            /* ops inside the pool now */
} fl_module_state;

extern struct PyModuleDef fl_module_def;

/* The state of the module that defines `type` (works for instances of its types). */
fl_module_state *fl_state_from_type(PyTypeObject *type);
static inline fl_module_state *fl_state_from_module(PyObject *module) {
    return (fl_module_state *)PyModule_GetState(module);
}

/* ---- core error codes to exceptions (py_errors.c) ---- */

/* How one call raises; zeroed fields take the defaults. */
typedef struct fl_raise_opts {
    const char *what;    /* message prefix: "what: message"; NULL: the message alone */
    const char *message; /* NULL: the core's thread-local detail (fl_strerror() when empty) */
    fl_raise_in in;      /* where the error came from */
    PyObject *instance;  /* set: raise this exception the caller built (borrowed) */
} fl_raise_opts;

/* Sets the Python exception for core error `err` (a negative fl_err) as `opts` says, and
 * clears the core's detail. Returns NULL, for `return fl_raise_with(...)`. `state` may be NULL
 * in a helper that has no module at hand when `opts` picks only built-in classes
 * (FL_IN_DATA's ValueError, say); a fastloop class asked for without it is a SystemError.
 * The exception carries the code as `.code`. */
PyObject *fl_raise_with(fl_module_state *state, int err, const fl_raise_opts *opts);

/* fl_raise_with() with the table and the core's detail, prefixed by `what` ("normalize"). */
PyObject *fl_raise(fl_module_state *state, int err, const char *what);

/* The tail of a binding that built `result` (a new reference) for a core call to fill: returns
 * result when err is FL_OK; else raises as fl_raise() does and drops result, returning NULL.
 * `return fl_result_or_raise(state, rc, array, "resize");` */
PyObject *fl_result_or_raise(fl_module_state *state, int err, PyObject *result, const char *what);

/* ---- blocking waits (py_wait.c) ---- */

/* One attempt at a blocking core call that waits at most timeout_s (0: not at all). */
typedef int (*fl_attempt_fn)(void *ctx, double timeout_s);

/* Runs a blocking core call the interruptible way: one attempt without waiting while
 * holding the GIL, then waits of at most FL_WAIT_SLICE_S with the GIL released, checking
 * for signals (Ctrl-C) between slices, until the call stops returning FL_EAGAIN or
 * FL_ETIMEDOUT or `timeout_s` (< 0: no limit) runs out. Returns the call's last code,
 * FL_ETIMEDOUT when the time ran out, or FL_EINTR with a Python exception set when a signal
 * handler raised. Call with the GIL held. */
int fl_wait_interruptibly(fl_attempt_fn attempt, void *ctx, double timeout_s);

#define FL_WAIT_SLICE_S 0.05

/* Parses a Python timeout (None or a number >= 0) into seconds, -1 meaning forever, and
 * honours `block` (block false -> 0). Returns 0, or -1 with ValueError/TypeError set. */
int fl_parse_timeout(PyObject *timeout, int block, double *seconds);

/* ---- thread pool for ops (module.c) ---- */

/* Returns an fl_exec for `threads` threads, starting the pool if needed; pair every call
 * with fl_exec_release(). threads <= 1 needs no pool. Never fails: without a pool the
 * work runs on the caller's thread. Call with the GIL held. */
fl_exec fl_exec_acquire(fl_module_state *state, int threads);
void fl_exec_release(fl_module_state *state, fl_exec exec);

/* ---- array arguments (py_arrays.c) ---- */

/* Inputs at least this large release the GIL around their kernel; below it the hand-off
 * costs more than the work (CPython's hashlib uses the same rule at 2 KiB). */
#define FL_GIL_RELEASE_BYTES 2048

/* Checks that `obj` (argument `arg`) is a NumPy array that a kernel can read directly:
 * C-contiguous, aligned, native byte order, not an object array. Returns a borrowed
 * PyArrayObject*, or NULL with TypeError/ValueError naming `arg`. */
PyObject *fl_check_array(PyObject *obj, const char *arg);

/* The fl_dtype of a NumPy dtype object (argument `arg`), or -1 with TypeError. */
int fl_dtype_from_descr(PyObject *descr, const char *arg, fl_dtype *out);

/* The fl_dtype of array `array` (argument `arg`), or -1 with TypeError naming the dtype. */
int fl_dtype_of(PyObject *array, const char *arg, fl_dtype *out);

/* The NumPy type number of an fl_dtype. */
int fl_dtype_to_numpy(fl_dtype dtype);

/* Returns a new reference to the output array: a fresh C-contiguous array of `shape` and
 * `descr` (stolen) when out_obj is None/NULL, else out_obj itself after checking that it is
 * a writable C-contiguous aligned array of exactly that shape and dtype that does not
 * overlap `input` (allowed to be `input` itself only when may_alias). NULL on error, with
 * the exception naming argument "out". */
PyObject *fl_output_array(PyObject *out_obj, int ndim, const Py_ssize_t *shape, PyObject *descr,
                          PyObject *input, int may_alias);

/* 1 when the memory of two arrays overlaps. */
int fl_arrays_overlap(PyObject *a, PyObject *b);

/* "(2, 3, 4)" for an array's shape, for error messages; NULL on error. */
PyObject *fl_shape_repr(PyObject *array);

/* Parses the `threads` argument (>= 1). Returns 0 or -1 with ValueError. */
int fl_check_threads(int threads);

/* Parses a seed (None -> fresh OS entropy, else an int taken modulo 2**64). */
int fl_parse_seed(PyObject *seed, uint64_t *out);

/* ---- type and function registration ---- */

int fl_queue_module_init(PyObject *module, fl_module_state *state);
int fl_metrics_module_init(PyObject *module, fl_module_state *state);
int fl_monitor_module_init(PyObject *module, fl_module_state *state);
int fl_checkpoint_module_init(PyObject *module, fl_module_state *state);
int fl_pipeline_module_init(PyObject *module, fl_module_state *state);
int fl_loader_module_init(PyObject *module, fl_module_state *state);
int fl_procloader_module_init(PyObject *module, fl_module_state *state);
int fl_thread_loader_module_init(PyObject *module, fl_module_state *state);
int fl_npy_module_init(PyObject *module, fl_module_state *state);
int fl_nn_module_init(PyObject *module, fl_module_state *state);
int fl_ops_module_init(PyObject *module);
int fl_testing_module_init(PyObject *module);
int fl_gpu_math_testing_init(PyObject *module); /* py_gpu_math_testing.c, FL_TESTING builds too */
int fl_image_module_init(PyObject *module);
int fl_json_numbers_module_init(PyObject *module);

#endif
