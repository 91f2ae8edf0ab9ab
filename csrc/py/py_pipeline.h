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

#endif
