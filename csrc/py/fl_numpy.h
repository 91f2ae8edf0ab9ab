/* fl_numpy.h - includes the NumPy C-API the same way in every binding file: one shared API
 * table (PY_ARRAY_UNIQUE_SYMBOL), filled by import_array() in module.c alone. */
#ifndef FL_NUMPY_H
#define FL_NUMPY_H

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL fastloop_ARRAY_API
#ifndef FL_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#endif
