/* fl_exc.h - the one table of exceptions both extensions (fastloop._core, fastloop._cuda)
 * raise, and the one function that raises them.
 *
 * A row names a class: a fastloop class (looked up in fastloop.errors by its name when the
 * module starts) or a built-in one. A new exception is one row here plus its class in
 * errors.py; tests/test_errors_table.py checks that the two agree. Every exception a
 * binding raises goes through fl_exc_raise(): the library code (a negative fl_err) lands in
 * `.code`, a CUDA error number in `.cuda_code`.
 */
#ifndef FL_EXC_H
#define FL_EXC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* X(enum suffix, class name, built-in class or NULL for a fastloop.errors class) */
#define FL_EXC_MAP(X)                                     \
    X(ERROR, "Error", NULL)                               \
    X(CLOSED, "Closed", NULL)                             \
    X(EMPTY, "Empty", NULL)                               \
    X(FULL, "QueueFull", NULL)                            \
    X(SINK, "SinkError", NULL)                            \
    X(WORKER, "WorkerError", NULL)                        \
    X(CHECKPOINT, "CheckpointError", NULL)                \
    X(CUDA, "CudaError", NULL)                            \
    X(CUDA_UNAVAILABLE, "CudaUnavailable", NULL)          \
    X(UNAVAILABLE, "CodecUnavailable", NULL)              \
    X(DECODE, "DecodeError", NULL)                        \
    X(VALUE, "ValueError", PyExc_ValueError)              \
    X(TYPE, "TypeError", PyExc_TypeError)                 \
    X(INDEX, "IndexError", PyExc_IndexError)              \
    X(ATTRIBUTE, "AttributeError", PyExc_AttributeError)  \
    X(MEMORY, "MemoryError", PyExc_MemoryError)           \
    X(OVERFLOW, "OverflowError", PyExc_OverflowError)     \
    X(TIMEOUT, "TimeoutError", PyExc_TimeoutError)        \
    X(OS, "OSError", PyExc_OSError)                       \
    X(BUFFER, "BufferError", PyExc_BufferError)           \
    X(RUNTIME, "RuntimeError", PyExc_RuntimeError)        \
    X(SYSTEM, "SystemError", PyExc_SystemError)

/* clang-format off */
typedef enum fl_exc {
#define FL__EXC_ENUM(name, class_name, builtin) FL_EXC_##name,
    FL_EXC_MAP(FL__EXC_ENUM)
#undef FL__EXC_ENUM
    FL_EXC_COUNT
} fl_exc;
/* clang-format on */

/* The classes of one module instance (new references), loaded when the module starts. */
typedef struct fl_exc_classes {
    PyObject *cls[FL_EXC_COUNT];
} fl_exc_classes;

/* Fills `classes` from the table (fastloop.errors for fastloop classes). 0, or -1 with an
 * exception set (a row without its class in errors.py: AttributeError naming it). */
int fl_exc_load(fl_exc_classes *classes);
int fl_exc_traverse(fl_exc_classes *classes, visitproc visit, void *arg);
void fl_exc_clear(fl_exc_classes *classes);

/* The fastloop rows as a tuple of class names, for the test that checks errors.py. */
PyObject *fl_exc_names(void);

/* Where a core error came from: picks the class a code raises (the table in fl_exc.c). */
typedef enum fl_raise_in {
    FL_IN_CORE = 0,   /* EINVAL ValueError, ENOMEM MemoryError, ECLOSED Closed, ETIMEDOUT
                         TimeoutError, EUNAVAILABLE CodecUnavailable, EOVERFLOW OverflowError,
                         ECUDA CudaError, any other fastloop.Error */
    FL_IN_DATA,       /* a file or a spec from the user: ESYS OSError(errno), ENOMEM
                         MemoryError, EUNAVAILABLE CodecUnavailable, any other ValueError */
    FL_IN_LIBRARY,    /* loading a shared library: OSError */
    FL_IN_SINK,       /* a monitor sink: ESYS SinkError */
    FL_IN_CHECKPOINT, /* the checkpointer: ESYS CheckpointError */
} fl_raise_in;

/* The class a core error code (a negative fl_err) raises, coming from `in`. Never fails. */
fl_exc fl_exc_for_code(int err, fl_raise_in in);

/* The codes an exception carries; zero fields are absent. */
typedef struct fl_exc_codes {
    int code;      /* library code (negative fl_err): `.code` */
    int cuda_code; /* cudaError_t: `.cuda_code` */
    int sys_errno; /* OSError(errno, message), so Python picks FileNotFoundError, ... */
} fl_exc_codes;

/* The one raise: sets class `exc` with `message` (a str, borrowed; NULL: an exception is
 * already set) and the codes. `classes` may be NULL when `exc` is a built-in class; a
 * fastloop class without it is a SystemError. Returns NULL, for `return fl_exc_raise(...)`. */
PyObject *fl_exc_raise(const fl_exc_classes *classes, fl_exc exc, PyObject *message,
                       fl_exc_codes codes);

/* fl_exc_raise() with a PyUnicode_FromFormat() message and no codes: the argument checks'
 * `return fl_raisef(NULL, FL_EXC_VALUE, "'n' must be > 0, not %zd", n)`. */
PyObject *fl_raisef(const fl_exc_classes *classes, fl_exc exc, const char *format, ...);

#endif
