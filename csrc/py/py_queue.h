/* py_queue.h - what other binding files need from fastloop.Queue. */
#ifndef FL_PY_QUEUE_H
#define FL_PY_QUEUE_H

#include "fl_module.h"

#include "base/fl_queue.h"

/* The core queue (of fl_item) behind a fastloop.Queue, borrowed for as long as the caller
 * holds a reference to `obj`; NULL with TypeError when obj is not a fastloop.Queue. */
fl_queue *fl_queue_from_python(PyObject *obj, fl_module_state *state);

#endif
