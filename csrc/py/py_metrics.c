/* py_metrics.c - fastloop.Metrics (thread-safe named statistics) and fastloop.MetricStats. */
#include "py_metrics.h"

#include "base/fl_error.h"

typedef struct {
    PyObject_HEAD
    fl_metrics *metrics;
} MetricsObject;

static PyStructSequence_Field stats_fields[] = {
    {"count", "how many values were added"},
    {"sum", "their sum (the total of a counter)"},
    {"mean", "sum / count"},
    {"min", "the smallest value"},
    {"max", "the largest value"},
    {"last", "the most recent value"},
    {NULL, NULL},
};

static PyStructSequence_Desc stats_desc = {
    "fastloop.MetricStats",
    "MetricStats(count, sum, mean, min, max, last)\n\nOne metric's statistics, from "
    "Metrics.get() or Metrics.snapshot().",
    stats_fields,
    6,
};

static fl_module_state *metrics_state(PyObject *self) { return fl_state_from_type(Py_TYPE(self)); }

static PyObject *stats_to_python(fl_module_state *state, const fl_metric *m) {
    PyObject *result = PyStructSequence_New(state->metric_stats_type);
    if (result == NULL)
        return NULL;
    PyObject *items[6] = {
        PyLong_FromUnsignedLongLong(m->count), PyFloat_FromDouble(m->sum),
        PyFloat_FromDouble(m->count ? m->sum / (double)m->count : 0.0),
        PyFloat_FromDouble(m->min), PyFloat_FromDouble(m->max), PyFloat_FromDouble(m->last),
    };
    int failed = 0;
    for (int i = 0; i < 6; i++) {
        failed |= items[i] == NULL;
        PyStructSequence_SetItem(result, i, items[i]);
    }
    if (failed)
        Py_CLEAR(result);
    return result;
}

/* add(name, value=1.0): METH_FASTCALL, as it is called from hot loops. */
static PyObject *metrics_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        fl_raisef(NULL, FL_EXC_TYPE, "add() takes a name and an optional value (%zd given)", nargs);
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(args[0]);
    if (name == NULL)
        return NULL;
    double value = 1.0;
    if (nargs == 2 && (value = PyFloat_AsDouble(args[1])) == -1.0 && PyErr_Occurred())
        return NULL;
    int rc = fl_metrics_add(((MetricsObject *)self)->metrics, name, value);
    if (rc != FL_OK)
        return fl_raise(metrics_state(self), rc, "Metrics.add");
    Py_RETURN_NONE;
}

static PyObject *metrics_get(PyObject *self, PyObject *name_obj) {
    const char *name = PyUnicode_AsUTF8(name_obj);
    if (name == NULL)
        return NULL;
    fl_metric metric;
    if (fl_metrics_get(((MetricsObject *)self)->metrics, name, &metric) != FL_OK) {
        fl_error_clear();
        PyErr_SetObject(PyExc_KeyError, name_obj);
        return NULL;
    }
    return stats_to_python(metrics_state(self), &metric);
}

static PyObject *metrics_snapshot(PyObject *self, PyObject *unused) {
    (void)unused;
    fl_metrics *metrics = ((MetricsObject *)self)->metrics;
    size_t got;
    fl_metric *items = fl_metrics_copy(metrics, &got);
    if (items == NULL)
        return PyErr_NoMemory();
    PyObject *result = PyDict_New();
    fl_module_state *state = metrics_state(self);
    for (size_t i = 0; result != NULL && i < got; i++) {
        PyObject *stats = stats_to_python(state, &items[i]);
        if (stats == NULL || PyDict_SetItemString(result, items[i].name, stats) < 0)
            Py_CLEAR(result);
        Py_XDECREF(stats);
    }
    free(items);
    return result;
}

static PyObject *metrics_reset(PyObject *self, PyObject *unused) {
    (void)unused;
    fl_metrics_reset(((MetricsObject *)self)->metrics);
    Py_RETURN_NONE;
}

