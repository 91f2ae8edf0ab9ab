/* py_ops.h - the fastloop.ops functions, split by what they do to the data, and helpers
 * they share for image-shaped arguments. */
#ifndef FL_PY_OPS_H
#define FL_PY_OPS_H

#include "fl_module.h"

#include "ops/fl_ops.h"

/* Ops that compute new values (py_ops_values.c). */
PyObject *fl_py_normalize(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fl_py_cast(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fl_py_divide_by_max(PyObject *module, PyObject *args, PyObject *kwargs);

/* Ops that move elements without changing them (py_ops_layout.c). */
PyObject *fl_py_crop(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fl_py_hflip(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fl_py_stack(PyObject *module, PyObject *args, PyObject *kwargs);

/* Parses "HWC" or "CHW" (argument `arg`). Returns 0 or -1 with ValueError. */
int fl_parse_layout(const char *text, const char *arg, fl_layout *out);

/* Reads the image dimensions of `x` in `layout`: (H, W, C) / (C, H, W) is one image, a
 * leading axis makes a batch. Returns 0 or -1 with ValueError naming 'x' and its shape. */
int fl_image_dims(PyObject *x, fl_layout layout, fl_images *dims);

/* The shape of an image batch like `x` (same rank) with the given dims in `layout`. */
void fl_image_shape(PyObject *x, fl_layout layout, fl_images dims, Py_ssize_t shape[4]);

/* Runs `statement` with the GIL released when `nbytes` reach FL_GIL_RELEASE_BYTES. */
#define FL_RUN_RELEASING_GIL(nbytes, statement)         \
    do {                                                \
        if ((size_t)(nbytes) >= FL_GIL_RELEASE_BYTES) { \
            Py_BEGIN_ALLOW_THREADS                      \
            statement;                                  \
            Py_END_ALLOW_THREADS                        \
        } else {                                        \
            statement;                                  \
        }                                               \
    } while (0)

/* Runs one kernel call: `call` is an expression that uses `exec` (an fl_exec for `threads`
 * threads) and yields an fl_err; the GIL is released for it when `nbytes` is large enough.
 * On failure *out is replaced by NULL with the exception set, prefixed by `what`. */
#define FL_RUN_KERNEL(module, threads, nbytes, what, out, call)          \
    do {                                                                 \
        fl_module_state *kernel_state = fl_state_from_module(module);    \
        fl_exec exec = fl_exec_acquire(kernel_state, (threads));         \
        int kernel_rc;                                                   \
        FL_RUN_RELEASING_GIL((nbytes), kernel_rc = (call));              \
        fl_exec_release(kernel_state, exec);                             \
        if (kernel_rc != 0)                                              \
            Py_SETREF((out), fl_raise(kernel_state, kernel_rc, (what))); \
    } while (0)

#endif
