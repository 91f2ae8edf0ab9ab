/* py_args.c - the declaration-driven argument parser of py_args.h (its general case) and its
 * converters. Its TypeErrors are raised here, in one place, through fl_exc's table. */
#include <limits.h>
#include <string.h>

#include "fl_exc.h"
#include "py_args.h"

/* A converter's results besides 0 (done) and -1 (its own exception set). */
enum { FL_ARG_WRONG_TYPE = -2, FL_ARG_OUT_OF_RANGE = -3 };

/* ---- converters ---- */

static int to_object(PyObject *obj, void *out) {
    *(PyObject **)out = obj;
    return 0;
}

static int to_str_object(PyObject *obj, void *out) {
    if (!PyUnicode_Check(obj))
        return FL_ARG_WRONG_TYPE;
    *(PyObject **)out = obj;
    return 0;
}

static int to_bool(PyObject *obj, void *out) {
    int truth = PyObject_IsTrue(obj);
    if (truth < 0)
        return -1;
    *(int *)out = truth;
    return 0;
}

/* An int (or an object with __index__, bools included as PyArg_Parse takes them) as a long
 * long: FL_ARG_WRONG_TYPE for anything else, FL_ARG_OUT_OF_RANGE past long long. */
static int to_long_long(PyObject *obj, long long *value) {
    if (!PyLong_Check(obj) && !PyIndex_Check(obj))
        return FL_ARG_WRONG_TYPE;
    int overflow;
    *value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (*value == -1 && PyErr_Occurred())
        return -1;
    return overflow ? FL_ARG_OUT_OF_RANGE : 0;
}

static int to_int(PyObject *obj, void *out) {
    long long value;
    int rc = to_long_long(obj, &value);
    if (rc == 0 && (value < INT_MIN || value > INT_MAX))
        rc = FL_ARG_OUT_OF_RANGE;
    if (rc == 0)
        *(int *)out = (int)value;
    return rc;
}

static int to_ssize(PyObject *obj, void *out) {
    long long value;
    int rc = to_long_long(obj, &value);
    if (rc == 0 && (value < PY_SSIZE_T_MIN || value > PY_SSIZE_T_MAX))
        rc = FL_ARG_OUT_OF_RANGE;
    if (rc == 0)
        *(Py_ssize_t *)out = (Py_ssize_t)value;
    return rc;
}

static int to_int64(PyObject *obj, void *out) {
    return to_long_long(obj, (long long *)out);
}

static int to_uint64(PyObject *obj, void *out) {
    if (!PyLong_Check(obj) && !PyIndex_Check(obj))
        return FL_ARG_WRONG_TYPE;
    PyObject *number = PyNumber_Index(obj);
    if (number == NULL)
        return -1;
    unsigned long long value = PyLong_AsUnsignedLongLong(number);
    Py_DECREF(number);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear(); /* negative or too big */
        return FL_ARG_OUT_OF_RANGE;
    }
    *(unsigned long long *)out = value;
    return 0;
}

static int to_double(PyObject *obj, void *out) {
    if (PyFloat_CheckExact(obj)) { /* the common case, without a call */
        *(double *)out = PyFloat_AS_DOUBLE(obj);
        return 0;
    }
    double value = PyFloat_AsDouble(obj);
    if (value == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1; /* an int too big for a double */
        /* TypeError, or what a __float__ raises for a value of several elements (torch: a
         * ValueError): the argument is named as of the wrong type */
        PyErr_Clear();
        return FL_ARG_WRONG_TYPE;
    }
    *(double *)out = value;
    return 0;
}

static int to_str(PyObject *obj, void *out) {
    if (!PyUnicode_Check(obj))
        return FL_ARG_WRONG_TYPE;
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(obj, &len);
    if (text == NULL)
        return -1;
    if (strlen(text) != (size_t)len) {
        fl_raisef(NULL, FL_EXC_VALUE, "embedded null character");
        return -1;
    }
    *(const char **)out = text;
    return 0;
}

