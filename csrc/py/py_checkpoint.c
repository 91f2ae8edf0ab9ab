/* py_checkpoint.c - fastloop._core._Checkpointer, the C half of fastloop.Checkpointer.
 * save() waits (interruptibly, GIL released) while max_pending snapshots wait to be written,
 * copies the arrays into a staging area with the GIL released, and hands it to the writer. */
#include "fl_module.h"
#include "fl_numpy.h"

#include <limits.h>

#include "checkpoint/fl_checkpoint.h"
#include "checkpoint/fl_safetensors.h"
#include "base/fl_error.h"

typedef struct {
    PyObject_HEAD
    fl_checkpointer *checkpointer;
    PyObject *directory;
} CheckpointerObject;

static fl_module_state *ckpt_state(PyObject *self) { return fl_state_from_type(Py_TYPE(self)); }

/* Raises a pending background write error as fastloop.CheckpointError; -1 when it did. */
static int raise_write_error(PyObject *self) {
    char message[PATH_MAX + 300];
    if (!fl_checkpointer_take_error(((CheckpointerObject *)self)->checkpointer, message, sizeof message))
        return 0;
    fl_raisef(&ckpt_state(self)->exc, FL_EXC_CHECKPOINT, "%s", message);
    return -1;
}

typedef struct {
    fl_checkpointer *checkpointer;
    size_t n, bytes;
    fl_st_entry *entries;
    unsigned char *data;
} begin_call;

static int attempt_begin(void *ctx, double timeout_s) {
    begin_call *call = ctx;
    return fl_checkpointer_begin(call->checkpointer, call->n, call->bytes, timeout_s,
                                 &call->entries, &call->data);
}

/* UTF-8 of a str without NULs (the core takes C strings); NULL with ValueError naming `what`. */
static const char *c_text(PyObject *text, const char *what, Py_ssize_t index, Py_ssize_t *len) {
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, len);
    if (utf8 != NULL && (size_t)*len != strlen(utf8)) {
        fl_raisef(NULL, FL_EXC_VALUE, "%s %zd contains a NUL character", what, index);
        return NULL;
    }
    return utf8;
}

/* Checks one (name, array, dtype) entry; fills its metadata; returns its size or -1. */
static Py_ssize_t describe(PyObject *item, Py_ssize_t index, fl_st_entry *entry, size_t offset) {
    PyObject *name_obj, *array_obj, *dtype_obj;
    if (!PyTuple_Check(item) ||
        !PyArg_ParseTuple(item, "UOU;entries are (name, array, dtype) tuples", &name_obj,
                          &array_obj, &dtype_obj))
        return -1;
    Py_ssize_t name_len, dtype_len;
    const char *name = c_text(name_obj, "tensor name", index, &name_len);
    const char *dtype = name ? c_text(dtype_obj, "dtype of tensor", index, &dtype_len) : NULL;
    if (name == NULL || dtype == NULL)
        return -1;
    if (name_len == 0 || name_len >= FL_ST_NAME_MAX || dtype_len >= FL_ST_DTYPE_MAX) {
        fl_raisef(NULL, FL_EXC_VALUE, "tensor name %R must be 1 to %d bytes (dtype code under %d)",
                  name_obj, FL_ST_NAME_MAX - 1, FL_ST_DTYPE_MAX);
        return -1;
    }
    char arg[FL_ST_NAME_MAX + 16];
    snprintf(arg, sizeof arg, "state[%s]", name);
    if (fl_check_array(array_obj, arg) == NULL)
        return -1;
    PyArrayObject *array = (PyArrayObject *)array_obj;
    if (PyArray_NDIM(array) > FL_ST_MAX_DIMS) {
        fl_raisef(NULL, FL_EXC_VALUE, "'%s' has more than %d dimensions", arg, FL_ST_MAX_DIMS);
        return -1;
    }
    memcpy(entry->name, name, (size_t)name_len + 1);
    memcpy(entry->dtype, dtype, (size_t)dtype_len + 1);
    entry->ndim = PyArray_NDIM(array);
    for (int d = 0; d < entry->ndim; d++)
        entry->shape[d] = PyArray_DIM(array, d);
    entry->offset = offset;
    entry->nbytes = (size_t)PyArray_NBYTES(array);
    return PyArray_NBYTES(array);
}

/* The (key, value) str pairs of `pairs` (a tuple the caller holds) as C strings borrowed
 * from it; -1 with an exception. */