static Py_ssize_t metrics_len(PyObject *self) {
    return (Py_ssize_t)fl_metrics_count(((MetricsObject *)self)->metrics);
}

static int metrics_contains(PyObject *self, PyObject *name_obj) {
    const char *name = PyUnicode_AsUTF8(name_obj);
    if (name == NULL)
        return -1;
    fl_metric metric;
    int found = fl_metrics_get(((MetricsObject *)self)->metrics, name, &metric) == FL_OK;
    fl_error_clear();
    return found;
}

static PyObject *metrics_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs && PyDict_GET_SIZE(kwargs)))
        return fl_raisef(NULL, FL_EXC_TYPE, "Metrics() takes no arguments");
    MetricsObject *self = (MetricsObject *)type->tp_alloc(type, 0);
    if (self != NULL && fl_metrics_new(&self->metrics) != FL_OK) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void metrics_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    fl_metrics_free(((MetricsObject *)self)->metrics); /* a watching monitor keeps its own */
    type->tp_free(self);
    Py_DECREF(type);
}

fl_metrics *fl_metrics_from_python(PyObject *obj, fl_module_state *state) {
    if (!PyObject_TypeCheck(obj, state->metrics_type)) {
        fl_raisef(NULL, FL_EXC_TYPE, "expected a fastloop.Metrics, not %.200s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((MetricsObject *)obj)->metrics;
}

static PyMethodDef metrics_methods[] = {
    {"add", (PyCFunction)(void (*)(void))metrics_add, METH_FASTCALL,
     "add($self, name, value=1.0, /)\n--\n\n"
     "Add one value to the metric `name` (created on first use): its count grows by one,\n"
     "its sum by value, and min, max and last follow. Safe from any thread, never loses an\n"
     "update. Names are 1 to 47 bytes."},
    {"get", metrics_get, METH_O,
     "get($self, name, /)\n--\n\nThe MetricStats of `name`; KeyError if nothing was added."},
    {"snapshot", metrics_snapshot, METH_NOARGS,
     "snapshot($self, /)\n--\n\nA consistent copy of every metric: {name: MetricStats}."},
    {"reset", metrics_reset, METH_NOARGS, "reset($self, /)\n--\n\nForget every metric."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(metrics_doc,
             "Metrics()\n--\n\n"
             "Thread-safe named statistics in C: for each name the count, sum, mean, min, max\n"
             "and last of the values added. Any number of threads may add without a lock of\n"
             "their own and without losing a value -- the seed's global loss list done right.\n"
             "A Monitor that watches it reports <name>/per_s and <name>/mean every interval.\n\n"
             "    m = fastloop.Metrics(); m.add(\"samples\", 256); m.add(\"loss\", 0.37)\n"
             "    m.get(\"loss\").mean, m.snapshot()[\"samples\"].sum");

static PyType_Slot metrics_slots[] = {
    {Py_tp_doc, (void *)metrics_doc},
    {Py_tp_new, metrics_new},
    {Py_tp_dealloc, metrics_dealloc},
    {Py_tp_methods, metrics_methods},
    {Py_mp_subscript, metrics_get},
    {Py_mp_length, metrics_len},
    {Py_sq_contains, metrics_contains},
    {0, NULL},
};

static PyType_Spec metrics_spec = {
    .name = "fastloop.Metrics",
    .basicsize = sizeof(MetricsObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = metrics_slots,
};

int fl_metrics_module_init(PyObject *module, fl_module_state *state) {
    state->metrics_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &metrics_spec, NULL);
    if (state->metrics_type == NULL || PyModule_AddType(module, state->metrics_type) < 0)
        return -1;
    state->metric_stats_type = PyStructSequence_NewType(&stats_desc);
    if (state->metric_stats_type == NULL || PyModule_AddType(module, state->metric_stats_type) < 0)
        return -1;
    return 0;
}
