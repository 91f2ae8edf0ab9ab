/* py_ops.h - the fastloop.ops functions, split by what they do to the data, and helpers
 * they share for image-shaped arguments. */
#ifndef FL_PY_OPS_H
#define FL_PY_OPS_H

#include "fl_module.h"

#include "../fl_ops.h"

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

#endif
