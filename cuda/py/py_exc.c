/* py_exc.c - the exception table and its raise function (csrc/py/fl_exc.c), compiled into
 * fastloop._cuda too, so both extensions raise through one table. */
#include "py/fl_exc.c"