static int to_str_or_none(PyObject *obj, void *out) {
    if (obj == Py_None) {
        *(const char **)out = NULL;
        return 0;
    }
    return to_str(obj, out);
}

typedef struct {
    int (*convert)(PyObject *obj, void *out); /* 0, -1 or FL_ARG_WRONG_TYPE/_OUT_OF_RANGE */
    const char *expected; /* what the TypeError says the argument must be */
} converter;

static const converter converters[] = { /* by fl_arg_kind */
    [FL_ARG_OBJECT] = {to_object, "any object"},
    [FL_ARG_STR_OBJECT] = {to_str_object, "str"},
    [FL_ARG_BOOL] = {to_bool, "bool"},
    [FL_ARG_INT] = {to_int, "int"},
    [FL_ARG_SSIZE] = {to_ssize, "int"},
    [FL_ARG_INT64] = {to_int64, "int"},
    [FL_ARG_UINT64] = {to_uint64, "int"},
    [FL_ARG_DOUBLE] = {to_double, "a real number"},
    [FL_ARG_STR] = {to_str, "str"},
    [FL_ARG_STR_OR_NONE] = {to_str_or_none, "str or None"},
};

/* Converts obj into decl->out; 0, or -1 with an exception naming the function and argument. */
static int convert(const fl_arg_cache *c, const fl_arg *decl, PyObject *obj) {
    const converter *conv = &converters[decl->kind];
    int rc = conv->convert(obj, decl->out);
    const char *name = decl->name + strspn(decl->name, "|$");
    if (rc == FL_ARG_WRONG_TYPE)
        fl_raisef(NULL, FL_EXC_TYPE, "%s() argument '%s' must be %s, not %.100s", c->function, name,
                     conv->expected, Py_TYPE(obj)->tp_name);
    else if (rc == FL_ARG_OUT_OF_RANGE)
        fl_raisef(NULL, FL_EXC_OVERFLOW, "%s() argument '%s' is out of range: %R", c->function,
                  name, obj);
    return rc == 0 ? 0 : -1;
}

/* ---- the declaration, read once per call site ---- */

/* Reads the declaration into *cache; -1 with an exception set. */
static int fill_cache(fl_arg_cache *cache, const fl_arg *decl, int count) {
    int required = -1, positional = -1;
    if (count > FL_ARGS_MAX) {
        fl_raisef(NULL, FL_EXC_SYSTEM, "%s(): more than %d arguments declared", cache->function,
                  FL_ARGS_MAX);
        return -1;
    }
    for (int i = 0; i < count; i++) {
        const char *name = decl[i].name;
        for (; *name == '|' || *name == '$'; name++) {
            if (*name == '|' && required < 0)
                required = i;
            if (*name == '$' && positional < 0)
                positional = i;
        }
        cache->names[i] = name;
        cache->interned[i] = PyUnicode_InternFromString(name);
        if (cache->interned[i] == NULL)
            return -1; /* the ones before stay interned: the cache is filled again next call */
    }
    cache->count = count;
    cache->positional = positional < 0 ? count : positional;
    cache->required = required < 0 ? count : required;
    return 0;
}

/* The cache ready to read: filled by the first caller; a thread racing it fills its own. */
static const fl_arg_cache *ready_cache(fl_arg_cache *cache, fl_arg_cache *local, const fl_arg *decl,
                                       int count) {
    if (atomic_load_explicit(&cache->state, memory_order_acquire) == 2)
        return cache;
    int empty = 0;
    if (!atomic_compare_exchange_strong(&cache->state, &empty, 1)) { /* its names stay interned */
        local->function = cache->function;
        return fill_cache(local, decl, count) < 0 ? NULL : local;
    }
    if (fill_cache(cache, decl, count) < 0) {
        atomic_store(&cache->state, 0);
        return NULL;
    }
    atomic_store_explicit(&cache->state, 2, memory_order_release); /* publishes the fields */
    return cache;
}

