/* py_fork_child.h - the Python runtime of a forked worker of _ProcLoader (py_procloader.c):
 * the fill function and fork hooks it gives fl_procpool.
 *
 * In the child, fill() calls the Python `fetch(index[, epoch_seed])` for each sample of a
 * batch (a dataset's __getitem__ and Python transforms; with a batch's first sample it gets
 * the epoch seed and seeds the generators once per batch), checks each field's dtype and
 * shape against the first sample's, and writes it straight into the shared-memory slot;
 * field 0 may then go through a C pipeline, one image at a time. A Python exception travels
 * back as "module.qualname\x1emessage\x1etraceback" with the failing index.
 *
 * Then `finish(raw)` gives the batch's other values as bytes (strings, None, nested values:
 * see fastloop/_sample_codec.py), written after an 8-byte length into the slot's object area,
 * or, when they do not fit it, handed to fl_procpool as the batch's extra bytes (the length
 * then reads FL_OBJECTS_AFTER). A sample that does not fit the slots' fields (fetch returned
 * None, another shape, a value of another kind) makes the batch "raw": nothing more is
 * written into the fields, and finish(1) sends the batch's whole samples instead. With a
 * pipeline, such a sample is an error, as the pipeline needs field 0 in the slot.
 *
 * The hooks call PyOS_BeforeFork / PyOS_AfterFork_Parent / PyOS_AfterFork_Child with the
 * GIL held, as os.fork() does (around a gc.freeze(), so the workers do not copy the
 * parent's heap by collecting it); the child then runs worker_setup(worker_id) (seeds,
 * worker_init_fn) and serves commands with the GIL it inherited (it has no other thread).
 */
#ifndef FL_PY_FORK_CHILD_H
#define FL_PY_FORK_CHILD_H

#include "fl_module.h"

#include "data/fl_pipeline.h"
#include "data/fl_procpool.h"
#include "py_batch_source.h"

/* What a worker needs; filled by the parent before the first fork, read-only after it
 * (but the scratch, made in each child on first use). References are borrowed from the
 * _ProcLoader that embeds this. */
typedef struct fl_fork_child {
    fl_module_state *state;
    PyObject *fetch;                /* (index[, epoch seed]) -> sample (a tuple of fields, or one) */
    PyObject *worker_setup;         /* worker_id -> None, run in each child; or None */
    PyObject *in_descrs, *in_shapes; /* tuples, per field as fetched */
    size_t n_fields;
    size_t in_bytes[FL_SOURCE_MAX_FIELDS], out_bytes[FL_SOURCE_MAX_FIELDS]; /* per sample */
    const size_t *offsets;          /* per field: where its batch starts in a slot */
    const fl_pipeline *pipeline;    /* for field 0, or NULL */
    fl_images image;                /* field 0's geometry, as fetched */
    fl_dtype image_dtype;
    size_t scratch_per_image;       /* the pipeline's scratch for one image */
    unsigned char *scratch_input, *scratch_pipeline; /* one image's, per child, made on first use */
    int froze;                      /* this fork froze gc's generations (see before_fork) */
    PyObject *finish;               /* (raw) -> the batch's object bytes (a buffer) or None; or NULL */
    size_t objects_offset;          /* where a slot's object area starts: a u64 length, then the bytes */
    size_t objects_capacity;        /* bytes the area holds after its length */
    PyObject *sending;              /* in a child: the last batch's bytes, while they travel as extra */
    Py_buffer sending_view;
} fl_fork_child;

/* The length an object area holds when its batch's bytes travel as the slot's extra bytes. */
#define FL_OBJECTS_AFTER UINT64_MAX

/* fl_procpool's fill function, with `ctx` an fl_fork_child; runs in a worker, with the GIL. */
int fl_fork_child_fill(void *ctx, int worker, uint64_t seed, const int64_t *ids, size_t count,
                       unsigned char *slot, fl_proc_extra *extra, int64_t *index, char *error,
                       size_t error_len);

/* The fork hooks for fl_procpool over `child`. Cannot fail. */
fl_proc_hooks fl_fork_child_hooks(fl_fork_child *child);

/* Frees the scratch and bytes a child made (nothing in the parent, which never fills). */
void fl_fork_child_free(fl_fork_child *child);

#endif
