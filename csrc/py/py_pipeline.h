/* py_pipeline.h - what other binding files need from fastloop._core._Pipeline. */
#ifndef FL_PY_PIPELINE_H
#define FL_PY_PIPELINE_H

#include "fl_module.h"

#include "data/fl_pipeline.h"

/* The core pipeline behind a _Pipeline (borrowed while the caller holds obj), or NULL with
 * TypeError. */
fl_pipeline *fl_pipeline_from_python(PyObject *obj, fl_module_state *state);

/* The pipeline's input layout. */
fl_layout fl_pipeline_layout_of(PyObject *obj);

/* The geometry (n = 1) and dtype of one sample of (descr, shape) as the input of pipeline
 * `obj` (shape in its layout). Returns 0, or -1 with ValueError/TypeError (naming `name`)
 * when the samples are not images of a dtype it takes. */
int fl_pipeline_input_of(PyObject *obj, PyObject *descr, PyObject *shape, const char *name, fl_images *image,
                         fl_dtype *dtype);

/* Sets item 0 of the lists `descrs` and `shapes` to the pipeline's output: `dtype`, and the
 * shape of one `out` image in `layout`. Returns 0, or -1 with an exception. */
int fl_pipeline_set_output(fl_images out, fl_dtype dtype, fl_layout layout, PyObject *descrs, PyObject *shapes);

#endif
