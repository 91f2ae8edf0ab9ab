/* py_fork_child.c - what a forked worker of _ProcLoader runs: Python fetches into shared
 * memory, and the fork hooks (see py_fork_child.h). */
#include "py_fork_child.h"
#include "fl_numpy.h"

#include <unistd.h>

#include "base/fl_error.h"

/* "module.qualname\x1emessage\x1etraceback" of the pending exception into error; clears it. */
static void describe_exception(char *error, size_t len) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *module = type ? PyObject_GetAttrString(type, "__module__") : NULL;
    PyObject *qualname = type ? PyObject_GetAttrString(type, "__qualname__") : NULL;
    PyObject *message = value ? PyObject_Str(value) : NULL;
    PyObject *traceback = PyImport_ImportModule("traceback");
    PyObject *lines = traceback && type ? PyObject_CallMethod(traceback, "format_exception", "OOO", type,
                                                              value ? value : Py_None, tb ? tb : Py_None)
                                        : NULL;
    PyObject *empty = PyUnicode_FromString("");
    PyObject *text = lines && empty ? PyUnicode_Join(empty, lines) : NULL;
    PyErr_Clear();
    snprintf(error, len, "%s.%s\x1e%s\x1e%s", module ? PyUnicode_AsUTF8(module) : "builtins",
             qualname ? PyUnicode_AsUTF8(qualname) : "Exception", message ? PyUnicode_AsUTF8(message) : "",
             text ? PyUnicode_AsUTF8(text) : "");
    PyErr_Clear();
    Py_XDECREF(module), Py_XDECREF(qualname), Py_XDECREF(message), Py_XDECREF(traceback);
    Py_XDECREF(lines), Py_XDECREF(empty), Py_XDECREF(text);
    Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
}

/* Lets go of the bytes the last batch sent after its result (they have been written). */
static void release_sending(fl_fork_child *self) {
    if (self->sending == NULL)
        return;
    PyBuffer_Release(&self->sending_view);
    Py_CLEAR(self->sending);
}

/* finish(raw)'s bytes into the slot's object area, or as the batch's extra bytes when they do
 * not fit (kept until the next fill). Returns 0, or -1 with a Python error. */
static int write_objects(fl_fork_child *self, int raw, unsigned char *slot, fl_proc_extra *extra) {
    PyObject *blob = PyObject_CallFunction(self->finish, "i", raw);
    if (blob == NULL)
        return -1;
    uint64_t len = 0;
    if (blob != Py_None) {
        if (PyObject_GetBuffer(blob, &self->sending_view, PyBUF_SIMPLE) < 0) {
            Py_DECREF(blob);
            return -1;
        }
        len = (uint64_t)self->sending_view.len;
        if (len <= self->objects_capacity) {
            memcpy(slot + self->objects_offset + sizeof len, self->sending_view.buf, (size_t)len);
            PyBuffer_Release(&self->sending_view);
        } else {
            self->sending = Py_NewRef(blob);
            *extra = (fl_proc_extra){self->sending_view.buf, (size_t)len};
            len = FL_OBJECTS_AFTER;
        }
    }
    Py_DECREF(blob);
    memcpy(slot + self->objects_offset, &len, sizeof len);
    return 0;
}

int fl_fork_child_fill(void *ctx, int worker, uint64_t seed, const int64_t *ids, size_t count,
                       unsigned char *slot, fl_proc_extra *extra, int64_t *index, char *error,
                       size_t error_len) {
    fl_fork_child *self = ctx;
    (void)worker;
    release_sending(self);
    if (fl_sample_scratch_ready(&self->writer, &self->scratch) < 0) { /* once per worker */
        *index = -1;
        describe_exception(error, error_len);
        return 1;
    }
    int raw = 0;
    for (size_t i = 0; i < count; i++) {
        fl_procpool_exit_if_orphaned(); /* the main process died: end now, not after the batch */
        int rc = fl_sample_store(&self->writer, &self->scratch, self->fetch, ids[i], seed, i, slot, raw);
        if (rc < 0) {
            *index = ids[i];
            describe_exception(error, error_len);
            return 1;
        }
        raw |= rc;
    }
    if (self->finish != NULL && write_objects(self, raw, slot, extra) < 0) {
        *index = -1; /* the message names the sample */
        describe_exception(error, error_len);
        return 1;
    }
    return 0;
}

/* Calls gc.<name>() (gc.freeze / gc.unfreeze / gc.get_freeze_count); -1 if that fails. */
static Py_ssize_t call_gc(const char *name) {
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *result = gc != NULL ? PyObject_CallMethod(gc, name, NULL) : NULL;
    Py_ssize_t value = result == NULL ? -1 : result == Py_None ? 0 : PyLong_AsSsize_t(result);
    Py_XDECREF(result);
    Py_XDECREF(gc);
    if (PyErr_Occurred()) { /* only a memory optimisation: never fail a fork for it */
        PyErr_Clear();
        return -1;
    }
    return value;
}

/* Before forking, the parent's objects are moved to gc's permanent generation, as CPython's
 * gc.freeze() documentation advises: a collection in a worker would otherwise write to every
 * inherited object's header and copy every page of the parent's heap. Skipped if the
 * program freezes objects itself. */
static void before_fork(void *ctx) {
    fl_fork_child *self = ctx;
    self->froze = call_gc("get_freeze_count") == 0 && call_gc("freeze") == 0;
    PyOS_BeforeFork();
}

static void after_fork_parent(void *ctx) {
    fl_fork_child *self = ctx;
    PyOS_AfterFork_Parent();
    if (self->froze) /* the parent collects its objects as before; the workers keep them frozen */
        call_gc("unfreeze");
    self->froze = 0;
}

static void after_fork_child(void *ctx, int worker) {
    fl_fork_child *self = ctx;
    PyOS_AfterFork_Child();
    if (self->worker_setup != Py_None) {
        PyObject *result = PyObject_CallFunction(self->worker_setup, "i", worker);
        if (result == NULL) { /* the parent sees this worker exit with status 3 */
            PyErr_Print();
            _exit(3);
        }
        Py_DECREF(result);
    }
}

fl_proc_hooks fl_fork_child_hooks(fl_fork_child *child) {
    return (fl_proc_hooks){before_fork, after_fork_parent, after_fork_child, child};
}

void fl_fork_child_free(fl_fork_child *child) {
    release_sending(child);
    fl_sample_scratch_free(&child->scratch);
}
