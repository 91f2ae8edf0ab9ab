/* py_arguments.c - the declaration-driven argument parser (csrc/py/py_args.c), compiled into
 * fastloop._cuda too, so both extensions parse arguments one way. */
#include "py/py_args.c"
