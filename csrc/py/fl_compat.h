/* fl_compat.h - the CPython C API calls the bindings use that older supported Pythons
 * (3.9, 3.10) lack, defined here from calls those versions have; and the free-threading
 * critical-section macros, empty on builds with a GIL (before 3.13 or without
 * Py_GIL_DISABLED), where the GIL already serializes what they guard.
 *
 * Included by fl_module.h (fastloop._core) and py_cuda.h (fastloop._cuda) right after
 * Python.h. Nothing else: each definition is guarded by the version that added the call.
 */
#ifndef FL_COMPAT_H
#define FL_COMPAT_H

#include <Python.h>

#if PY_VERSION_HEX < 0x030A0000 /* 3.10 added these */
static inline PyObject *fl_new_ref(PyObject *obj) {
    Py_INCREF(obj);
    return obj;
}
static inline PyObject *fl_xnew_ref(PyObject *obj) {
    Py_XINCREF(obj);
    return obj;
}
/* Macros taking any object pointer, as 3.10's are. */
#define Py_NewRef(obj) fl_new_ref((PyObject *)(obj))
#define Py_XNewRef(obj) fl_xnew_ref((PyObject *)(obj))
static inline int PyModule_AddObjectRef(PyObject *module, const char *name, PyObject *value) {
    if (value == NULL) {
        if (!PyErr_Occurred())
            /* CPython's own message, as 3.10's call raises it (the shim sits below the table) */
            PyErr_SetString(PyExc_SystemError, "PyModule_AddObjectRef() with a NULL value");
        return -1;
    }
    Py_INCREF(value);
    if (PyModule_AddObject(module, name, value) < 0) { /* steals only on success */
        Py_DECREF(value);
        return -1;
    }
    return 0;
}
/* On 3.9 types stay mutable, and a type meant to be made only by C gets tp_new = NULL
 * from FL_DISALLOW_INSTANTIATION after it is created (what the flag does on 3.10+). */
#define Py_TPFLAGS_IMMUTABLETYPE 0
#define Py_TPFLAGS_DISALLOW_INSTANTIATION 0
#define FL_DISALLOW_INSTANTIATION(type) ((type)->tp_new = NULL)
#else
#define FL_DISALLOW_INSTANTIATION(type) ((void)(type))
#endif

#if PY_VERSION_HEX < 0x030B0000 /* 3.11 added PyType_GetModuleByDef */
/* The module, defined by `def`, of the first heap type in type's MRO that has one (a
 * borrowed reference), or NULL with TypeError set. */
static inline PyObject *PyType_GetModuleByDef(PyTypeObject *type, PyModuleDef *def) {
    PyObject *mro = type->tp_mro;
    for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *base = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (!(base->tp_flags & Py_TPFLAGS_HEAPTYPE))
            continue;
        PyObject *module = ((PyHeapTypeObject *)base)->ht_module;
        if (module != NULL && PyModule_GetDef(module) == def)
            return module;
    }
    /* CPython's own error, as 3.11's call raises it (the shim sits below the table) */
    PyErr_Format(PyExc_TypeError, "PyType_GetModuleByDef: no superclass of '%s' has the given module",
                 type->tp_name);
    return NULL;
}
#endif

#if PY_VERSION_HEX < 0x030D0000 /* 3.13 made Py_IsFinalizing public and added the *Ref getters */
#define Py_IsFinalizing() _Py_IsFinalizing()
/* A strong reference to dict[key] in *result: 1 found, 0 missing (*result NULL), -1 error.
 * (With a GIL the borrowed item cannot vanish before the INCREF.) */
static inline int PyDict_GetItemStringRef(PyObject *dict, const char *key, PyObject **result) {
    PyObject *value = PyDict_GetItemString(dict, key);
    *result = value;
    Py_XINCREF(value);
    return value != NULL;
}
#endif

/* Py_BEGIN_CRITICAL_SECTION exists from 3.13 (a no-op with the GIL there too). */
#ifndef Py_BEGIN_CRITICAL_SECTION
#define Py_BEGIN_CRITICAL_SECTION(op) {
#define Py_END_CRITICAL_SECTION() }
#endif

#endif
