/* py_batch.h - turning a loader slot into the batch Python receives: NumPy views of each
 * field whose base is a _SlotLease that gives the slot back when the last view goes, or
 * copies when lending the slot would leave the workers none to fill. Shared by the threads
 * (_Loader) and processes (_ProcLoader) loaders. */
#ifndef FL_PY_BATCH_H
#define FL_PY_BATCH_H

#include "fl_module.h"

typedef void (*fl_slot_release_fn)(void *core, int slot);

typedef struct fl_slot_batch {
    PyObject *owner;            /* kept alive by the lease: owns the slot memory */
    void *core;                 /* passed to release */
    fl_slot_release_fn release;
    int slot;
    unsigned char *data;        /* the slot's memory */
    const size_t *offsets;      /* per field: where its batch starts in data */
    size_t count;               /* samples in this batch */
    PyObject *descrs, *shapes;  /* tuples: per field dtype and sample shape */
    int copy_out;               /* 1: copy the arrays and release the slot at once */
} fl_slot_batch;

/* Whether the batch just lent (making `lent` of `slots` lent) goes out as a copy: a view while
 * the consumer holds at most two (the one in use and the one being taken; the cores keep
 * `slots - 2` batches in flight besides), a copy for a third one kept, so batches a user keeps
 * never eat the slots the workers prefetch into, and a copy when no slot would be left. */
static inline int fl_copy_out(int lent, int slots) { return lent > 2 || lent >= slots; }

/* The batch as a tuple of arrays. The slot is released here when copying (or on error),
 * else by the lease. NULL with an exception on failure. */
PyObject *fl_batch_from_slot(fl_module_state *state, const fl_slot_batch *batch);

/* The size in bytes of one sample of (descr, shape), or -1 with ValueError (a negative
 * dimension, too many to batch) or OverflowError (more bytes than a size holds) naming it. */
Py_ssize_t fl_sample_nbytes(PyObject *descr, PyObject *shape);

/* fl_batch_layout (the slot layout both loaders share) for batch_size samples of per-sample
 * sizes `sample_bytes`: offsets and *slot_bytes. Returns 0, or -1 with OverflowError. */
int fl_slot_layout(const size_t *sample_bytes, size_t n_fields, size_t batch_size, size_t *offsets,
                   size_t *slot_bytes);

int fl_batch_module_init(PyObject *module, fl_module_state *state);

#endif
