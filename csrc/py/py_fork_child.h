/* py_fork_child.h - the Python runtime of a forked worker of _ProcLoader (py_procloader.c):
 * the fill function and fork hooks it gives fl_procpool.
 *
 * In the child, fill() writes each sample of a batch into the shared-memory slot with
 * fl_sample_store (py_sample_writer.h; with a batch's first sample, fetch gets the epoch seed
 * and seeds the generators once per batch). A Python exception travels back as
 * "module.qualname\x1emessage\x1etraceback" with the failing index.
 *
 * Then `finish(raw)` gives the batch's other values as bytes (strings, None, nested values:
 * see fastloop/_sample_codec.py), written after an 8-byte length into the slot's object area,
 * or, when they do not fit it, handed to fl_procpool as the batch's extra bytes (the length
 * then reads FL_OBJECTS_AFTER); raw: the batch's samples went whole.
 *
 * The hooks call PyOS_BeforeFork / PyOS_AfterFork_Parent / PyOS_AfterFork_Child with the
 * GIL held, as os.fork() does (around a gc.freeze(), so the workers do not copy the
 * parent's heap by collecting it); the child then runs worker_setup(worker_id) (seeds,
 * worker_init_fn) and serves commands with the GIL it inherited (it has no other thread).
 */
#ifndef FL_PY_FORK_CHILD_H
#define FL_PY_FORK_CHILD_H

#include "fl_module.h"

#include "data/fl_procpool.h"
#include "py_sample_writer.h"

/* What a worker needs; filled by the parent before the first fork, read-only after it
 * (but the scratch, made in each child on first use). References are borrowed from the
 * _ProcLoader that embeds this. */
typedef struct fl_fork_child {
    fl_sample_writer writer;        /* the samples into the slot */
    fl_sample_scratch scratch;      /* per child */
    PyObject *fetch;                /* (index[, epoch seed]) -> sample (a tuple of fields, or one) */
    PyObject *worker_setup;         /* worker_id -> None, run in each child; or None */
    PyObject *finish;               /* (raw) -> the batch's object bytes (a buffer) or None; or NULL */
    size_t objects_offset;          /* where a slot's object area starts: a u64 length, then the bytes */
    size_t objects_capacity;        /* bytes the area holds after its length */
    int froze;                      /* this fork froze gc's generations (see before_fork) */
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
