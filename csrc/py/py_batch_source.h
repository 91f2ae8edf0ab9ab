/* py_batch_source.h - the binding written once over a core fl_batch_source: what _Loader
 * (threads mode, py_loader.c) and _ProcLoader (processes mode, py_procloader.c) share.
 *
 * Both types start with fl_source_object and take their next/start_epoch/stop methods and
 * their batches/lent/output getters from here; each mode's file adds its construction, what
 * only it exposes (a loader's skipped samples, a pool's worker pids), the Python objects only
 * it holds (with their gc traverse/clear) and how its worker failures become exceptions.
 */
#ifndef FL_PY_BATCH_SOURCE_H
#define FL_PY_BATCH_SOURCE_H

#include "fl_module.h"

#include <stdatomic.h>

#include "base/fl_metrics.h"
#include "data/fl_batch_source.h"
#include "data/fl_pipeline.h"

enum { FL_SOURCE_MAX_FIELDS = 64 };

typedef struct fl_source_object fl_source_object;

/* A mode: its Python type and what differs between the modes. The shared binding gives the
 * type its methods (next, start_epoch, stop) and its dealloc/traverse/clear, which end the
 * workers before calling the mode's own parts. */
typedef struct fl_source_type {
    const char *name;     /* "fastloop._core._Loader"; a static string (the type keeps it) */
    const char *doc;
    Py_ssize_t basicsize; /* the mode's object, which starts with fl_source_object */
    newfunc new;          /* sets `type` first, then makes the source */
    PyGetSetDef *getset;  /* static: the shared getters below and the mode's own */
    const char *timeout_format; /* next()'s TimeoutError message, with one %g for the timeout */
    /* Sets the exception for an error code next() got from the source (not FL_EEND, a
     * timeout or FL_EINTR); returns NULL. */
    PyObject *(*raise_error)(fl_source_object *self, int rc);
    /* NULL, or what next() appends to the batch's arrays for the lent `slot`, read before the
     * slot can go back (a new reference; NULL with an exception). */
    PyObject *(*batch_extra)(fl_source_object *self, int slot);
    /* NULL, or called by start_epoch once the last epoch's workers are stopped, before the
     * new epoch starts: to forget what the mode kept of the last one. */
    void (*epoch_starting)(fl_source_object *self);
    /* 1: the workers run the mode's Python code, which may wait on a lock the thread running
     * a finalizer holds (a collection or a last reference dropped mid-way through anything):
     * a finalizer never joins them. The collector only asks them to stop, and the object is
     * freed by the source's free_later, on a thread of its own, once they have ended. */
    int workers_run_python;
    /* The mode's own Python objects (NULL: none): visited, dropped once the workers are
     * ended, and its own memory freed once the source is. */
    traverseproc traverse;
    void (*clear)(fl_source_object *self);
    void (*free)(fl_source_object *self);
} fl_source_type;

struct fl_source_object {
    PyObject_HEAD
    const fl_source_type *type;
    fl_batch_source source;            /* ops NULL until the mode's constructor made it */
    PyObject *out_descrs, *out_shapes; /* tuples, per field as delivered: dtype, sample shape */
    PyObject *keep_alive;              /* a list: what the core borrows (arrays, pipeline, metrics) */
    size_t n_fields;
    size_t offsets[FL_SOURCE_MAX_FIELDS]; /* where each field's batch starts in a slot */
    int cleared;                       /* the collector cleared it: it refuses new epochs */
    atomic_ullong copied_out;          /* batches handed out as copies (fl_copy_out): a count */
};

/* The core objects behind the optional `pipeline_obj` (a _Pipeline) and `metrics_obj` (a
 * Metrics), NULL for None; each kept alive in self->keep_alive while the core borrows it.
 * Returns 0, or -1 with TypeError. */
int fl_source_borrow(fl_source_object *self, PyObject *pipeline_obj, PyObject *metrics_obj,
                     const fl_pipeline **pipeline, fl_metrics **metrics);

/* The `batch_ends` setter of a mode with uneven batches: `value` (an array of where each batch
 * ends in the epoch's order, or None for batch_size samples each) handed to `set`, the core's
 * set_batches (fl_loader_set_batches, fl_procpool_set_batches). Returns 0, or -1 with an
 * exception naming batch_sampler. */
int fl_source_set_batch_ends(PyObject *self, PyObject *value,
                             int (*set)(void *impl, const uint64_t *ends, uint64_t n));

/* Makes the mode's heap type (gc, immutable) and adds it to `module`. Returns a new
 * reference, or NULL with an exception. */
PyTypeObject *fl_source_add_type(PyObject *module, const fl_source_type *def);

/* Getters for a mode's PyGetSetDef table: FL_SOURCE_GETSET (batches, lent, ahead, output,
 * copied_out) opens both modes' tables. */
PyObject *fl_source_get_batches(PyObject *self, void *closure);
PyObject *fl_source_get_lent(PyObject *self, void *closure);
PyObject *fl_source_get_ahead(PyObject *self, void *closure);
PyObject *fl_source_get_output(PyObject *self, void *closure);
PyObject *fl_source_get_copied_out(PyObject *self, void *closure);

#define FL_SOURCE_GETSET                                                                       \
    {"batches", fl_source_get_batches, NULL, "Batches per epoch.", NULL},                      \
    {"lent", fl_source_get_lent, NULL, "Slots lent out now.", NULL},                           \
    {"ahead", fl_source_get_ahead, NULL, "Batches filling or ready, not yet handed out.", NULL}, \
    {"output", fl_source_get_output, NULL,                                                     \
     "(dtypes, sample shapes) of the fields as delivered.", NULL},                             \
    {"copied_out", fl_source_get_copied_out, NULL,                                             \
     "Batches handed out as copies because too many slots were lent.", NULL}

#endif
