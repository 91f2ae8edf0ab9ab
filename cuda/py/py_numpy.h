/* py_numpy.h - includes the NumPy C-API the same way in every binding file of
 * fastloop._cuda: one shared API table, filled by import_array() in py_cuda.c alone. */
#ifndef FL_PY_NUMPY_H
#define FL_PY_NUMPY_H

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL fastloop_cuda_ARRAY_API
#ifndef FL_PY_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#endif