static int metadata_pairs(PyObject *pairs, fl_st_meta *meta) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pairs); i++) {
        PyObject *key, *value, *pair = PyTuple_GET_ITEM(pairs, i);
        Py_ssize_t len;
        if (!PyTuple_Check(pair) ||
            !PyArg_ParseTuple(pair, "UU;metadata is a sequence of (str, str) pairs", &key, &value))
            return -1;
        meta[i].key = c_text(key, "metadata key", i, &len);
        meta[i].value = meta[i].key ? c_text(value, "metadata value", i, &len) : NULL;
        if (meta[i].value == NULL)
            return -1;
    }
    return 0;
}

/* Raises what begin answered when it gave no staging area. */
static PyObject *raise_begin_error(PyObject *self, int rc) {
    if (rc == FL_EINTR)
        return NULL;
    if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
        fl_raisef(NULL, FL_EXC_TIMEOUT, "save: the writer is still behind (max_pending "
                                            "checkpoints wait to be written) after the timeout");
        return NULL;
    }
    if (rc == FL_ECLOSED) {
        fl_raisef(&ckpt_state(self)->exc, FL_EXC_CLOSED, "save() on a closed Checkpointer");
        return NULL;
    }
    return fl_raise(ckpt_state(self), rc, "save");
}

/* Fills the reserved staging area from the entries (the copy with the GIL released, on
 * `threads` threads) and commits it; on failure gives it back. */
static PyObject *fill_and_commit(PyObject *self, begin_call *call, PyObject *entries,
                                 PyObject *pairs, long long step, int threads) {
    fl_st_meta *meta = PyMem_Calloc((size_t)PyTuple_GET_SIZE(pairs) + 1, sizeof *meta);
    const void **sources = PyMem_Calloc(call->n + 1, sizeof *sources);
    if (meta == NULL || sources == NULL || metadata_pairs(pairs, meta) < 0)
        goto fail;
    size_t offset = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(entries); i++) {
        Py_ssize_t size = describe(PyTuple_GET_ITEM(entries, i), i, &call->entries[i], offset);
        if (size < 0)
            goto fail;
        sources[i] = PyArray_DATA((PyArrayObject *)PyTuple_GET_ITEM(PyTuple_GET_ITEM(entries, i), 1));
        offset += (size_t)size;
    }
    if (offset > call->bytes) { /* the arrays changed under us (another thread resized one) */
        fl_raisef(NULL, FL_EXC_RUNTIME, "save: the state's arrays changed size while it was copied");
        goto fail;
    }
    fl_exec exec = fl_exec_acquire(ckpt_state(self), threads);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    fl_checkpoint_copy(exec, call->entries, call->n, sources, call->data);
    rc = fl_checkpointer_commit(call->checkpointer, step, meta, (size_t)PyTuple_GET_SIZE(pairs));
    Py_END_ALLOW_THREADS
    fl_exec_release(ckpt_state(self), exec);
    PyMem_Free(meta);
    PyMem_Free(sources);
    if (rc != FL_OK) /* committing gave the area back */
        return fl_raise(ckpt_state(self), rc, "save");
    Py_RETURN_NONE;
fail:
    PyMem_Free(meta);
    PyMem_Free(sources);
    fl_checkpointer_abort(call->checkpointer);
    return NULL;
}

/* The arrays' total size, overflow-checked; -1 with an exception. */
static int total_bytes(PyObject *entries, size_t *bytes) {
    *bytes = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(entries); i++) {
        PyObject *item = PyTuple_GET_ITEM(entries, i);
        PyObject *array = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3 ? PyTuple_GET_ITEM(item, 1) : NULL;
        size_t size = array != NULL && PyArray_Check(array) ? (size_t)PyArray_NBYTES((PyArrayObject *)array) : 0;
        if (__builtin_add_overflow(*bytes, size, bytes)) {
            fl_raisef(NULL, FL_EXC_OVERFLOW, "save: the state's arrays add up to more than SIZE_MAX bytes");
            return -1;
        }
    }
    return 0;
}