/* ---- the parser ---- */
/* The declared index of keyword `key`, or -1 with TypeError set. */
static int keyword_index(const fl_arg_cache *c, PyObject *key) {
    for (int i = 0; i < c->count; i++) /* interned names from Python code: one compare */
        if (c->interned[i] == key)
            return i;
    for (int i = 0; i < c->count; i++)
        if (PyUnicode_CompareWithASCIIString(key, c->names[i]) == 0)
            return i;
    fl_raisef(NULL, FL_EXC_TYPE, "%s() got an unexpected keyword argument '%U'", c->function, key);
    return -1;
}

/* Places the keyword arguments into given[] beside the positional ones; -1 with TypeError. */
static int place_keywords(const fl_arg_cache *c, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames, PyObject **given) {
    for (int i = 0; i < c->count; i++)
        given[i] = i < nargs ? args[i] : NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
        int i = keyword_index(c, PyTuple_GET_ITEM(kwnames, k));
        if (i < 0)
            return -1;
        if (given[i] != NULL) {
            fl_raisef(NULL, FL_EXC_TYPE, "%s() got multiple values for argument '%s'", c->function,
                         c->names[i]);
            return -1;
        }
        given[i] = args[nargs + k];
    }
    for (int i = 0; i < c->required; i++)
        if (given[i] == NULL) {
            fl_raisef(NULL, FL_EXC_TYPE, "%s() missing required argument '%s' (pos %d)",
                      c->function, c->names[i], i + 1);
            return -1;
        }
    return 0;
}

static int check_positional(const fl_arg_cache *c, Py_ssize_t nargs, int keywords) {
    if (nargs > c->positional) {
        fl_raisef(NULL, FL_EXC_TYPE, "%s() takes at most %d positional arguments (%zd given)",
                     c->function, c->positional, nargs);
        return -1;
    }
    if (!keywords && nargs < c->required) {
        fl_raisef(NULL, FL_EXC_TYPE, "%s() missing required argument '%s' (pos %zd)", c->function,
                     c->names[nargs], nargs + 1);
        return -1;
    }
    return 0;
}

int fl_parse_args_slow(fl_arg_cache *cache, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames, const fl_arg *decl, int count) {
    fl_arg_cache local;
    const fl_arg_cache *c = ready_cache(cache, &local, decl, count);
    if (c == NULL)
        return -1;
    int keywords = kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0;
    PyObject *given[FL_ARGS_MAX];
    if (check_positional(c, nargs, keywords) < 0 ||
        (keywords && place_keywords(c, args, nargs, kwnames, given) < 0))
        return -1;
    for (int i = 0; i < count; i++) {
        PyObject *obj = keywords ? given[i] : (i < nargs ? args[i] : NULL);
        if (obj != NULL && convert(c, &decl[i], obj) < 0)
            return -1;
    }
    return 0;
}

int fl_parse_args_dict_list(fl_arg_cache *cache, PyObject *args_tuple, PyObject *kwargs,
                            const fl_arg *decl, int count) {
    Py_ssize_t nargs = PyTuple_GET_SIZE(args_tuple), nkw = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    if (nkw == 0)
        return fl_parse_args_slow(cache, &PyTuple_GET_ITEM(args_tuple, 0), nargs, NULL, decl,
                                  count);
    PyObject **stack = PyMem_Malloc((size_t)(nargs + nkw) * sizeof *stack);
    PyObject *kwnames = PyTuple_New(nkw);
    int rc = -1;
    if (stack == NULL)
        fl_raisef(NULL, FL_EXC_MEMORY, "%s(): no memory for its arguments", cache->function);
    if (stack == NULL || kwnames == NULL)
        goto done;
    memcpy(stack, &PyTuple_GET_ITEM(args_tuple, 0), (size_t)nargs * sizeof *stack);
    PyObject *key, *value;
    Py_ssize_t pos = 0, k = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) { /* the call's own dict: no thread shares it */
        PyTuple_SET_ITEM(kwnames, k, Py_NewRef(key));
        stack[nargs + k++] = value; /* borrowed: the dict outlives the constructor's parse */
    }
    rc = fl_parse_args_slow(cache, stack, nargs, kwnames, decl, count);
done:
    PyMem_Free(stack);
    Py_XDECREF(kwnames);
    return rc;
}
