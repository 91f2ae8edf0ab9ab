/* py_metrics.h - what other binding files need from fastloop.Metrics. */
#ifndef FL_PY_METRICS_H
#define FL_PY_METRICS_H

#include "fl_module.h"

#include "base/fl_metrics.h"

/* The core table behind a fastloop.Metrics (borrowed while the caller holds `obj`), or NULL
 * with TypeError. */
fl_metrics *fl_metrics_from_python(PyObject *obj, fl_module_state *state);

#endif