static PyObject *ckpt_save(PyObject *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache save_args = FL_ARG_CACHE("save");
    PyObject *entries_obj, *metadata_obj, *timeout_obj = Py_None;
    long long step;
    double timeout;
    int num_workers = 1;
    if (fl_parse_args_dict(&save_args, args, kwargs, FL_ARG("entries", OBJECT, &entries_obj),
                           FL_ARG("metadata", OBJECT, &metadata_obj), FL_ARG("step", INT64, &step),
                           FL_ARG("|timeout", OBJECT, &timeout_obj),
                           FL_ARG("num_workers", INT, &num_workers)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0 || raise_write_error(self) < 0)
        return NULL;
    if (step < 0) {
        fl_raisef(NULL, FL_EXC_VALUE, "'step' must be >= 0, not %lld", step);
        return NULL;
    }
    if (num_workers < 1 || num_workers > FL_POOL_MAX_WORKERS) {
        fl_raisef(NULL, FL_EXC_VALUE, "'num_workers' must be 1 to %d, not %d", FL_POOL_MAX_WORKERS,
                  num_workers);
        return NULL;
    }
    PyObject *entries = PySequence_Tuple(entries_obj); /* ours: nothing can vanish meanwhile */
    PyObject *pairs = entries ? PySequence_Tuple(metadata_obj) : NULL;
    begin_call call = {((CheckpointerObject *)self)->checkpointer, 0, 0, NULL, NULL};
    PyObject *result = NULL;
    if (pairs == NULL || total_bytes(entries, &call.bytes) < 0)
        goto done;
    call.n = (size_t)PyTuple_GET_SIZE(entries);
    int rc = fl_wait_interruptibly(attempt_begin, &call, timeout);
    if (rc != FL_OK) {
        result = raise_begin_error(self, rc);
        goto done;
    }
    if (raise_write_error(self) < 0) { /* a write this save waited for failed: say so now */
        fl_checkpointer_abort(call.checkpointer);
        goto done;
    }
    result = fill_and_commit(self, &call, entries, pairs, step, num_workers);
done:
    Py_XDECREF(entries);
    Py_XDECREF(pairs);
    return result;
}

static int attempt_wait(void *ctx, double timeout_s) { return fl_checkpointer_wait(ctx, timeout_s); }

static PyObject *ckpt_wait(PyObject *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache wait_args = FL_ARG_CACHE("wait");
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args_dict(&wait_args, args, kwargs,
                           FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0)
        return NULL;
    int rc = fl_wait_interruptibly(attempt_wait, ((CheckpointerObject *)self)->checkpointer, timeout);
    if (rc == FL_EINTR || raise_write_error(self) < 0)
        return NULL;
    return PyBool_FromLong(rc == FL_OK);
}

static int attempt_wait_closed(void *ctx, double timeout_s) {
    return fl_checkpointer_wait_closed(ctx, timeout_s);
}

/* close(timeout=None): refuses new saves first, then waits up to `timeout` (None: no limit)
 * for the writer to finish what was committed, a save filling its snapshot on another thread
 * included (waiting first and closing after let such a save slip in between, unwritten when
 * close() returned). Returns whether it finished; when it did, raises a write error not
 * reported yet. */
static PyObject *ckpt_close(PyObject *self, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache close_args = FL_ARG_CACHE("close");
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args_dict(&close_args, args, kwargs, FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0)
        return NULL;
    fl_checkpointer *c = ((CheckpointerObject *)self)->checkpointer;
    fl_checkpointer_close(c, 0); /* never joins with the GIL held; waits below, interruptibly */
    int rc = fl_wait_interruptibly(attempt_wait_closed, c, timeout);
    if (rc == FL_EINTR)
        return NULL;
    if (rc != FL_OK)
        Py_RETURN_FALSE; /* still writing in the background */
    if (raise_write_error(self) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *ckpt_wait_closed(PyObject *self, PyObject *args) {
    static fl_arg_cache wait_closed_args = FL_ARG_CACHE("wait_closed"); /* positional only */
    PyObject *timeout_obj = Py_None;
    double timeout;
    if (fl_parse_args_dict(&wait_closed_args, args, NULL,
                           FL_ARG("|timeout", OBJECT, &timeout_obj)) < 0 ||
        fl_parse_timeout(timeout_obj, 1, &timeout) < 0)
        return NULL;
    fl_checkpointer *c = ((CheckpointerObject *)self)->checkpointer;
    int rc = fl_wait_interruptibly(attempt_wait_closed, c, timeout);
    if (rc == FL_EINTR)
        return NULL;
    return PyBool_FromLong(rc == FL_OK);
}

static PyObject *ckpt_stats(PyObject *self, PyObject *unused) {
    (void)unused;
    fl_checkpoint_stats s;
    fl_checkpointer_stats(((CheckpointerObject *)self)->checkpointer, &s);
    return Py_BuildValue("{s:K,s:K,s:d,s:L,s:i,s:L}", "written", (unsigned long long)s.written,
                         "bytes", (unsigned long long)s.bytes, "last_write_s", s.last_write_s,
                         "last_step", (long long)s.last_step, "pending", s.pending,
                         "pending_step", (long long)s.pending_step);
}

static PyObject *ckpt_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static fl_arg_cache checkpointer_args = FL_ARG_CACHE("_Checkpointer");
    PyObject *dir_obj, *dir_bytes = NULL;
    int keep = 3, max_pending = 1;
    if (fl_parse_args_dict(&checkpointer_args, args, kwargs, FL_ARG("directory", OBJECT, &dir_obj),
                           FL_ARG("|keep", INT, &keep), FL_ARG("max_pending", INT, &max_pending)) < 0 ||
        !PyUnicode_FSConverter(dir_obj, &dir_bytes))
        return NULL;
    fl_module_state *state = fl_state_from_type(type);
    CheckpointerObject *self = (CheckpointerObject *)type->tp_alloc(type, 0);
    int rc = FL_ENOMEM;
    if (self != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = fl_checkpointer_new(PyBytes_AS_STRING(dir_bytes), keep, max_pending, &self->checkpointer);
        Py_END_ALLOW_THREADS
    }
    if (rc != FL_OK) {
        Py_XDECREF(self);
        Py_DECREF(dir_bytes);
        return fl_raise_with(state, rc, &(fl_raise_opts){.what = rc == FL_ESYS ? NULL : "Checkpointer", /* the detail names the path */
                                                        .in = FL_IN_CHECKPOINT});
    }
    self->directory = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(dir_bytes));
    Py_DECREF(dir_bytes);
    return (PyObject *)self;
}

/* Dropped without close(): a pending snapshot is still written by the writer thread, which
 * then frees the checkpointer; nothing blocks here. */
static void ckpt_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    CheckpointerObject *ckpt = (CheckpointerObject *)self;
    if (ckpt->checkpointer != NULL) {
        fl_checkpointer_close(ckpt->checkpointer, 0);
        fl_checkpointer_release(ckpt->checkpointer);
    }
    Py_XDECREF(ckpt->directory);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *ckpt_get_directory(PyObject *self, void *closure) {
    (void)closure;
    return Py_NewRef(((CheckpointerObject *)self)->directory);
}

static PyMethodDef ckpt_methods[] = {
    {"save", (PyCFunction)(void (*)(void))ckpt_save, METH_VARARGS | METH_KEYWORDS,
     "save($self, /, entries, metadata, step, timeout=None, num_workers=1)\n--\n\nSnapshot (name, "
     "array, safetensors dtype) entries and (key, value) metadata pairs as checkpoint `step`, "
     "copying on `num_workers` threads."},
    {"wait", (PyCFunction)(void (*)(void))ckpt_wait, METH_VARARGS | METH_KEYWORDS,
     "wait($self, /, timeout=None)\n--\n\nWait until every save is written; False on timeout."},
    {"close", (PyCFunction)(void (*)(void))ckpt_close, METH_VARARGS | METH_KEYWORDS,
     "close($self, /, timeout=None)\n--\n\nRefuse new saves; wait up to timeout until every save "
     "is written; False when still writing."},
    {"wait_closed", ckpt_wait_closed, METH_VARARGS,
     "wait_closed($self, timeout=None, /)\n--\n\nWait for the writer to finish after close."},
    {"stats", ckpt_stats, METH_NOARGS, "stats($self, /)\n--\n\nCounts and the last write's time."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ckpt_getset[] = {
    {"directory", ckpt_get_directory, NULL, "Where checkpoints are written.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ckpt_slots[] = {
    {Py_tp_doc, "The C half of fastloop.Checkpointer (use fastloop.Checkpointer)."},
    {Py_tp_new, ckpt_new},
    {Py_tp_dealloc, ckpt_dealloc},
    {Py_tp_methods, ckpt_methods},
    {Py_tp_getset, ckpt_getset},
    {0, NULL},
};

static PyType_Spec ckpt_spec = {
    .name = "fastloop._core._Checkpointer",
    .basicsize = sizeof(CheckpointerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = ckpt_slots,
};

int fl_checkpoint_module_init(PyObject *module, fl_module_state *state) {
    state->checkpointer_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &ckpt_spec, NULL);
    if (state->checkpointer_type == NULL || PyModule_AddType(module, state->checkpointer_type) < 0)
        return -1;
    return 0;
}
