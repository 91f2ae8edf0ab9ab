/* module.c - fastloop._core: module state, multi-phase init, and the shared ops pool. */
#include "fl_module.h"

#define FL_NUMPY_IMPORT
#include "fl_numpy.h"

#include <unistd.h>

#include "base/fl_error.h"

fl_module_state *fl_state_from_type(PyTypeObject *type) {
    PyObject *module = PyType_GetModuleByDef(type, &fl_module_def);
    return module == NULL ? NULL : fl_state_from_module(module);
}

fl_exec fl_exec_acquire(fl_module_state *state, int threads) {
    fl_exec exec = {NULL, 1};
    if (threads <= 1)
        return exec;
    pthread_mutex_lock(&state->pool_lock);
    if (state->pool != NULL && state->pool_pid != getpid()) {
        /* Inherited through fork(): its workers do not exist in this process and its lock
         * may have been held at the fork. Abandon it (freeing would touch that lock). */
        state->pool = NULL;
        state->pool_users = 0;
    }
    if (state->pool == NULL && fl_pool_new(&state->pool) != FL_OK)
        state->pool = NULL; /* no pool: the work runs on the caller's thread */
    state->pool_pid = getpid();
    if (state->pool != NULL) {
        state->pool_users++;
        exec.pool = state->pool;
        exec.threads = threads;
    }
    pthread_mutex_unlock(&state->pool_lock);
    return exec;
}

void fl_exec_release(fl_module_state *state, fl_exec exec) {
    if (exec.pool == NULL)
        return;
    pthread_mutex_lock(&state->pool_lock);
    state->pool_users--;
    pthread_mutex_unlock(&state->pool_lock);
}

static int module_exec(PyObject *module) {
    fl_module_state *state = fl_state_from_module(module);
    if (pthread_mutex_init(&state->pool_lock, NULL) != 0) {
        fl_raisef(NULL, FL_EXC_OS, "cannot create a mutex");
        return -1;
    }
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    if (fl_exc_load(&state->exc) < 0)
        return -1;
    PyObject *names = fl_exc_names(); /* for the test that errors.py matches the table */
    int rc = PyModule_AddObjectRef(module, "_exception_names", names);
    Py_XDECREF(names);
    if (rc < 0)
        return -1;
    if (fl_queue_module_init(module, state) < 0 || fl_metrics_module_init(module, state) < 0 ||
        fl_monitor_module_init(module, state) < 0 ||
        fl_checkpoint_module_init(module, state) < 0 || fl_pipeline_module_init(module, state) < 0 ||
        fl_loader_module_init(module, state) < 0 || fl_procloader_module_init(module, state) < 0 ||
        fl_thread_loader_module_init(module, state) < 0 ||
        fl_npy_module_init(module, state) < 0 || fl_nn_module_init(module, state) < 0 || fl_ops_module_init(module) < 0 ||
        fl_image_module_init(module) < 0 || fl_json_numbers_module_init(module) < 0)
        return -1;
#ifdef FL_TESTING /* the tests' hooks: only in builds made with FASTLOOP_TESTING=1, never a wheel */
    if (fl_testing_module_init(module) < 0)
        return -1;
#endif
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
    fl_module_state *state = fl_state_from_module(module);
    Py_VISIT(state->queue_type);
    Py_VISIT(state->event_type);
    fl_exc_traverse(&state->exc, visit, arg);
    Py_VISIT(state->npy_mapping_type);
    Py_VISIT(state->model_type);
    Py_VISIT(state->optimizer_type);
    Py_VISIT(state->lease_type);
    Py_VISIT(state->loader_type);
    Py_VISIT(state->pipeline_type);
    Py_VISIT(state->checkpointer_type);
    Py_VISIT(state->monitor_type);
    Py_VISIT(state->metric_stats_type);
    Py_VISIT(state->metrics_type);
    return 0;
}

static int module_clear(PyObject *module) {
    fl_module_state *state = fl_state_from_module(module);
    Py_CLEAR(state->queue_type);
    Py_CLEAR(state->event_type);
    fl_exc_clear(&state->exc);
    Py_CLEAR(state->npy_mapping_type);
    Py_CLEAR(state->model_type);
    Py_CLEAR(state->optimizer_type);
    Py_CLEAR(state->lease_type);
    Py_CLEAR(state->loader_type);
    Py_CLEAR(state->pipeline_type);
    Py_CLEAR(state->checkpointer_type);
    Py_CLEAR(state->monitor_type);
    Py_CLEAR(state->metric_stats_type);
    Py_CLEAR(state->metrics_type);
    return 0;
}

/* Joins the pool's workers unless an op still runs in one of them (a daemon thread at
 * interpreter exit): then the pool is left to the exiting process rather than freed under
 * its users. */
static void module_free(void *module) {
    module_clear(module);
    fl_module_state *state = fl_state_from_module(module);
    pthread_mutex_lock(&state->pool_lock);
    fl_pool *pool = state->pool_users == 0 ? state->pool : NULL;
    state->pool = NULL;
    pthread_mutex_unlock(&state->pool_lock);
    fl_pool_free(pool);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

struct PyModuleDef fl_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastloop._core",
    .m_doc = "The C core of fastloop: Queue, Event and the GIL-free ops kernels.",
    .m_size = sizeof(fl_module_state),
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&fl_module_def); }
